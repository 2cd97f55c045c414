#!/usr/bin/env bash
# Session 17 (2026-12-06) on the lent GPU, one machine, in the repo root there: the two jobs
# issue 34 added, on a real vLLM 0.26 in bf16 (random-weight model, make-random-model.py,
# profiles/gpu-h200-ngram-k2.toml: ngram k = 2, FULL_AND_PIECEWISE CUDA graphs, fixed KV cache).
# The planted fault is benchmarks/time_to_diagnosis.py's: tests/fakepy/python stands in for the
# engine's Python and spawns a real vLLM behind the fault proxy (tests/fault_engine.py), output
# position 5 becomes token + 1 while >= 2 requests are in flight, only under FULL_AND_PIECEWISE
# graphs. The "fixed build" is the same launcher with the fault off (PLE_FAULT_WHEN=never).
#   1. fuzz      the fuzz job on the faulty build, --confirm-runs 0 (a failing schedule, repro.toml)
#   2. red       confirm RUN --runs 2 on the faulty build: expect exit 1, 2/2
#   3. green     confirm RUN --runs 2 --engine-python FIXED: expect exit 0, 0/2
#   4. clean     the fuzz job on the fixed build: expect exit 0
# STEPS=clean2 (run t, after the stop-string fix that run s called for): only the fuzz job on the
# fixed build, seeds 1 and 2, two engines side by side.
# Wheels and calls: as docs/gpu-runs/issue33-35-run.sh (one call per .gpuwheels/partN).
#   PART=start bash docs/gpu-runs/issue34-confirm-run.sh          # install, model, start the jobs
#   PART=wait WAIT_S=500 bash docs/gpu-runs/issue34-confirm-run.sh  # wait; $OUT/runs.tgz
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/runs
PROFILE=profiles/gpu-h200-ngram-k2.toml

step() {  # NAME EXPECTED-EXIT ARGS...
  local name=$1 want=$2; shift 2
  local t0; t0=$(date +%s)
  timeout -s INT "${STEP_S:-600}" python3 -m pleharness "$@" > "$R/$name.console.txt" 2>&1
  echo "$name exit $? (want $want) in $(( $(date +%s) - t0 )) s at $(date -u +%T)" >> $R/done.txt
}

case "${PART:-start}" in
start)
  t0=$(date +%s)
  if ! python3 -c "import vllm" 2>/dev/null; then
    bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  fi
  python3 -c "import vllm; print('vllm', vllm.__version__)"
  rm -rf /tmp/code; cp -r "$PWD" /tmp/code; cd /tmp/code
  [ -d /tmp/dense ] || python3 docs/gpu-runs/make-random-model.py /tmp/dense
  mkdir -p $R; echo "set-up $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
  PART=jobs STEPS=${STEPS:-all} setsid nohup bash docs/gpu-runs/issue34-confirm-run.sh > $R/jobs.log 2>&1 < /dev/null &
  sleep 3; echo started ;;
jobs)
  cd /tmp/code
  echo "start $(date -u +%T)" > $R/done.txt
  export VLLM_CACHE_ROOT=/tmp/cc PLE_FAULT_UPSTREAM=spawn PLE_FAULT_MODE=crowded PLE_FAULT_VOCAB=793 \
    PLE_REAL_PYTHON=$(command -v python3) \
    PLE_FAULT_WHEN='--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"},!--enforce-eager'
  FAKE=/tmp/code/tests/fakepy/python FIXED=/tmp/fixed-python
  printf '#!/bin/sh\nPLE_FAULT_WHEN=never exec %s "$@"\n' "$FAKE" > $FIXED; chmod +x $FIXED
  launch="--engine-profile $PROFILE --model /tmp/dense --results-dir $R --seed 1 --time-budget 60"
  if [ "${STEPS:-all}" = clean2 ]; then  # run t: after the stop-string fix, two seeds side by side
    launch="--engine-profile $PROFILE --model /tmp/dense --results-dir $R --time-budget 60"
    step clean-seed1 0 fuzz --engine-python $FIXED $launch --seed 1 --run-id clean-seed1 --confirm-runs 0 &
    step clean-seed2 0 fuzz --engine-python $FIXED $launch --seed 2 --run-id clean-seed2 --confirm-runs 0 &
    wait
  else
    step fuzz 1 fuzz --engine-python $FAKE $launch --run-id fuzz --confirm-runs 0
    step red 1 confirm $R/fuzz --runs 2
    step green 0 confirm $R/fuzz --runs 2 --engine-python $FIXED
    step clean 0 fuzz --engine-python $FIXED $launch --run-id clean --confirm-runs 0
  fi
  echo ALL-DONE >> $R/done.txt ;;
wait)
  for _ in $(seq "${WAIT_S:-500}"); do grep -q "${UNTIL:-ALL-DONE}" $R/done.txt 2>/dev/null && break; sleep 1; done
  cat $R/done.txt; for f in $R/*.console.txt; do echo "== $f"; tail -6 "$f"; done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  tar czf "$OUT/runs.tgz" --exclude=engine.log -C /tmp runs
  [ "$(stat -c %s "$OUT/runs.tgz")" -lt 16000000 ] || tar czf "$OUT/runs.tgz" --exclude=engine.log \
    --exclude=requests.jsonl -C /tmp runs
  ls -la "$OUT" ;;
esac
