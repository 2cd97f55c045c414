#!/usr/bin/env bash
# Session 22 (2026-12-07), run x on the lent GPU (run w's script less its eager control, which
# run w showed computes another function on this engine; B times fuzz and explain), from the repo root there (the wheels copied to
# /tmp/wh first, one call per .gpuwheels/NN; the start call carries .gpumodel: the model of run u,
# docs/gpu-runs/make-moe-model.py --lm-head-scale 32). The engine under test is run u's
# (2026-12-06-u-issue47-48/moe-ngram-k2-2048.toml: random-weight bf16 MoE, lm_head x 32, ngram
# k = 2, FULL_AND_PIECEWISE, max_model_len 2048, vLLM's default chunk budget), compile cache /tmp/cc.
#   A. issue 47, side by side (2 engines each):
#      clean-pw       default suite, control PIECEWISE graphs                          want exit 0
#      clean-none     default suite, control cudagraph_mode NONE (compiled, no graphs) want exit 0
#                     (run v: red for the eager control's own numerics and for
#                     sampled_degeneration; since: the cross-configuration envelope and the
#                     degeneration rate)
#      planted-pw     boundary + transitions, a fault keyed to FULL_AND_PIECEWISE that changes
#                     token 5 of every run of the q-length prompt: red by the control's answers
#      long-pw        default suite on the same engine with max_model_len 20480 (vLLM's default
#                     chunk budget of 8192 tokens: C+q, 2C, 2C+q prompts chunked; profile
#                     docs/gpu-runs/moe-ngram-k2-20480.toml), control PIECEWISE      want exit 0
#      selftest       clean pass + 5 planted classes on the engine under test   want clean, detected
#   B. issue 49, after A (no engine beside it): benchmarks/time_to_diagnosis.py --steps
#      stress,fuzz-3,explain-4 on the compile cache A filled (warm), the fault planted in every
#      engine: fuzz's confirmed reproducer with the 60-s default --shrink-budget (run v: 435 s
#      with a 600-s budget), explain's diagnosis line and confirmed reproducer.
#   [B=0] PART=start bash docs/gpu-runs/issue47-49-x-run.sh       # install, start A then B
#     (B=0: A only, for little device time)
#   PART=wait WAIT_S=550 bash docs/gpu-runs/issue47-49-x-run.sh   # wait for UNTIL (A-DONE); $OUT
set -u
. docs/gpu-runs/gpu-common.sh
T=/tmp/ttd-runs
PROFILE=docs/gpu-runs/2026-12-06-u-issue47-48/moe-ngram-k2-2048.toml

case "${PART:-start}" in
start)
  install_and_copy || exit 1
  cd /tmp/code; mkdir -p $T
  PART=jobs setsid nohup bash docs/gpu-runs/issue47-49-x-run.sh > $R/jobs.log 2>&1 < /dev/null &
  sleep 2; echo started ;;
jobs)
  echo "start $(date -u +%T)" > $R/done.txt
  export PLE_FAULT_UPSTREAM=spawn PLE_FAULT_VOCAB=793 PLE_REAL_PYTHON=$(command -v python3) \
    PLE_FAULT_MODE=every PLE_FAULT_LEN=1+k
  FAKE=/tmp/code/tests/fakepy/python
  FAP='--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"}'
  base=(--engine-profile $PROFILE --model /tmp/moe --results-dir $R --compile-cache /tmp/cc
        --parallel-engines 2)
  pw=(--control-drop-arg=--compilation-config '--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}')
  none=(--control-drop-arg=--compilation-config '--control-engine-arg=--compilation-config={"cudagraph_mode": "NONE"}')
  planted=(--engine-python $FAKE --scenario boundary --scenario transitions)
  step clean-pw stress "${base[@]}" --run-id clean-pw "${pw[@]}" &
  # run w: with the model's own 4096 positions the engine died past them (device-side assert)
  [ -d /tmp/moe-long ] || { cp -r /tmp/moe /tmp/moe-long && python3 -c "import json; p = '/tmp/moe-long/config.json'; c = json.load(open(p)); c['max_position_embeddings'] = 32768; json.dump(c, open(p, 'w'), indent=2)"; }
  long=("${base[@]}"); long[1]=docs/gpu-runs/moe-ngram-k2-20480.toml; long[3]=/tmp/moe-long
  step long-pw stress "${long[@]}" --run-id long-pw "${pw[@]}" &
  step selftest selftest --engine-profile $PROFILE --model /tmp/moe --results-dir $R \
    --compile-cache /tmp/cc --run-id selftest --fault flip_under_load --fault corrupt_warm \
    --fault logprobs_off_under_load --fault prompt_logprobs_shifted --fault oov_id &
  # the no-CUDA-graph control with compiled kernels (run w: the eager one computes another
  # function on this engine)
  step clean-none stress "${base[@]}" --run-id clean-none "${none[@]}" &
  PLE_FAULT_WHEN="$FAP" step planted-pw stress "${base[@]}" --run-id planted-pw "${planted[@]}" "${pw[@]}" &
  wait
  echo A-DONE >> $R/done.txt
  [ "${B:-1}" = 1 ] || exit 0  # B=0 at start: A only (too little device time for B)
  python3 benchmarks/time_to_diagnosis.py --model /tmp/moe --profile $PROFILE --cache /tmp/cc \
    --steps stress,fuzz-3,explain-4 --results $T --out $T/time_to_diagnosis.json --step-limit-s 560 --budget-s 400 > $T/bench.log 2>&1
  echo B-DONE >> $R/done.txt ;;
explain-fuzz|cold)  # run x, after B (its stress step failed on a corrupt reference, so
  # explain-4 had nothing to explain): explain the warm fuzz-3 run instead; then `cold`: fuzz-3
  # and explain-4 again on empty compile caches (explain on a second empty one)
  export PLE_FAULT_UPSTREAM=spawn PLE_FAULT_VOCAB=793 PLE_REAL_PYTHON=$(command -v python3) \
    PLE_FAULT_MODE=crowded PLE_FAULT_WHEN='--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"},!--enforce-eager'
  cd /tmp/code
  if [ "$PART" = explain-fuzz ]; then
    timeout -s TERM 480 python3 -m pleharness explain $T/ttd-fuzz-3 --confirm-runs 3 \
      --parallel-engines 4 --budget-s 400 --compile-cache /tmp/cc > $T/explain-fuzz.console.txt 2>&1
    exit 0
  fi
  mkdir -p /tmp/cold
  timeout -s TERM 230 python3 -m pleharness fuzz --engine-python /tmp/code/tests/fakepy/python \
    --engine-profile $PROFILE --model /tmp/moe --results-dir /tmp/cold --compile-cache /tmp/cc-cold \
    --run-id cold-fuzz-3 --time-budget 60 --confirm-runs 3 --parallel-engines 3 > /tmp/cold/fuzz.console.txt 2>&1
  timeout -s TERM 200 python3 -m pleharness explain /tmp/cold/cold-fuzz-3 --confirm-runs 3 \
    --parallel-engines 4 --budget-s 180 --compile-cache /tmp/cc-cold2 > /tmp/cold/explain.console.txt 2>&1 ;;
wait)
  for _ in $(seq "${WAIT_S:-550}"); do grep -q "${UNTIL:-A-DONE}" $R/done.txt 2>/dev/null && break; sleep 1; done
  cat $R/done.txt; for f in $R/*.console.txt; do echo "== $f"; tail -4 "$f" | cut -c1-400; done
  echo "== bench"; grep -E "^== |\"exit_code\"|\"wall_s\"|_s\":" $T/bench.log 2>/dev/null | tail -30
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  pack_runs runs
  if grep -q B-DONE $R/done.txt; then
    mkdir -p $T/keep; cp $T/*.json $T/*.log $T/*.console.txt $T/keep/ 2>/dev/null
    for d in $T/ttd-*; do [ -d "$d" ] || continue; n=$(basename $d); mkdir -p $T/keep/$n
      cp $d/manifest.json $d/summary.md $d/repro*.toml $T/keep/$n/ 2>/dev/null; done
    tar czf "$OUT/ttd.tgz" -C $T keep
  fi
  ls -la "$OUT" ;;
esac
