#!/usr/bin/env bash
# Session 12 (2026-12-05) on the lent GPU, one machine, in the repo root there:
#   1. issue 35: the premerge suite (chat, stop strings, mixed parameters, prompt logprobs and
#      echo, several choices, constrained output, logprob parity, ...) on the trained embedded
#      model and on the random-weight bf16 copy (make-random-model.py), two engines side by side,
#      profiles/gpu-h200-ngram-k2.toml (ngram k = 2, FULL_AND_PIECEWISE graphs, fixed KV cache);
#   2. then issue 33: benchmarks/time_to_diagnosis.py (stress, fuzz-3, explain-4, an emptied
#      compile cache) after the fixes that run o called for, alone on the machine.
# The wheels: one call per folder .gpuwheels/partN (`mkdir -p /tmp/wh && cp .gpuwheels/partN/* /tmp/wh/`,
# carry .gpuwheels/partN; with the run folders docs/gpu-runs/2026-* moved aside, the tree and a
# 53 MB part fit the 64 MiB a call carries), or the tar pieces .gpuwheels/t/pNN appended to /tmp/wt.tar.
#   PART=start bash docs/gpu-runs/issue33-35-run.sh          # install, models, start the jobs
#   PART=wait WAIT_S=500 bash docs/gpu-runs/issue33-35-run.sh  # wait; $OUT/runs.tgz
# UNTIL=premerge-done stops the wait after step 1. TOGETHER=1 starts step 2 beside step 1.
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/runs
PROFILE=profiles/gpu-h200-ngram-k2.toml

premerge() {  # NAME [stress args]
  local name=$1; shift
  timeout -s INT "${PREMERGE_S:-480}" python3 -m pleharness stress --engine-profile $PROFILE \
    --suite premerge --results-dir $R --run-id "$name" "$@" > "$R/$name.console.txt" 2>&1
  echo "$name exit $? at $(date -u +%T)" >> $R/done.txt
}

case "${PART:-start}" in
start)
  t0=$(date +%s)
  if ! python3 -c "import vllm" 2>/dev/null; then
    if [ -f /tmp/wt.tar ]; then
      mkdir -p /tmp/wtar /tmp/wh && tar -x -C /tmp/wtar -f /tmp/wt.tar && cp /tmp/wtar/part*/* /tmp/wh/ \
        && rm -rf /tmp/wtar /tmp/wt.tar || { echo "wheels incomplete"; ls -la /tmp/wt.tar; exit 1; }
    fi
    bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  fi
  python3 -c "import vllm; print('vllm', vllm.__version__)"
  rm -rf /tmp/code; cp -r "$PWD" /tmp/code; cd /tmp/code
  [ -d /tmp/dense ] || python3 docs/gpu-runs/make-random-model.py /tmp/dense
  mkdir -p $R; echo "set-up $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
  PART=jobs setsid nohup bash docs/gpu-runs/issue33-35-run.sh > $R/jobs.log 2>&1 < /dev/null &
  sleep 3; echo started ;;
jobs)
  cd /tmp/code
  echo "start $(date -u +%T)" > $R/done.txt
  ttd() {
    mkdir -p $R/ttd
    python3 benchmarks/time_to_diagnosis.py --model /tmp/dense --profile $PROFILE --cold \
      --cache /tmp/ttd-compile-cache --results $R/ttd --out $R/ttd/time_to_diagnosis.json \
      --steps "${STEPS:-stress,fuzz-3,explain-4}" --budget-s 420 --step-limit-s 480 > $R/ttd.log 2>&1
    echo "ttd exit $? at $(date -u +%T)" >> $R/done.txt
  }
  [ "${TOGETHER:-0}" = 1 ] && { ttd & }  # short of device time: all at once (timings shared)
  premerge premerge-trained & a=$!
  premerge premerge-random --model /tmp/dense & b=$!
  wait $a $b
  echo "premerge-done $(date -u +%T); GPU memory after: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)" >> $R/done.txt
  [ "${TOGETHER:-0}" = 1 ] || ttd
  wait
  echo ALL-DONE >> $R/done.txt ;;
wait)
  for _ in $(seq "${WAIT_S:-500}"); do grep -q "${UNTIL:-ALL-DONE}" $R/done.txt 2>/dev/null && break; sleep 1; done
  cat $R/done.txt; for f in $R/*.console.txt; do echo "== $f"; tail -4 "$f"; done
  tail -12 $R/ttd.log 2>/dev/null
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  for d in $R/premerge-* $R/ttd/*/; do
    [ -f "$d/engine.log" ] && grep -E "cudagraph|CUDA graph|Capturing|Model Runner|model runner|backend|structured|xgrammar|Error|error" \
      "$d/engine.log" | head -60 > "$d/engine-highlights.log"
  done
  tar czf "$OUT/runs.tgz" --exclude=engine.log -C /tmp runs
  [ "$(stat -c %s "$OUT/runs.tgz")" -lt 16000000 ] || tar czf "$OUT/runs.tgz" --exclude=engine.log \
    --exclude=requests.jsonl -C /tmp runs
  ls -la "$OUT" ;;
esac
