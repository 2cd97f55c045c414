#!/usr/bin/env bash
# Issue 19 item 2 on the lent H200 (repo root there), after the vLLM 0.26.0 wheels were copied to
# /tmp/wh (shared/gpu/README.md): installs vLLM, starts ONE engine serving the embedded model (bf16,
# CUDA graphs, max_num_seqs 128), and runs benchmarks/vs_vllm_bench.py against it (--url) in three
# groups, so that each C runs enough requests to keep C in flight for most of the run:
#   C=1 with 32 prompts, C=4,8 with 64 prompts, C=32,64,128 with 512 prompts; 64 token IDs in,
#   64 tokens out (ignore_eos, greedy), PAIRS alternating pairs each after a warm-up of each client.
#   bash docs/gpu-runs/bench-run.sh NAME [PAIRS] [GROUPS]   (GROUPS: any of c1,c4-8,c32-128)
# The engine keeps running between calls when KEEP_ENGINE=1 (a later call reuses it).
set -u
name=$1; pairs=${2:-5}; groups=${3:-c1,c4-8,c32-128}
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import vllm" 2>/dev/null; then
  t0=$(date +%s)
  bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  echo "installed in $(( $(date +%s) - t0 )) s"
fi
o=$OUT/$name; mkdir -p "$o"
nproc; grep -m1 "model name" /proc/cpuinfo; uptime
nvidia-smi --query-gpu=index,name,memory.used,driver_version --format=csv,noheader
model=$PWD/pleharness/model/tiny_llama
port=8765
if ! curl -sf localhost:$port/health >/dev/null; then
  setsid python3 -m vllm.entrypoints.openai.api_server --model "$model" --dtype bfloat16 \
    --host 127.0.0.1 --port $port --max-num-seqs 128 --block-size 32 > /tmp/engine.log 2>&1 &
  echo $! > /tmp/engine.pid
  t0=$(date +%s)
  until curl -sf localhost:$port/health >/dev/null; do
    sleep 2
    if ! kill -0 "$(cat /tmp/engine.pid)" 2>/dev/null; then tail -40 /tmp/engine.log; exit 3; fi
  done
  echo "engine ready in $(( $(date +%s) - t0 )) s"
fi
grep -E "cudagraph|capture|Model Runner|backend" /tmp/engine.log | head -20 > "$o/engine-highlights.log"
python3 -c "import pleharness.engine.client as c; print('client module', c.__file__)"
run() {  # $1 tag, then vs_vllm_bench args
  tag=$1; shift
  timeout 280 python3 benchmarks/vs_vllm_bench.py --url http://127.0.0.1:$port --pairs "$pairs" \
    --json "$o/$tag.json" "$@" 2>&1 | tee "$o/$tag.txt" | grep -E "median|summary|rror|Trace"
}
case ",$groups," in *,c1,*) run c1 --concurrency 1 --num-prompts 32;; esac
case ",$groups," in *,c4-8,*) run c4-8 --concurrency 4,8 --num-prompts 64;; esac
case ",$groups," in *,c32-128,*) run c32-128 --concurrency 32,64,128 --num-prompts 512;; esac
tail -5 /tmp/engine.log > "$o/engine-tail.log"
uptime
if [ "${KEEP_ENGINE:-0}" != 1 ]; then
  kill -TERM -- -"$(cat /tmp/engine.pid)" 2>/dev/null; sleep 5; kill -KILL -- -"$(cat /tmp/engine.pid)" 2>/dev/null
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
fi
echo done
