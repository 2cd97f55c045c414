#!/usr/bin/env bash
# Session 18 (2026-12-06) on the lent GPU, one machine, from the repo root there: issues 47 and 48
# on a real vLLM 0.26 in bf16. The engine under test: docs/gpu-runs/2026-12-06-u-issue47-48/
# moe-ngram-k2-2048.toml (random-weight MoE, lm_head x 32, ngram k = 2, FULL_AND_PIECEWISE,
# max_model_len 2048, vLLM's default chunk budget). Jobs, side by side (each engine a fixed 1 GiB
# KV cache, one compile cache):
#   clean-pw      default suite, control PIECEWISE graphs                       want exit 0
#   clean-eager   default suite, control without CUDA graphs (--enforce-eager)  want exit 0
#   selftest      clean pass + 5 classes on the engine under test               want clean, detected
#   planted-pw    boundary + transitions, a fault keyed to FULL_AND_PIECEWISE that changes
#                 token 5 of every run of the q-length prompt (tests/fault_engine.py, mode every):
#                 every self-comparison holds; the PIECEWISE control's answers show it  want exit 1
#   builds-red    boundary, --engine-python PLANTED (fault always) --control-engine-python BASE
#                 (the same launcher, fault off), same arguments                want exit 1
#   builds-green  boundary, --engine-python FIXED (fault off) --control-engine-python BASE  want 0
# The model is carried in .gpumodel/moe (built here by make-moe-model.py --lm-head-scale 32), the
# wheels as docs/gpu-runs/issue33-35-run.sh (one call per .gpuwheels/partN; xgrammar split in two).
#   PART=start bash docs/gpu-runs/issue47-48-run.sh            # install, start the jobs
#   PART=wait WAIT_S=550 bash docs/gpu-runs/issue47-48-run.sh  # wait; $OUT/runs.tgz
# STEPS=clean (the second try, after the fixes the first one called for): only the clean runs.
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/runs
D=docs/gpu-runs/2026-12-06-u-issue47-48
PROFILE=$D/moe-ngram-k2-2048.toml

step() {  # NAME ARGS...
  local name=$1; shift
  local t0; t0=$(date +%s)
  timeout -s INT "${STEP_S:-1500}" python3 -m pleharness "$@" > "$R/$name.console.txt" 2>&1
  echo "$name exit $? in $(( $(date +%s) - t0 )) s at $(date -u +%T)" >> $R/done.txt
}

case "${PART:-start}" in
start)
  t0=$(date +%s)
  if ! python3 -c "import vllm" 2>/dev/null; then
    cat /tmp/wh/xgrammar.part* > /tmp/wh/xgrammar-0.2.3-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
    rm -f /tmp/wh/xgrammar.part*
    bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  fi
  python3 -c "import vllm; print('vllm', vllm.__version__)" || { tail -30 /tmp/install.log; exit 1; }
  [ -d /tmp/moe ] || cp -r .gpumodel/moe /tmp/moe
  rm -rf /tmp/code; cp -r "$PWD" /tmp/code; cd /tmp/code
  mkdir -p $R; echo "set-up $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
  PART=jobs STEPS=${STEPS:-all} setsid nohup bash docs/gpu-runs/issue47-48-run.sh > $R/jobs.log 2>&1 < /dev/null &
  sleep 2; echo started ;;
jobs)
  cd /tmp/code
  echo "start $(date -u +%T)" > $R/done.txt
  export VLLM_CACHE_ROOT=/tmp/cc PLE_FAULT_UPSTREAM=spawn PLE_FAULT_VOCAB=793 \
    PLE_REAL_PYTHON=$(command -v python3) PLE_FAULT_MODE=every PLE_FAULT_LEN=1+k
  FAKE=/tmp/code/tests/fakepy/python
  mk() { printf '#!/bin/sh\nPLE_FAULT_WHEN=%s exec %s "$@"\n' "$2" "$FAKE" > "$1"; chmod +x "$1"; }
  mk /tmp/planted-python always; mk /tmp/base-python never; mk /tmp/fixed-python never
  FAP='--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"}'
  base=(--engine-profile $PROFILE --model /tmp/moe --results-dir $R)
  pw=(--control-drop-arg=--compilation-config '--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}')
  eager=(--control-drop-arg=--compilation-config --control-engine-arg=--enforce-eager)
  step clean-pw stress "${base[@]}" --run-id clean-pw "${pw[@]}" --parallel-engines 2 &
  step clean-eager stress "${base[@]}" --run-id clean-eager "${eager[@]}" --parallel-engines 2 &
  if [ "${STEPS:-all}" = clean ]; then  # the second try: the clean runs again, after the fixes
    wait; echo ALL-DONE >> $R/done.txt; exit 0
  fi
  step selftest selftest "${base[@]}" --run-id selftest --fault flip_under_load \
    --fault corrupt_warm --fault logprobs_off_under_load --fault prompt_logprobs_shifted --fault oov_id &
  PLE_FAULT_WHEN="$FAP" step planted-pw stress "${base[@]}" --engine-python $FAKE \
    --run-id planted-pw --scenario boundary --scenario transitions "${pw[@]}" --parallel-engines 2 &
  step builds-red stress "${base[@]}" --engine-python /tmp/planted-python \
    --control-engine-python /tmp/base-python --run-id builds-red --scenario boundary --parallel-engines 2
  step builds-green stress "${base[@]}" --engine-python /tmp/fixed-python \
    --control-engine-python /tmp/base-python --run-id builds-green --scenario boundary --parallel-engines 2
  wait
  echo ALL-DONE >> $R/done.txt ;;
wait)
  for _ in $(seq "${WAIT_S:-550}"); do grep -q "${UNTIL:-ALL-DONE}" $R/done.txt 2>/dev/null && break; sleep 1; done
  cat $R/done.txt; for f in $R/*.console.txt; do echo "== $f"; tail -4 "$f" | cut -c1-400; done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  tar czf "$OUT/runs.tgz" --exclude='*engine*.log' -C /tmp runs
  [ "$(stat -c %s "$OUT/runs.tgz")" -lt 16000000 ] || tar czf "$OUT/runs.tgz" \
    --exclude='*engine*.log' --exclude='*requests.jsonl' -C /tmp runs
  ls -la "$OUT" ;;
esac
