"""Wall time of one ``ple-harness stress`` run, split into its parts.

Runs ``python -m pleharness stress ARGS --results-dir TMP`` (default ARGS: ``--engine-profile
profiles/cpu-ngram.toml``, the default suite on the real CPU engine), times the process, and splits
the time with the manifest's timestamps:

  harness start-up    process start -> manifest ``started_at`` (imports, scenario files)
  pre-engine set-up   -> engine launch (environment probe of the engine Python, model cache)
  engine start        ``engine.ready_s`` (launch -> /health 200 and the model listed)
  facts / set-up      engine ready -> first phase (model card, facts, validation)
  references          the reference phases (role ``reference``) of all scenarios
  scenario NAME       from the scenario's first phase to the next scenario's first phase (or the
                      last phase's end), minus its reference phases; this includes the records,
                      checks and manifest writes after each phase, of which
  between phases      the time outside any phase, is also shown on its own
  shutdown            last phase end -> manifest ``ended_at`` (engine stop, summary)
  report / exit       manifest ``ended_at`` -> process exit (tables)

``--double`` starts the fast engine double and attaches to it (``--url``) instead, for a quick check
of the script; pass ple-harness options after ``--``. Exits 0 when the run produced a manifest
(whatever its verdict), and prints the split and ``total_s``.

Example: ``.venv/bin/python benchmarks/suite_walltime.py``
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, FastDouble, machine, print_machine, wait_quiet  # noqa: E402


def ts(s: str | None) -> float | None:
    return datetime.fromisoformat(s).timestamp() if s else None


def split(m: dict, t_spawn: float, t_exit: float) -> dict[str, float]:
    out: dict[str, float] = {}
    started, ended = ts(m["started_at"]), ts(m.get("ended_at"))
    phases = [p for p in m["phases"] if p.get("started_at") and p.get("ended_at")]
    out["harness start-up"] = started - t_spawn
    ready_s = float((m.get("engine") or {}).get("ready_s") or 0.0)
    first = ts(phases[0]["started_at"]) if phases else ended
    last = ts(phases[-1]["ended_at"]) if phases else ended
    # the launch time is not recorded; the engine start is ready_s long and ends when set-up starts.
    # set-up after the engine is ready (model card, facts, one manifest write) is short; it is
    # estimated as the time from the last pre-phase manifest write, which we cannot see, so the
    # whole pre-phase time minus ready_s is shown as set-up.
    out["engine start (ready_s)"] = ready_s
    out["pre-engine + facts set-up"] = max(0.0, first - started - ready_s)
    refs = sum(ts(p["ended_at"]) - ts(p["started_at"]) for p in phases if p["role"] == "reference")
    out["references (all scenarios)"] = refs
    names = list(dict.fromkeys(p["scenario"] for p in phases))
    starts = {n: min(ts(p["started_at"]) for p in phases if p["scenario"] == n) for n in names}
    for i, n in enumerate(names):
        end = starts[names[i + 1]] if i + 1 < len(names) else last
        mine = sum(ts(p["ended_at"]) - ts(p["started_at"]) for p in phases
                   if p["scenario"] == n and p["role"] == "reference")
        out[f"scenario {n}"] = end - starts[n] - mine
    out["shutdown (engine stop, summary)"] = (ended - last) if ended else 0.0
    out["report / exit"] = t_exit - (ended or t_exit)
    in_phases = sum(ts(p["ended_at"]) - ts(p["started_at"]) for p in phases)
    out["  of which between phases (records, checks, manifest writes)"] = (last - first) - in_phases
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--double", action="store_true",
                    help="attach to the fast engine double instead of launching the CPU engine")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="wait up to this many seconds for other vLLM engines to end first")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("harness_args", nargs="*",
                    help="ple-harness stress options (after --); default "
                         "--engine-profile profiles/cpu-ngram.toml")
    a = ap.parse_args(argv)
    if a.wait_quiet:
        wait_quiet(a.wait_quiet)
    info = machine()
    print_machine(info)
    hargs = list(a.harness_args)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ple-suite-")))
        if a.double:
            d = stack.enter_context(FastDouble())
            hargs = ["--url", d.url, *(hargs or ["--scenario", "transitions", "--vocab-size",
                                                  "600"])]
        elif not hargs:
            hargs = ["--engine-profile", "profiles/cpu-ngram.toml"]
        cmd = [sys.executable, "-m", "pleharness", "stress", *hargs, "--results-dir", str(tmp)]
        print("command:", " ".join(cmd[1:]))
        t_spawn = time.time()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.timeout,
                           env={**os.environ, "COLUMNS": "160"})
        t_exit = time.time()
        manifests = list(tmp.glob("*/manifest.json"))
        if not manifests:
            print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
            print(f"no manifest (exit {p.returncode})")
            return 1
        m = json.loads(manifests[0].read_text())
    total = t_exit - t_spawn
    parts = split(m, t_spawn, t_exit)
    print(f"exit code {p.returncode}, status {m['status']}, verdict {m['verdict']}; "
          f"{m['summary'].get('headline', '')}")
    print(f"{len(m['phases'])} phases, {m['requests_count']} requests")
    for k, v in parts.items():
        print(f"  {k:<64} {v:8.2f} s  {100 * v / total:5.1f} %")
    print(f"total_s {total:.1f}  (target <= 300 s: {'met' if total <= 300 else 'MISSED'})")
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "command": cmd[1:], "exit_code":
                                      p.returncode, "status": m["status"], "verdict": m["verdict"],
                                      "total_s": total, "split_s": parts,
                                      "phases": len(m["phases"]), "requests": m["requests_count"]},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
