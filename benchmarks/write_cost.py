"""Cost of the write after one phase, at a given run length, for three ways of writing a run.

A run of P phases of R requests each is built in memory (records as the double's runs produce
them: four check results each); then, for P in --phases, the write after phase P is timed
(median of --repeats, each into a fresh folder that already holds the earlier writes):

  - ``inline``: schema version 1, every record inside manifest.json, the whole file rewritten;
  - ``append``: records appended to requests.jsonl, the manifest (phases, no records) rewritten
    with every phase serialized again;
  - ``append+cache``: what ``write_manifest`` does: as ``append``, reusing the JSON of phases
    older than the last 8.

All three run in one process, interleaved, so a busy machine slows them alike; the growth
exponent k of the write time ~ P^k between the smallest and largest P says how the cost of a
write grows with the run (0: constant).

Example: ``.venv/bin/python benchmarks/write_cost.py --phases 20,200,2000``
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, print_machine  # noqa: E402

sys.path.insert(0, str(ROOT))
from pleharness import manifest as M  # noqa: E402


def build(phases: int, per_phase: int) -> M.Manifest:
    m = M.Manifest(run_id="write-cost")
    n = 0
    for p in range(phases):
        m.phases.append(M.PhaseRecord(index=p, name=f"r1-s{p}-C25", scenario="transitions",
                                      concurrency=25, requests=per_phase, matched=per_phase,
                                      wall_s=0.5, completion_tokens=16 * per_phase,
                                      checks=[M.CheckResult(name="health_after_phase",
                                                            status="pass")]))
        for _ in range(per_phase):
            n += 1
            m.requests.append(M.RequestRecord(
                id=f"r{n:05d}", scenario="transitions", phase=f"r1-s{p}-C25", concurrency=25,
                prompt_key=f"p{n % 8}-len{5 + n % 300}", prompt_len=5 + n % 300,
                prompt_hash=f"{n:064x}", max_tokens=16, output_hash=f"{n + 1:064x}",
                output_len=16, reference_hash=f"{n + 1:064x}", match=True, finish_reason="length",
                prompt_tokens=5 + n % 300, completion_tokens=16, ttft_s=0.012, latency_s=0.05,
                http_status=200, checks=[M.CheckResult(name=c, status="pass") for c in
                                         ("vocab_range", "usage", "logprob_sanity",
                                          "degeneration")]))
    return m


def inline_json(m: M.Manifest) -> str:
    """Schema version 1's file: the manifest with every record inline."""
    return (m.model_dump_json()[:-1] + ',"requests":['
            + ",".join(r.model_dump_json() for r in m.requests) + "]}")


def time_write(how: str, full: M.Manifest, phases: int, per_phase: int, folder: Path) -> float:
    """Seconds for the write after phase ``phases`` (the earlier writes done untimed)."""
    m = full.model_copy()
    m.phases = full.phases[:phases - 1]
    m.requests = full.requests[:(phases - 1) * per_phase]
    path = folder / "manifest.json"
    if how == "inline":
        M.write_atomic(path, inline_json(m))
    else:
        M.write_manifest(path, m)
        if how == "append":
            m._phase_json = []
    m.phases = full.phases[:phases]
    m.requests = full.requests[:phases * per_phase]
    t0 = time.perf_counter()
    if how == "inline":
        M.write_atomic(path, inline_json(m))
    elif how == "append":
        m._phase_json = []  # every phase serialized again
        M.write_manifest(path, m)
    else:
        M.write_manifest(path, m)
    return time.perf_counter() - t0


def exponent(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2 or min(ys) <= 0:
        return None
    return math.log(ys[-1] / ys[0]) / math.log(xs[-1] / xs[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", default="20,200,2000", help="run lengths in phases (comma list)")
    ap.add_argument("--per-phase", type=int, default=50, help="requests per phase")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    info = machine()
    print_machine(info)
    sizes = [int(x) for x in a.phases.split(",")]
    full = build(max(sizes), a.per_phase)
    hows = ("inline", "append", "append+cache")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ple-write-cost-") as tmp:
        for p in sizes:
            times: dict[str, list[float]] = {h: [] for h in hows}
            for i in range(a.repeats):
                for h in hows:  # interleaved: load affects all three alike
                    d = Path(tmp) / f"{h}-{p}-{i}"
                    d.mkdir()
                    times[h].append(time_write(h, full, p, a.per_phase, d))
            row = {"phases": p, "requests": p * a.per_phase,
                   **{f"{h}_ms": 1000 * statistics.median(times[h]) for h in hows}}
            rows.append(row)
            print(f"P={p:>5} ({p * a.per_phase} requests): write after the last phase "
                  + ", ".join(f"{h} {row[h + '_ms']:.2f} ms" for h in hows))
    ks = {h: exponent(sizes, [r[f"{h}_ms"] for r in rows]) for h in hows}
    print("growth exponent k (write time ~ P^k, smallest to largest P): " + ", ".join(
        f"{h} {k:.2f}" if k is not None else f"{h} -" for h, k in ks.items()))
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "args": vars(a) | {"json": str(a.json)},
                                      "rows": rows, "growth_exponents": ks}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
