"""Time to diagnosis (issue 33): from a planted engine fault to a failing run, to a reproducer
confirmed on fresh engines, and to explain's diagnosis; with an empty or a warm compile cache, with
1 or N engines side by side.

The fault lives in every engine the harness launches: ``tests/fakepy/python`` stands in for the
engine's Python, and each launch starts a real vLLM server of its own behind the fault proxy
(``PLE_FAULT_UPSTREAM=spawn``, tests/fault_engine.py), so every launch costs a real engine start.
The fault: output position 5 becomes token + 1 while >= 2 requests are in flight, only while the
launch has ``PLE_FAULT_WHEN`` (default: the FULL_AND_PIECEWISE compilation config and no
``--enforce-eager``: a CUDA-graph dispatch defect that PIECEWISE graphs do not have).

Steps (``--steps``, in order; each a ``python -m pleharness`` process, timed from its start to
its exit):

  stress       ``stress --scenario transitions --ladder 4,1 --repeats 1`` (a failing run to explain)
  fuzz-N       ``fuzz --time-budget 60 --confirm-runs 3 --parallel-engines N``: to a reproducer
               confirmed on 3 fresh engines
  explain-N    ``explain STRESS_RUN --confirm-runs 3 --parallel-engines N --budget-s B``

The compile cache: ``VLLM_CACHE_ROOT`` is ``--cache`` for every step; ``--cold`` empties it
before the first step (so the first engine start pays for torch.compile and the later ones do
not, as on a maintainer's machine). Writes ``--out`` (JSON: per step the wall time, the engine
start times it measured, the verdicts) and prints a table.

Example (the H200, docs/gpu-runs/issue33-run.sh):
``python3 benchmarks/time_to_diagnosis.py --model /tmp/dense --profile
profiles/gpu-h200-ngram-k2.toml --steps stress,fuzz-1,fuzz-3,explain-4,explain-1 --cold``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine  # noqa: E402

FAKE_PY = str(ROOT / "tests" / "fakepy" / "python")
WHEN = '--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"},!--enforce-eager'


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_step(name: str, argv: list[str], env: dict, log: Path, limit_s: float) -> dict:
    """One timed ``python -m pleharness`` process; its console in ``log``."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "pleharness", *argv], cwd=ROOT, env=env,
                             stdout=f, stderr=subprocess.STDOUT)
        try:
            code = p.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            p.terminate()  # SIGTERM: the job stops its engines and keeps what it learned
            code = p.wait(timeout=120)
    return {"step": name, "argv": argv, "exit_code": code,
            "wall_s": round(time.monotonic() - t0, 1), "log": str(log)}


def engine_starts(run_dir: Path) -> list[float]:
    """ready_s of every engine a stress / fuzz run started: its own and its confirmations'."""
    m = load(run_dir / "manifest.json")
    out = [m.get("engine", {}).get("ready_s")]
    for row in (m.get("tables") or {}).get("reproducers") or []:
        for r in (row.get("confirmation") or {}).get("replays") or []:
            out.append(r.get("engine_ready_s"))
    return [round(x, 1) for x in out if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", default="profiles/gpu-h200-ngram-k2.toml")
    ap.add_argument("--steps", default="stress,fuzz-1,fuzz-3,explain-4,explain-1")
    ap.add_argument("--when", default=WHEN, help="PLE_FAULT_WHEN (tests/fault_engine.py)")
    ap.add_argument("--vocab", type=int, default=793, help="the model's vocabulary size")
    ap.add_argument("--cache", default="/tmp/ttd-compile-cache", help="VLLM_CACHE_ROOT")
    ap.add_argument("--cold", action="store_true", help="empty the compile cache first")
    ap.add_argument("--results", default="/tmp/ttd-runs")
    ap.add_argument("--budget-s", type=float, default=600.0, help="explain's --budget-s")
    ap.add_argument("--step-limit-s", type=float, default=900.0,
                    help="SIGTERM a step after this long (it keeps what it learned)")
    ap.add_argument("--out", default="/tmp/ttd-runs/time_to_diagnosis.json")
    a = ap.parse_args()
    res = Path(a.results)
    res.mkdir(parents=True, exist_ok=True)
    if a.cold:
        shutil.rmtree(a.cache, ignore_errors=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": a.cache, "PLE_FAULT_UPSTREAM": "spawn",
           "PLE_FAULT_WHEN": a.when, "PLE_FAULT_MODE": "crowded", "PLE_FAULT_VOCAB": str(a.vocab),
           "PLE_REAL_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    launch = ["--engine-python", FAKE_PY, "--engine-profile", a.profile, "--model", a.model,
              "--results-dir", str(res)]
    report = {"machine": machine(), "model": a.model, "profile": a.profile, "when": a.when,
              "cold_cache_at_start": a.cold, "steps": []}
    stress_run = res / "ttd-stress"
    for step in a.steps.split(","):
        kind, _, n = step.partition("-")
        if kind == "stress":
            argv = ["stress", *launch, "--run-id", "ttd-stress", "--scenario", "transitions",
                    "--ladder", "4,1", "--repeats", "1", "--confirm-runs", "0"]
        elif kind == "fuzz":
            argv = ["fuzz", *launch, "--run-id", f"ttd-{step}", "--time-budget", "60",
                    "--confirm-runs", "3", "--parallel-engines", n or "1"]
        elif kind == "explain":
            argv = ["explain", str(stress_run), "--confirm-runs", "3", "--parallel-engines",
                    n or "1", "--budget-s", str(a.budget_s)]
        else:
            raise SystemExit(f"unknown step {step!r}")
        print(f"== {step}: {' '.join(argv)}", flush=True)
        row = run_step(step, argv, env, res / f"{step}.console.txt", a.step_limit_s)
        if kind in ("stress", "fuzz"):
            rdir = res / ("ttd-stress" if kind == "stress" else f"ttd-{step}")
            m = load(rdir / "manifest.json")
            row.update(verdict=m.get("verdict"), engine_ready_s=engine_starts(rdir),
                       reproducers=[r.get("verdict") for r in
                                    (m.get("tables") or {}).get("reproducers") or []])
            fs = ((m.get("tables") or {}).get("fuzz_summary") or [{}])[0]
            row["fuzz_found_after_s"] = fs.get("elapsed_s") if kind == "fuzz" else None
        else:
            ex = load(stress_run / "explain" / "explain.json")
            shutil.copytree(stress_run / "explain", res / f"{step}-explain", dirs_exist_ok=True)
            row.update(status=ex.get("status"), estimate=(ex.get("estimate") or {}).get("text"),
                       launches=[(la.get("config"), la.get("ready_s") or la.get("skipped"))
                                 for la in ex.get("launches") or []],
                       attribution=sorted({c.get("attribution") for c in ex.get("cases") or []}),
                       reproduction=sorted({str(c.get("reproduction_verdict"))
                                            for c in ex.get("cases") or []}))
        report["steps"].append(row)
        Path(a.out).write_text(json.dumps(report, indent=1))
        print(json.dumps(row, indent=1), flush=True)
    print(f"\n{'step':<12}{'exit':>6}{'wall s':>9}  engine starts / launches")
    for r in report["steps"]:
        print(f"{r['step']:<12}{r['exit_code']:>6}{r['wall_s']:>9}  "
              f"{r.get('engine_ready_s') or r.get('launches')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
