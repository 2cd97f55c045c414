#!/usr/bin/env bash
# Run the whole test suite (sets up first; nothing is skipped on CI). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
