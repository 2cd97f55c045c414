#!/usr/bin/env bash
# Issue 14 on the lent GPU machine (repo root there), after the vLLM 0.26.0 wheels were copied to
# /tmp/wh (shared/gpu/README.md; docs/gpu-runs/device-install-vllm.sh is its copy of the installer).
# The model is given by path with NO size flags (no --block-size, --max-num-batched-tokens,
# --max-num-seqs, --dtype): every fact must come from the engine itself.
#   1. ple-harness facts --model PATH   (launches the engine, prints the facts and their sources, stops it)
#   2. ple-harness stress --model PATH  (the default suite plus capture_edges and kv_pressure)
# Writes to $OUT/NAME/: facts.json, facts.console.txt, the run's manifest.json, summary.md,
# junit.xml, and the engine log lines about config, CUDA graphs and KV cache.
#   bash docs/gpu-runs/facts-run.sh NAME [MODEL_PATH] [extra ple-harness stress args...]
# PART=facts or PART=stress runs only that half (two device calls when one would pass 600 s).
set -u
part=${PART:-both}
name=${1:-gpu-facts}
model=${2:-$PWD/pleharness/model/tiny_llama}   # the embedded model (package data, travels with the tree)
shift $(( $# < 2 ? $# : 2 ))
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  PLE_HARNESS_CACHE=$PWD/.gpucache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import vllm" 2>/dev/null; then
  bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
fi
[ -d "$model" ] || { echo "model folder not found: '$model'"; exit 2; }
mkdir -p "$OUT/$name"
nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv,noheader
highlights() {  # engine log -> the lines that name the resolved configuration
  grep -E "with config|max_num_batched_tokens|KV cache size|cudagraph|CUDA graph|Capturing|Model Runner|attention backend|block_size|development|DEV_MODE" \
    "$1" | cut -c1-6000 | head -60
}

frc=0; rc=0
if [ "$part" != stress ]; then
python3 -m pleharness facts --model "$model" --results-dir /tmp/runs/$name-facts \
  --json "$OUT/$name/facts.json" 2>&1 | tee "$OUT/$name/facts.console.txt"
frc=${PIPESTATUS[0]}
for log in /tmp/runs/$name-facts/facts-*/engine.log; do
  [ -f "$log" ] && highlights "$log" > "$OUT/$name/facts-engine-highlights.log"
done
fi
[ "$part" = facts ] && { echo "facts exit $frc"; exit $frc; }

python3 -m pleharness stress --model "$model" --results-dir /tmp/runs --run-id "$name" \
  --scenario transitions --scenario boundary --scenario pairs --scenario insert \
  --scenario capture_edges --scenario kv_pressure "$@" 2>&1 | tee "$OUT/$name/stress.console.txt"
rc=${PIPESTATUS[0]}
d=/tmp/runs/$name
cp "$d/manifest.json" "$d/requests.jsonl" "$d/summary.md" "$d/junit.xml" "$OUT/$name/" 2>/dev/null  # at most 8 files come back
[ -f "$d/engine.log" ] && highlights "$d/engine.log" > "$OUT/$name/engine-highlights.log"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
echo "facts exit $frc, stress exit $rc"
exit $(( frc != 0 ? frc : rc ))
