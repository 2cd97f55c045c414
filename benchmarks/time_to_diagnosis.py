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
               (``--explain-of fuzz-3``: explain that fuzz step's run instead)

``--stress-arg`` adds to the stress step (e.g. a control run: on a noisy bf16 engine a stress
run without one can fail on numerics instead of the fault, GPU run x).

The compile cache: ``--compile-cache`` is ``--cache`` for every step; ``--cold`` empties it
before the first step (so the first engine start pays for torch.compile and the later ones do
not, as on a maintainer's machine). ``--passes cold,warm`` runs the steps twice: first on an
emptied cache, then again on the cache the first pass filled (the second job of a day).
Writes ``--out`` (JSON: per step the wall time, the verdicts and the job's own time stamps from
its command's start, issue 49: failing run, reproducer, diagnosis and confirmed after N s, and
each engine start with its compile cache cold or warm) and prints a table.

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


def engine_starts(run_dir: Path) -> list[str]:
    """Every engine start of a stress / fuzz run, its own (with the compile cache's state) and
    its confirmations': ``engine 171 s (cold)``, ``replay 40 s (warm)``."""
    m = load(run_dir / "manifest.json")
    out = [starts((m.get("timeline") or {}).get("engine_starts"))]
    for row in (m.get("tables") or {}).get("reproducers") or []:
        for r in (row.get("confirmation") or {}).get("replays") or []:
            sub = load(Path(r.get("manifest") or "/nonexistent"))
            out.append(starts((sub.get("timeline") or {}).get("engine_starts"), "replay"))
    return [x for xs in out for x in xs]


def starts(rows, what: str | None = None) -> list[str]:
    """``what ready_s s (cache)`` of each engine start of a job's timeline; ``(warm, started
    ahead)`` for an engine started before it was needed (fuzz's confirmation engines)."""
    return [f"{what or e.get('what')} {e.get('ready_s', 0):.0f} s ({e.get('cache') or '?'}"
            f"{', started ahead' if e.get('spare') else ''})" for e in rows or []]


STAMPS = ("failing_run_s", "reproducer_s", "diagnosis_s", "confirmed_s", "ended_s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", default="profiles/gpu-h200-ngram-k2.toml")
    ap.add_argument("--steps", default="stress,fuzz-1,fuzz-3,explain-4,explain-1")
    ap.add_argument("--when", default=WHEN, help="PLE_FAULT_WHEN (tests/fault_engine.py)")
    ap.add_argument("--vocab", type=int, default=793, help="the model's vocabulary size")
    ap.add_argument("--cache", default="/tmp/ttd-compile-cache", help="VLLM_CACHE_ROOT")
    ap.add_argument("--cold", action="store_true", help="empty the compile cache first")
    ap.add_argument("--passes", default="", help="cold,warm: the steps on an emptied cache, "
                    "then again on the filled one (implies --cold)")
    ap.add_argument("--results", default="/tmp/ttd-runs")
    ap.add_argument("--budget-s", type=float, default=600.0, help="explain's --budget-s")
    ap.add_argument("--step-limit-s", type=float, default=900.0,
                    help="SIGTERM a step after this long (it keeps what it learned)")
    ap.add_argument("--out", default="/tmp/ttd-runs/time_to_diagnosis.json")
    ap.add_argument("--stress-arg", action="append", default=[],
                    help="appended to the stress step's command, repeatable: e.g. a control on "
                    "a bf16 engine whose numerics need one (GPU run x: without a control the "
                    "stress step failed on a cold/warm reference split at 0.75 nats, so "
                    "explain had no divergence to explain)")
    ap.add_argument("--explain-of", default="stress", help="the step whose run explain-N "
                    "explains: stress (default) or a fuzz step, e.g. fuzz-3")
    a = ap.parse_args()
    res = Path(a.results)
    res.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PLE_FAULT_UPSTREAM": "spawn",
           "PLE_FAULT_WHEN": a.when, "PLE_FAULT_MODE": "crowded", "PLE_FAULT_VOCAB": str(a.vocab),
           "PLE_REAL_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    launch = ["--engine-python", FAKE_PY, "--engine-profile", a.profile, "--model", a.model,
              "--results-dir", str(res), "--compile-cache", a.cache]
    report = {"machine": machine(), "model": a.model, "profile": a.profile, "when": a.when,
              "cold_cache_at_start": a.cold or a.passes.startswith("cold"),
              "passes": a.passes, "steps": []}
    passes = [p for p in a.passes.split(",") if p] or [""]
    for pas in passes:
        if pas == "cold" or (a.cold and pas == passes[0]):
            shutil.rmtree(a.cache, ignore_errors=True)
        for step in a.steps.split(","):
            report["steps"].append(one_step(step, pas, launch, env, res, a))
            Path(a.out).write_text(json.dumps(report, indent=1))
    w = 14
    print(f"\n{'step':<{w}}{'exit':>5}{'wall s':>8}" + "".join(f"{x[:-2]:>13}" for x in STAMPS)
          + "  engine starts")
    for r in report["steps"]:
        t = r.get("timeline") or {}
        print(f"{r['step']:<{w}}{r['exit_code']:>5}{r['wall_s']:>8}" + "".join(
            f"{'-' if t.get(x) is None else t[x]:>13}" for x in STAMPS)
            + f"  {', '.join(r.get('engine_starts') or [])}")
    return 0


def one_step(step: str, pas: str, launch: list[str], env: dict, res: Path, a) -> dict:
    """Run one step (``stress``, ``fuzz-N``, ``explain-N``) of pass ``pas`` and read back its
    verdicts and its time stamps (issue 49)."""
    kind, _, n = step.partition("-")
    tag = f"{step}-{pas}" if pas else step
    stress_run = res / (f"ttd-stress-{pas}" if pas else "ttd-stress")
    explained = stress_run if a.explain_of == "stress" else \
        res / f"ttd-{a.explain_of}-{pas}" if pas else res / f"ttd-{a.explain_of}"
    if kind == "stress":
        argv = ["stress", *launch, "--run-id", stress_run.name, "--scenario", "transitions",
                "--ladder", "4,1", "--repeats", "1", "--confirm-runs", "0", *a.stress_arg]
    elif kind == "fuzz":
        argv = ["fuzz", *launch, "--run-id", f"ttd-{tag}", "--time-budget", "60",
                "--confirm-runs", "3", "--parallel-engines", n or "1"]
    elif kind == "explain":
        argv = ["explain", str(explained), "--confirm-runs", "3", "--parallel-engines",
                n or "1", "--budget-s", str(a.budget_s), "--compile-cache", a.cache]
    else:
        raise SystemExit(f"unknown step {step!r}")
    print(f"== {tag}: {' '.join(argv)}", flush=True)
    row = run_step(tag, argv, env, res / f"{tag}.console.txt", a.step_limit_s)
    if kind in ("stress", "fuzz"):
        rdir = stress_run if kind == "stress" else res / f"ttd-{tag}"
        m = load(rdir / "manifest.json")
        row.update(verdict=m.get("verdict"), engine_starts=engine_starts(rdir),
                   timeline={k: (m.get("timeline") or {}).get(k) for k in STAMPS},
                   reproducers=[r.get("verdict") for r in
                                (m.get("tables") or {}).get("reproducers") or []])
    else:
        ex = load(explained / "explain" / "explain.json")
        if (explained / "explain").is_dir():  # none when explain refused before making it
            shutil.copytree(explained / "explain", res / f"{tag}-explain", dirs_exist_ok=True)
        t = ex.get("timeline") or {}
        row.update(status=ex.get("status"), estimate=(ex.get("estimate") or {}).get("text"),
                   timeline={k: t.get(k) for k in STAMPS},
                   engine_starts=starts(t.get("engine_starts")),
                   launches=[(la.get("config"), la.get("ready_s") or la.get("skipped"))
                             for la in ex.get("launches") or []],
                   attribution=sorted({c.get("attribution") for c in ex.get("cases") or []}),
                   reproduction=sorted({str(c.get("reproduction_verdict"))
                                        for c in ex.get("cases") or []}))
    print(json.dumps(row, indent=1), flush=True)
    return row


if __name__ == "__main__":
    raise SystemExit(main())
