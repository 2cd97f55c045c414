#!/usr/bin/env bash
# For the next session with device time (issue 49's GPU marks, cold and warm in one call): the
# wheels copied to /tmp/wh first (one `run` call per .gpuwheels/NN, as for run x), then
#   PART=start bash docs/gpu-runs/issue49-y-run.sh      # carrying .gpumodel: install, start
#   PART=wait WAIT_S=570 bash docs/gpu-runs/issue49-y-run.sh   # until DONE; again if needed
# benchmarks/time_to_diagnosis.py on run x's engine (bf16 MoE, lm_head x 32, ngram k = 2,
# FULL_AND_PIECEWISE), the fault keyed to FULL_AND_PIECEWISE, --passes cold,warm: an emptied
# compile cache, then the filled one; the stress step with a PIECEWISE control beside it (run x:
# without a control that step failed on a cold/warm reference split at 0.75 nats, numerics, and
# explain had nothing to explain); explain of the stress run. Marks (warm): fuzz to a confirmed
# reproducer <= 120 s (run x: 146 s; now its first confirmation wave starts during the search), explain's diagnosis <= 300 s (84 s), confirmed <= 420 s (144 s).
set -u
. docs/gpu-runs/gpu-common.sh
T=/tmp/ttd-runs
PROFILE=docs/gpu-runs/2026-12-06-u-issue47-48/moe-ngram-k2-2048.toml
case "${PART:-start}" in
start)
  install_and_copy || exit 1
  cd /tmp/code; mkdir -p $T
  PART=jobs setsid nohup bash docs/gpu-runs/issue49-y-run.sh > $R/jobs.log 2>&1 < /dev/null &
  sleep 2; echo started ;;
jobs)
  echo "start $(date -u +%T)" > $R/done.txt
  python3 benchmarks/time_to_diagnosis.py --model /tmp/moe --profile $PROFILE --cache /tmp/ttd-cc \
    --passes cold,warm --steps stress,fuzz-3,explain-4 --budget-s 300 --step-limit-s 420 \
    --stress-arg=--parallel-engines --stress-arg=2 \
    --stress-arg=--control-drop-arg=--compilation-config \
    '--stress-arg=--control-engine-arg=--compilation-config={"cudagraph_mode": "PIECEWISE"}' \
    --results $T --out $T/time_to_diagnosis.json > $T/bench.log 2>&1
  echo DONE >> $R/done.txt ;;
wait)
  for _ in $(seq "${WAIT_S:-570}"); do grep -q DONE $R/done.txt 2>/dev/null && break; sleep 1; done
  cat $R/done.txt; grep -E "^== |^step|^(stress|fuzz|explain)" $T/bench.log | tail -20
  pack_ttd $T; ls -la "$OUT" ;;
esac
