#!/usr/bin/env bash
# Issue 37 on the lent H200 (after issue33-run.sh installed vLLM 0.26.0 into /tmp/site and copied the
# code to /tmp/code): SIGKILL of `ple-harness stress` while its GPU engine starts and again while it
# serves; 10 s later, is any process of the engine's group alive, and how much GPU memory is in use?
# Writes $OUT/kill9.txt.
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd /tmp/code
K=/tmp/kill-runs; mkdir -p $K "$OUT"
report() { echo "$*" | tee -a "$OUT/kill9.txt"; }
for when in starting serving; do
  rm -rf $K/$when
  VLLM_CACHE_ROOT=/tmp/ttd-compile-cache setsid python3 -m pleharness stress --model /tmp/dense \
    --engine-profile profiles/gpu-h200-ngram-k2.toml --scenario transitions --repeats 20 \
    --results-dir $K --run-id $when > $K/$when.console.txt 2>&1 < /dev/null &
  H=$!
  pid=""
  for i in $(seq 600); do
    pid=$(grep -m1 '^pid ' $K/$when/launcher.log 2>/dev/null | awk '{print $2}' | tr -d ';')
    [ -n "$pid" ] && break; kill -0 $H 2>/dev/null || break; sleep 0.5
  done
  if [ "$when" = serving ]; then  # until a load phase has run: the engine is up and serving
    for i in $(seq 300); do python3 -c "import json,sys; m=json.load(open('$K/$when/manifest.json'))
sys.exit(0 if any(p['role']=='load' for p in m.get('phases') or []) else 1)" 2>/dev/null && break
      kill -0 $H 2>/dev/null || break; sleep 1; done
  else
    sleep 5
  fi
  report "== $when: harness $H, engine pid $pid; gpu before kill: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  kill -9 $H; t0=$(date +%s.%N)
  for i in $(seq 100); do kill -0 -- -$pid 2>/dev/null || break; sleep 0.1; done
  report "engine group alive after $(python3 -c "import time;print(round(time.time()-$t0,1))") s: $(kill -0 -- -$pid 2>/dev/null && echo yes || echo no)"
  sleep 10
  report "10 s later: group alive: $(kill -0 -- -$pid 2>/dev/null && echo yes || echo no);" \
    "vllm processes: $(pgrep -fc vllm.entrypoints); gpu: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  tail -3 $K/$when.console.txt | sed 's/^/  console: /' >> "$OUT/kill9.txt"
  pkill -9 -f vllm.entrypoints 2>/dev/null
done
