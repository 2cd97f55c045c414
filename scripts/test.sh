#!/usr/bin/env bash
# Run the whole test suite (sets up first; no marker is deselected: only the GPU tests skip
# themselves on a machine without a GPU). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
