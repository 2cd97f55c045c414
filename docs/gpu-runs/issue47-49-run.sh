#!/usr/bin/env bash
# Session 19 (2026-12-06) on the lent GPU, one machine, from the repo root there (after the vLLM 0.26
# wheels were copied to /tmp/wh: one call per .gpuwheels/cNN, each vllm.partNN <= 34 MiB so that a
# call's carry and the tree stay under 64 MiB; the start call carries .gpumodel, the model of run u,
# docs/gpu-runs/make-moe-model.py --lm-head-scale 32). Two things side by side:
#   A. issue 47, the second try of run u's clean runs (their harness false alarms fixed since):
#      clean-pw     default suite, control PIECEWISE graphs                       want exit 0
#      clean-eager  default suite, control without CUDA graphs (--enforce-eager)  want exit 0
#      (profile docs/gpu-runs/2026-12-06-u-issue47-48/moe-ngram-k2-2048.toml, compile cache /tmp/cc)
#   B. issue 49, benchmarks/time_to_diagnosis.py on the same model and profile, the fault planted
#      in every launched engine (FULL_AND_PIECEWISE only), steps stress, fuzz-3, explain-4, first
#      on an empty compile cache (/tmp/ttd-cc), then again on the filled one (--passes cold,warm).
#      Its timings are taken beside A's engines (one GPU, 16 cores): upper bounds.
#   PART=start bash docs/gpu-runs/issue47-49-run.sh             # install, start A and B
#   PART=wait WAIT_S=550 bash docs/gpu-runs/issue47-49-run.sh   # wait for A-DONE (UNTIL=...); $OUT
set -u
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/runs
T=/tmp/ttd-runs
PROFILE=docs/gpu-runs/2026-12-06-u-issue47-48/moe-ngram-k2-2048.toml

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
  mkdir -p $R $T; echo "set-up $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
  PART=jobs setsid nohup bash docs/gpu-runs/issue47-49-run.sh > $R/jobs.log 2>&1 < /dev/null &
  setsid nohup python3 benchmarks/time_to_diagnosis.py --model /tmp/moe --profile $PROFILE \
    --cache /tmp/ttd-cc --passes cold,warm --steps stress,fuzz-3,explain-4 --results $T \
    --out $T/time_to_diagnosis.json --budget-s 420 --step-limit-s 560 > $T/bench.log 2>&1 < /dev/null &
  sleep 2; echo started ;;
jobs)
  cd /tmp/code
  echo "start $(date -u +%T)" > $R/done.txt
  base=(--engine-profile $PROFILE --model /tmp/moe --results-dir $R --compile-cache /tmp/cc)
  pw=(--control-drop-arg=--compilation-config '--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}')
  eager=(--control-drop-arg=--compilation-config --control-engine-arg=--enforce-eager)
  step clean-pw stress "${base[@]}" --run-id clean-pw "${pw[@]}" --parallel-engines 2 &
  step clean-eager stress "${base[@]}" --run-id clean-eager "${eager[@]}" --parallel-engines 2 &
  wait
  echo A-DONE >> $R/done.txt ;;
wait)
  for _ in $(seq "${WAIT_S:-550}"); do grep -q "${UNTIL:-A-DONE}" $R/done.txt $T/bench.log 2>/dev/null && break; sleep 1; done
  cat $R/done.txt; for f in $R/*.console.txt; do echo "== $f"; tail -4 "$f" | cut -c1-400; done
  echo "== bench"; grep -E "^== |\"exit_code\"|\"wall_s\"|_s\":" $T/bench.log | tail -40
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  # the clean runs' requests.jsonl carry the logprobs a cross-configuration envelope needs
  # (run v left them out and could not measure it): kept unless the archive gets too big
  tar czf "$OUT/runs.tgz" --exclude='*engine*.log' -C /tmp runs
  [ "$(stat -c %s "$OUT/runs.tgz")" -lt 16000000 ] || tar czf "$OUT/runs.tgz" \
    --exclude='*engine*.log' --exclude='*requests.jsonl' -C /tmp runs
  mkdir -p $T/keep; cp $T/*.json $T/*.log $T/*.console.txt $T/keep/ 2>/dev/null
  for d in $T/ttd-*; do [ -d "$d" ] || continue; n=$(basename $d); mkdir -p $T/keep/$n
    cp $d/manifest.json $d/summary.md $d/repro*.toml $T/keep/$n/ 2>/dev/null; done
  for d in $T/*-explain; do [ -d "$d" ] || continue; n=$(basename $d); mkdir -p $T/keep/$n
    cp $d/explain.json $d/explain.md $d/repro-*.toml $T/keep/$n/ 2>/dev/null; done
  tar czf "$OUT/ttd.tgz" -C $T keep
  ls -la "$OUT" ;;
esac
