#!/usr/bin/env bash
# Run the test suite (sets up first). Default: every test but the `nightly` ones (long
# end-to-end runs whose path the default suite also covers more cheaply, packaging and CI-workflow
# checks, benchmarks), in two passes: the tests that need no engine, three at a time
# (pytest-xdist; many wait on a subprocess or a timeout: 263 s against 323 s two at a time on 2
# cores, issue 49), then the engine tests one at a time (they share one engine per configuration;
# two at a time, each worker's engines pinned to a core of their own, took 872-974 s against
# 988 s: each worker starts its own engines and the engines' serving already keeps both cores
# busy). The tests' `ple-harness` calls are forked from a server that imported the CLI once
# (tests/cli_process.py; PLE_TEST_CLI_SPAWN=1: fresh interpreters). `--nightly`: only the
# nightly tests;
# `--all`: everything, one at a time. The GPU tests skip themselves on a machine without a GPU.
# Further arguments go to pytest (to both passes).
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
.venv/bin/python -m pytest -m "not engine and not nightly" -n 3 --durations=10 "$@" || { c=$?; [ "$c" = 5 ] || rc=$c; }
.venv/bin/python -m pytest -m "engine and not nightly" --durations=25 "$@" || { c=$?; [ "$c" = 5 ] || [ "$rc" != 0 ] || rc=$c; }
exit "$rc"
