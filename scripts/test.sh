#!/usr/bin/env bash
# Run the test suite (sets up first). Default: every test but the `nightly` ones (long
# end-to-end runs whose path the default suite also covers more cheaply, packaging and CI-workflow
# checks, benchmarks), in two passes that run at the same time: the engine tests one at a time
# (they share one engine per configuration) and, beside them, the tests that need no engine,
# three at a time (pytest-xdist; many wait on a subprocess or a timeout). The engine pass shows
# its progress; the other pass's report is printed when both are done. Beside each other they
# took 1202 s against 316 s + 1040 s one after the other on 2 cores (issue 49): the engine
# pass leaves a core idle while an engine starts, a golden worker loads or the harness waits.
# (Tried and dropped: two engine workers, each starting its own engines: 872-974 s against
# 988 s; pytest-xdist's --dist loadgroup does not group marked tests under pytest 9.)
# `--nightly`: only the nightly tests; `--all`: everything, one at a time. The GPU tests skip
# themselves on a machine without a GPU. Further arguments go to pytest (to both passes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines and CI), every harness
# subprocess the tests start would compile the package from source again and pytest would
# rewrite every test module's asserts in each worker: the tests keep their bytecode (under
# __pycache__/, git-ignored). The no-engine pass: 297 s against 249 s (issue 49).
unset PYTHONDONTWRITEBYTECODE
case "${1:-}" in
  --nightly) shift; exec .venv/bin/python -m pytest -m nightly "$@" ;;
  --all) shift; exec .venv/bin/python -m pytest "$@" ;;
esac
rc=0  # the first failing pass's code; 5 (no test selected in a pass, e.g. by -k) is not one
log=$(mktemp "${TMPDIR:-/tmp}/ple-harness-tests.XXXXXX")
set -m  # the pass beside in a process group of its own, so that it can be stopped as a whole
.venv/bin/python -m pytest -m "not engine and not nightly" -n 3 --durations=10 "$@" >"$log" 2>&1 &
side=$!
set +m
# however this script ends, the pass beside (its workers and what they started) stops with it
trap 'kill -TERM -- "-$side" 2>/dev/null || true; rm -f "$log"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "the tests that need no engine run beside the engine tests; their report follows at the end"
.venv/bin/python -m pytest -m "engine and not nightly" --durations=25 "$@" || { c=$?; [ "$c" = 5 ] || rc=$c; }
c=0; wait "$side" || c=$?
echo; echo "== the tests that need no engine (run beside the engine tests) =="
cat "$log"
[ "$c" = 0 ] || [ "$c" = 5 ] || [ "$rc" != 0 ] || rc=$c
exit "$rc"
