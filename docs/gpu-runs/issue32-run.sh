#!/usr/bin/env bash
# Issue 32 on the lent H200 (repo root there, after the vLLM 0.26.0 wheels were copied to /tmp/wh,
# shared/gpu/README.md). Two random-weight bf16 models, a dense Llama (make-random-model.py) and a
# mixture-of-experts Mixtral (make-moe-model.py), each served by a real vLLM 0.26.0 with ngram
# speculative decoding k = 2 and FULL_AND_PIECEWISE CUDA graphs (profiles/gpu-h200-ngram-k2.toml):
#   <model>-clean    the default suite, a PIECEWISE control: must pass (its warnings listed)
#   <model>-planted  the same engine behind tests/fault_engine.py: output position 5 becomes
#                    token + 1 while >= 2 requests are in flight, only while the launch has the
#                    FULL_AND_PIECEWISE compilation config (the PIECEWISE control is clean): must fail
# All four jobs run side by side on the one GPU (each engine with a fixed KV cache size).
#   PART=start bash docs/gpu-runs/issue32-run.sh    # install, build the models, start the jobs
#                                                   # (MODELS="dense" for one model only)
#   PART=wait  bash docs/gpu-runs/issue32-run.sh    # wait (<= 540 s), then copy what is done to $OUT
set -u
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 \
  VLLM_CACHE_ROOT=/tmp/vllm-cache
R=/tmp/runs; mkdir -p $R
PROFILE=profiles/gpu-h200-ngram-k2.toml
CONTROL='--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}'
if [ "${PART:-start}" = start ]; then
  if ! python3 -c "import vllm" 2>/dev/null; then
    bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  fi
  python3 -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
  rm -rf /tmp/code; cp -r "$PWD" /tmp/code  # the tree is laid anew by each call: run from a copy
  cd /tmp/code
  [ -d /tmp/dense ] || python3 docs/gpu-runs/make-random-model.py /tmp/dense
  [ -d /tmp/moe ] || python3 docs/gpu-runs/make-moe-model.py /tmp/moe
  { echo "MODELS='${MODELS:-dense moe}'"; cat; } > /tmp/jobs.sh <<'JOBS'
cd /tmp/code
export PYTHONPATH=/tmp/site:/tmp/code
R=/tmp/runs; PROFILE=profiles/gpu-h200-ngram-k2.toml
CONTROL='--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}'
ARGS=(--dtype bfloat16 --max-num-seqs 8 --max-num-batched-tokens 256 --speculative-config
  '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
  --compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}' --kv-cache-memory-bytes 2147483648
  --gpu-memory-utilization 0.3)
clean() {  # $1 model name
  t0=$(date +%s)
  python3 -m pleharness stress --engine-profile $PROFILE --model /tmp/$1 "$CONTROL" --confirm-runs 0 \
    --results-dir $R --run-id $1-clean > $R/$1-clean.console.txt 2>&1
  echo "$1-clean exit $? after $(( $(date +%s) - t0 )) s" >> $R/done.txt
}
planted() {  # $1 model name, $2 upstream port
  t0=$(date +%s)
  VLLM_SERVER_DEV_MODE=1 python3 -m vllm.entrypoints.openai.api_server --model /tmp/$1 "${ARGS[@]}" \
    --port $2 --host 127.0.0.1 > $R/$1-upstream.log 2>&1 &
  up=$!
  for i in $(seq 300); do curl -sf localhost:$2/health >/dev/null && break; sleep 2; done
  PLE_REAL_PYTHON=$(command -v python3) PLE_FAULT_UPSTREAM=http://127.0.0.1:$2 PLE_FAULT_MODE=crowded \
  PLE_FAULT_WHEN='--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"}' \
    python3 -m pleharness stress --engine-python $PWD/tests/fakepy/python --engine-profile $PROFILE \
    --model /tmp/$1 "$CONTROL" --confirm-runs 0 --results-dir $R --run-id $1-planted \
    > $R/$1-planted.console.txt 2>&1
  echo "$1-planted exit $? after $(( $(date +%s) - t0 )) s" >> $R/done.txt
  kill $up; wait $up 2>/dev/null
}
port=8100
for m in ${MODELS:-dense moe}; do clean $m & planted $m $port & port=$((port + 1)); done
wait
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> $R/done.txt
echo ALL DONE >> $R/done.txt
JOBS
  setsid nohup bash /tmp/jobs.sh > /tmp/jobs.log 2>&1 < /dev/null &
  sleep 5; echo started; nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
  exit 0
fi
# PART=wait
for i in $(seq ${WAIT_S:-540}); do grep -q "ALL DONE" $R/done.txt 2>/dev/null && break; sleep 1; done
cat $R/done.txt 2>/dev/null; tail -3 /tmp/jobs.log
for n in dense-clean moe-clean dense-planted moe-planted; do
  mkdir -p "$OUT/$n"
  cp $R/$n.console.txt "$OUT/$n/" 2>/dev/null
  for f in manifest.json summary.md junit.xml control-manifest.json; do cp "$R/$n/$f" "$OUT/$n/" 2>/dev/null; done
  [ -f $R/$n/engine.log ] && grep -E "cudagraph_mode|Capturing|Model Runner|kv_cache_memory_bytes|skipped memory profiling|Error|MoE|fused_moe" $R/$n/engine.log | head -40 > "$OUT/$n/engine-highlights.log"
  [ -f $R/$n/control-engine.log ] && grep -E "cudagraph_mode|Error|skipped memory profiling" $R/$n/control-engine.log | head -20 > "$OUT/$n/control-highlights.log"
done
for m in dense moe; do [ -f $R/$m-upstream.log ] && grep -E "skipped memory profiling|Error|cudagraph_mode" $R/$m-upstream.log | head -20 > "$OUT/$m-upstream-highlights.log"; done
ls $R
