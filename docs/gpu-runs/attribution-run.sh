#!/usr/bin/env bash
# Issue 15 on the lent H200 (repo root there, after the vLLM 0.26.0 wheels were copied to /tmp/wh,
# shared/gpu/README.md): a random-weight bf16 copy of the embedded model with ngram speculative
# decoding, default CUDA graphs under test vs PIECEWISE as the control, then `explain` on the run.
#   bash docs/gpu-runs/attribution-run.sh control     # install, random model, stress + control run
#   bash docs/gpu-runs/attribution-run.sh explain     # explain the run (budget-capped)
set -u
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
run=gpu-g-random-ngram-control
if ! python3 -c "import vllm" 2>/dev/null; then
  bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
fi
[ -d /tmp/randmodel ] || python3 docs/gpu-runs/make-random-model.py /tmp/randmodel
mkdir -p "$OUT/$run"
if [ "$1" = control ]; then
  python3 -m pleharness stress --engine-profile profiles/gpu-h200-ngram.toml --model /tmp/randmodel \
    --scenario transitions --results-dir /tmp/runs --run-id $run \
    '--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}' 2>&1 \
    | tee "$OUT/$run/console.txt"
  rc=${PIPESTATUS[0]}
  d=/tmp/runs/$run
  cp "$d/manifest.json" "$d/requests.jsonl" "$d/control-manifest.json" "$d/control-requests.jsonl" "$d/summary.md" "$d/junit.xml" "$OUT/$run/" 2>/dev/null
  grep -E "cudagraph_mode|Capturing|capture|Model Runner|model runner" "$d/engine.log" | head -20 > "$OUT/$run/engine-highlights.log"
  grep -E "cudagraph_mode|Capturing|capture|Model Runner|model runner" "$d/control-engine.log" | head -20 > "$OUT/$run/control-engine-highlights.log"
else
  python3 -m pleharness explain /tmp/runs/$run ${EXTRA:-} --no-auto-suspects --budget-s "${BUDGET:-330}" \
    --tries 3 '--suspect=--compilation-config={"cudagraph_mode": "PIECEWISE"}' \
    --suspect-drop=--speculative-config --suspect=--enforce-eager 2>&1 | tee "$OUT/$run/explain-console.txt"
  rc=${PIPESTATUS[0]}
  mkdir -p "$OUT/$run/explain"
  cp /tmp/runs/$run/explain/explain.json /tmp/runs/$run/explain/explain.md \
     /tmp/runs/$run/explain/junit.xml "$OUT/$run/explain/" 2>/dev/null
  ls /tmp/runs/$run/explain/repro-*.toml | head -3 | xargs -r -I{} cp {} "$OUT/$run/explain/"
fi
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
echo "exit $rc"
exit $rc
