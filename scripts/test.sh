#!/usr/bin/env bash
# Run the test suite (sets up first). Default: every test but the `nightly` ones (long
# end-to-end runs whose path the default suite also covers more cheaply, packaging and CI-workflow
# checks, benchmarks); `--nightly`: only those; `--all`: everything. The GPU tests skip
# themselves on a machine without a GPU. Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
case "${1:-}" in
  --nightly) shift; set -- -m nightly "$@" ;;
  --all) shift ;;
  *) set -- -m "not nightly" "$@" ;;
esac
exec .venv/bin/python -m pytest "$@"
