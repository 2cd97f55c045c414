#!/usr/bin/env bash
# Sourced by the run scripts (issue47-49-w-run.sh and later): the environment of a harness run on
# the lent GPU machine, `step NAME ARGS...` (a harness command with its console and exit code
# kept under $R), `install_and_copy` (vLLM 0.26 from the wheels gathered in /tmp/wh, one `run`
# call per .gpuwheels/NN folder before it; the MoE model of run u from .gpumodel; the tree copied
# to /tmp/code), `pack_runs NAME` (the runs of $R into $OUT/NAME.tgz, requests.jsonl kept
# unless that makes the archive too big to come back) and `pack_ttd DIR` (time_to_diagnosis's
# records).
export PYTHONPATH=/tmp/site:/tmp/code VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=${R:-/tmp/runs}

step() {  # NAME ARGS...
  local name=$1; shift
  local t0; t0=$(date +%s)
  timeout -s INT "${STEP_S:-1500}" python3 -m pleharness "$@" > "$R/$name.console.txt" 2>&1
  echo "$name exit $? in $(( $(date +%s) - t0 )) s at $(date -u +%T)" >> "$R/done.txt"
}

install_and_copy() {
  local t0; t0=$(date +%s)
  if ! python3 -c "import vllm" 2>/dev/null; then
    cat /tmp/wh/xgrammar.part* > /tmp/wh/xgrammar-0.2.3-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
    rm -f /tmp/wh/xgrammar.part*
    bash docs/gpu-runs/device-install-vllm.sh /tmp/wh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; return 1; }
  fi
  python3 -c "import vllm; print('vllm', vllm.__version__)" || { tail -30 /tmp/install.log; return 1; }
  [ -d /tmp/moe ] || cp -r .gpumodel/moe /tmp/moe
  rm -rf /tmp/code; cp -r "$PWD" /tmp/code
  mkdir -p "$R"; echo "set-up $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.used,driver_version --format=csv,noheader
}

pack_runs() {  # NAME: $R (engine logs left out) into $OUT/NAME.tgz
  tar czf "$OUT/$1.tgz" --exclude='*engine*.log' -C "$(dirname "$R")" "$(basename "$R")"
  [ "$(stat -c %s "$OUT/$1.tgz")" -lt 16000000 ] || tar czf "$OUT/$1.tgz" \
    --exclude='*engine*.log' --exclude='*requests.jsonl' -C "$(dirname "$R")" "$(basename "$R")"
}

pack_ttd() {  # DIR: time_to_diagnosis's records in DIR (each run's manifest, summary, reproducers
  # and explain report; no engine logs) into $OUT/ttd.tgz
  local T=$1; mkdir -p "$T/keep"; cp "$T"/*.json "$T"/*.log "$T"/*.console.txt "$T/keep/" 2>/dev/null
  for d in "$T"/ttd-*; do [ -d "$d" ] || continue; local n; n=$(basename "$d"); mkdir -p "$T/keep/$n"
    cp "$d"/manifest.json "$d"/summary.md "$d"/repro*.toml "$T/keep/$n/" 2>/dev/null
    [ -d "$d/explain" ] && cp "$d"/explain/explain.json "$d"/explain/explain.md "$T/keep/$n/" 2>/dev/null; done
  tar czf "$OUT/ttd.tgz" -C "$T" keep
}
