#!/usr/bin/env bash
# Issues 23 and 24 on the lent H200 (repo root there, after the vLLM 0.26.0 wheels were copied to
# /tmp/wh, shared/gpu/README.md). A random-weight bf16 copy of the embedded model
# (make-random-model.py) served by a real vLLM 0.26.0 with default CUDA graphs:
#   k  clean engine, --reference golden (transitions + boundary): must pass; the half-precision
#      golden tolerance it measured is in run_options.golden_tolerance
#   l  the same engine behind tests/fault_engine.py planting a hard corruption (position 5 of
#      every run of a prompt after its first two becomes token + 1): must fail
#   m  a two-flag fault (only with --speculative-config AND --max-num-batched-tokens=256 in the
#      launch arguments) behind the double, then `explain`: the interaction and the narrowest
#      change; and the same run explained with the fault off (nothing attributed)
set -u
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import vllm" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/wh/orjson-*.whl 2>/dev/null
  bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
fi
[ -d /tmp/randmodel ] || python3 docs/gpu-runs/make-random-model.py /tmp/randmodel
R=/tmp/runs; mkdir -p $R
keep() { mkdir -p "$OUT/$1"; for f in manifest.json summary.md junit.xml; do cp "$R/$1/$f" "$OUT/$1/" 2>/dev/null; done; }
#   bash docs/gpu-runs/issue23-24-run.sh k|l|m   (one call each, on the same warm machine)
if [ "$1" = k ]; then
# k: clean, golden reference
python3 -m pleharness stress --engine-profile profiles/gpu-h200-default.toml --model /tmp/randmodel \
  --reference golden --scenario transitions --scenario boundary --confirm-runs 0 \
  --results-dir $R --run-id gpu-k-golden-clean > "$OUT/k.console.txt" 2>&1; echo "k exit $?"
keep gpu-k-golden-clean
exit 0
fi
# upstream engine for the double: the model and flags of the profile the double is launched
# with (l: gpu-h200-default, m: gpu-h200-ngram), so the engine's own facts match its arguments
extra=()
[ "$1" = m ] && extra=(--max-num-batched-tokens 256 --speculative-config \
  '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}')
VLLM_SERVER_DEV_MODE=1 python3 -m vllm.entrypoints.openai.api_server --model /tmp/randmodel \
  --dtype bfloat16 --max-num-seqs 8 --port 8100 --host 127.0.0.1 "${extra[@]}" > /tmp/upstream.log 2>&1 &
up=$!
for i in $(seq 120); do curl -sf localhost:8100/health >/dev/null && break; sleep 2; done
export PLE_REAL_PYTHON=$(command -v python3) PLE_FAULT_UPSTREAM=http://127.0.0.1:8100
FAKE=$PWD/tests/fakepy/python
if [ "$1" = l ]; then
# l: planted hard corruption behind the double, golden reference
PLE_FAULT_WHEN=always PLE_FAULT_MODE=load python3 -m pleharness stress --engine-python $FAKE \
  --engine-profile profiles/gpu-h200-default.toml --model /tmp/randmodel --reference golden \
  --scenario transitions --confirm-runs 0 --results-dir $R --run-id gpu-l-golden-planted \
  > "$OUT/l.console.txt" 2>&1; echo "l exit $?"
keep gpu-l-golden-planted
fi
if [ "$1" = m ]; then
# m: two-flag fault, stress then explain
python3 - <<'PY'
import re, pathlib
s = pathlib.Path("tests/test_attribution.py").read_text()
pathlib.Path("/tmp/lengths.toml").write_text(re.search(r'LENGTH_SCENARIO = """(.*?)"""', s, re.S).group(1))
PY
export PLE_FAULT_WHEN=--speculative-config,--max-num-batched-tokens=256 PLE_FAULT_MODE=load
python3 -m pleharness stress --engine-python $FAKE --engine-profile profiles/gpu-h200-ngram.toml \
  --model /tmp/randmodel --scenario /tmp/lengths.toml --confirm-runs 0 --results-dir $R \
  --run-id gpu-m-two-flags > "$OUT/m.console.txt" 2>&1; echo "m exit $?"
keep gpu-m-two-flags
python3 -m pleharness explain $R/gpu-m-two-flags --tries 1 --confirm-runs 2 --budget-s 300 \
  > "$OUT/m.explain.txt" 2>&1; echo "explain exit $?"
mkdir -p "$OUT/gpu-m-explain"; cp $R/gpu-m-two-flags/explain/explain.json $R/gpu-m-two-flags/explain/explain.md "$OUT/gpu-m-explain/" 2>/dev/null
PLE_FAULT_WHEN=never python3 -m pleharness explain $R/gpu-m-two-flags --tries 1 --confirm-runs 0 \
  --budget-s 60 > "$OUT/m.explain-clean.txt" 2>&1; echo "explain clean exit $?"
fi
kill $up; wait $up 2>/dev/null
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
