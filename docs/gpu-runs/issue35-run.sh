#!/usr/bin/env bash
# Issue 35 on the lent H200 (repo root there, after the vLLM 0.26.0 wheels were copied to /tmp/wh,
# shared/gpu/README.md): the premerge suite (the request-feature kinds of issue 35 among them:
# chat, stop strings, mixed parameters, prompt logprobs, several choices, and logprob parity on
# every greedy request with logprobs) on the random-weight bf16 dense model
# (make-random-model.py) with profiles/gpu-h200-ngram-k2.toml, one cold engine start. The run
# folder is copied to $OUT every 10 s, so a run stopped by the device's time limit still comes back.
#   LIMIT_S=360 bash docs/gpu-runs/issue35-run.sh [stress args]
# SCENARIOS="--scenario A --scenario B" runs those instead of the suite.
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
if ! python3 -c "import vllm" 2>/dev/null; then
  bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
fi
rm -rf /tmp/code; cp -r "$PWD" /tmp/code; cd /tmp/code
[ -d /tmp/dense ] || python3 docs/gpu-runs/make-random-model.py /tmp/dense
echo "set-up $(( $(date +%s) - t0 )) s"; nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
R=/tmp/runs; name=${NAME:-premerge-ngram-k2}; d=$R/$name
copy() {
  mkdir -p "$OUT/$name"
  cp "$d/manifest.json" "$d/summary.md" "$d/requests.jsonl" "$d/launcher.log" "$OUT/$name/" 2>/dev/null
  tail -40 "$d/engine.log" > "$OUT/$name/engine-tail.log" 2>/dev/null
  grep -E "cudagraph|CUDA graph|Capturing|model runner|Model Runner|backend" "$d/engine.log" 2>/dev/null \
    | head -40 > "$OUT/$name/engine-highlights.log"
}
( while sleep 10; do copy; done ) & copier=$!
left=$(( ${LIMIT_S:-360} - ($(date +%s) - t0) ))
timeout -s INT "$left" python3 -m pleharness stress --engine-profile profiles/gpu-h200-ngram-k2.toml \
  --model /tmp/dense ${SCENARIOS:---suite ${SUITE:-premerge}} --results-dir $R --run-id "$name" "$@" \
  2>&1 | tee "$OUT/$name.console.txt"
rc=${PIPESTATUS[0]}
kill $copier 2>/dev/null; copy
nvidia-smi --query-gpu=memory.used --format=csv,noheader
echo "exit $rc after $(( $(date +%s) - t0 )) s"
