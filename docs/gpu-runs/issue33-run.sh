#!/usr/bin/env bash
# Issue 33 on the lent H200 (repo root there, after the vLLM 0.26.0 wheels were copied to /tmp/wh,
# shared/gpu/README.md): benchmarks/time_to_diagnosis.py on the random-weight bf16 dense model
# (make-random-model.py) with profiles/gpu-h200-ngram-k2.toml, the fault planted in every launched
# engine (tests/fault_engine.py, PLE_FAULT_UPSTREAM=spawn: each launch is a real vLLM start):
#   PART=start bash docs/gpu-runs/issue33-run.sh   # install, build the model, start the benchmark
#   PART=wait  bash docs/gpu-runs/issue33-run.sh   # wait (<= WAIT_S s), copy what is done to $OUT
# STEPS overrides the benchmark's steps (default below); COLD= (empty) keeps the compile cache of an
# earlier call; NAME names the JSON and log of a second benchmark in the same machine.
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/ttd-runs
if [ "${PART:-start}" = start ]; then
  if ! python3 -c "import vllm" 2>/dev/null; then
    bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  fi
  python3 -c "import vllm; print('vllm', vllm.__version__)"
  rm -rf /tmp/code; cp -r "$PWD" /tmp/code  # the tree is laid anew by each call: run from a copy
  cd /tmp/code
  [ -d /tmp/dense ] || python3 docs/gpu-runs/make-random-model.py /tmp/dense
  mkdir -p $R
  setsid nohup python3 benchmarks/time_to_diagnosis.py --model /tmp/dense \
    --profile profiles/gpu-h200-ngram-k2.toml ${COLD---cold} --results $R --out $R/${NAME:-time_to_diagnosis}.json \
    --steps "${STEPS:-stress,fuzz-3,explain-4}" --budget-s ${BUDGET_S:-420} --step-limit-s 480 \
    > $R/${NAME:-time_to_diagnosis}.log 2>&1 < /dev/null &
  sleep 5; echo started; nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
  exit 0
fi
# PART=wait
for i in $(seq ${WAIT_S:-540}); do grep -q "engine starts / launches" $R/${NAME:-time_to_diagnosis}.log 2>/dev/null && break; sleep 1; done
tail -15 $R/${NAME:-time_to_diagnosis}.log; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
mkdir -p "$OUT"
cp $R/*.json $R/*.log $R/*.console.txt "$OUT/" 2>/dev/null
for d in $R/ttd-*; do
  n=$(basename $d); mkdir -p "$OUT/$n"
  cp $d/manifest.json $d/summary.md $d/repro*.toml "$OUT/$n/" 2>/dev/null
done
for d in $R/explain-*-explain; do
  n=$(basename $d); mkdir -p "$OUT/$n"; cp $d/explain.json $d/explain.md $d/repro-*.toml "$OUT/$n/" 2>/dev/null
done
ls $R
