#!/usr/bin/env bash
# Runs one configuration of the default suite on the lent GPU machine (repo root there), after the
# vLLM 0.26.0 wheels were copied to /tmp/wh (shared/gpu/README.md). Writes what comes back to $OUT.
#   bash docs/gpu-runs/device-run.sh NAME PROFILE [extra ple-harness stress args...]
set -u
name=$1; profile=$2; shift 2
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  PLE_HARNESS_CACHE=$PWD/.gpucache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import vllm" 2>/dev/null; then
  bash .gpucache/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
fi
nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv,noheader
python3 -m pleharness stress --engine-profile "$profile" --results-dir /tmp/runs --run-id "$name" \
  "$@" 2>&1 | tee "$OUT/$name.console.txt"
rc=${PIPESTATUS[0]}
d=/tmp/runs/$name
mkdir -p "$OUT/$name"
cp "$d/manifest.json" "$d/requests.jsonl" "$d/summary.md" "$d/junit.xml" "$d/launcher.log" "$OUT/$name/" 2>/dev/null
grep -E "cudagraph|CUDA graph|Capturing|capture|model runner|Model Runner|attention backend|Using .* backend" \
  "$d/engine.log" | head -60 > "$OUT/$name/engine-highlights.log"
tail -50 "$d/engine.log" > "$OUT/$name/engine-tail.log"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
echo "exit $rc"
exit $rc
