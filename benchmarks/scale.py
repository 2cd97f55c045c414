"""How the harness scales with the number of requests in a run (10^2, 10^3, 10^4 by default).

For each size N it runs ``ple-harness stress --url <fast double> --scenario transitions
--vocab-size 600 --ladder C,C --repeats R --max-tokens T`` in a fresh child process (phases of
2*C requests; R chosen so that the run issues about N requests; plus 4 warm-up and 8 reference
requests), with ``write_manifest`` wrapped to time every manifest write. It reports

  - peak RSS of the harness process (``wait4`` rusage of that child alone),
  - manifest size and records file (``requests.jsonl``) size, in total and per request,
  - the time of the write after the last phase, the mean time per write, and all writes together
    (a write = append the new records to ``requests.jsonl`` + fsync, then replace the manifest),
  - the bytes written (manifest rewrites + records appended),
  - the wall time of the run,

and, across sizes, the growth exponent k of each figure ~ N^k (k = 1 linear, 2 quadratic). Since
schema version 2 the records are appended, not rewritten, so the write after a phase should cost
about the same at any N (k ~ 0) and all writes together grow linearly (k ~ 1). Schema version 1
rewrote every record after every phase: quadratic (k = 1.85, BENCHMARKS.md).

Example: ``.venv/bin/python benchmarks/scale.py --sizes 100,1000,10000``
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, FastDouble, machine, print_machine  # noqa: E402

sys.path.insert(0, str(ROOT))  # this tree's pleharness (as the child runs it), not an installed one

CHILD = r"""
import json, os, sys, time
import pleharness.manifest as M, pleharness.run.context as R, pleharness.stress as S
log = open(sys.argv[1], "w")
orig = M.write_manifest
def timed(path, m):
    rpath = os.path.join(os.path.dirname(path), M.requests_file_name(path))
    before = os.path.getsize(rpath) if os.path.exists(rpath) else 0
    t0 = time.perf_counter()
    orig(path, m)
    s = time.perf_counter() - t0
    appended = os.path.getsize(rpath) - before
    log.write(json.dumps({"s": s, "requests": len(m.requests), "phases": len(m.phases),
                          "bytes": os.path.getsize(path) + max(0, appended)}) + "\n")
    log.flush()
R.write_manifest = S.write_manifest = timed
from pleharness.cli import run
sys.argv = ["ple-harness", *sys.argv[2:]]
run()
"""

WARMUP_AND_REFS = 12  # transitions: 4 warm-up + 8 reference requests


def one(url: str, n: int, c: int, max_tokens: int, work: Path) -> dict:
    per_repeat = 2 * (2 * c)  # ladder C,C; each phase issues 2*C requests
    repeats = max(1, round((n - WARMUP_AND_REFS) / per_repeat))
    log = work / f"writes-{n}.jsonl"
    args = ["stress", "--url", url, "--scenario", "transitions", "--vocab-size", "600",
            "--ladder", f"{c},{c}", "--repeats", str(repeats), "--max-tokens", str(max_tokens),
            "--results-dir", str(work / f"run-{n}")]
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(log), *args], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "COLUMNS": "160"})
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read()
    p.stderr.close()
    writes = [json.loads(x) for x in log.read_text().splitlines()]
    manifest = next((work / f"run-{n}").glob("*/manifest.json"))
    m = json.loads(manifest.read_text())
    records = manifest.parent / m["requests_file"]
    reqs = m["requests_count"]
    phase_writes = [w for w in writes if w["phases"] > 0]
    last_phase_write = phase_writes[-1]["s"] if phase_writes else float("nan")
    out = {"target_n": n, "requests": reqs, "phases": len(m["phases"]), "exit_code": p.returncode,
           "verdict": m.get("verdict"), "wall_s": wall, "peak_rss_mib": ru.ru_maxrss / 1024,
           "manifest_bytes": manifest.stat().st_size,
           "manifest_bytes_per_request": manifest.stat().st_size / max(1, reqs),
           "records_bytes": records.stat().st_size,
           "records_bytes_per_request": records.stat().st_size / max(1, reqs),
           "writes": len(writes), "write_total_s": sum(w["s"] for w in writes),
           "write_mean_s": sum(w["s"] for w in phase_writes) / max(1, len(phase_writes)),
           "last_phase_write_s": last_phase_write,
           "bytes_written_total": sum(w["bytes"] for w in writes),
           "harness_cpu_s": ru.ru_utime + ru.ru_stime}
    out["write_share_of_wall"] = out["write_total_s"] / wall
    if p.returncode not in (0, 1):
        print(err[-2000:])
    # serialization vs disk: redo the final write's two steps once in this process
    from pleharness.manifest import load_manifest, write_atomic
    mm = load_manifest(manifest)
    t1 = time.perf_counter()
    text = mm.model_dump_json()
    t2 = time.perf_counter()
    write_atomic(work / "probe.json", text)
    t3 = time.perf_counter()
    out["final_serialize_s"], out["final_write_fsync_s"] = t2 - t1, t3 - t2
    return out


def exponent(xs: list[float], ys: list[float]) -> float | None:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="request counts (comma list)")
    ap.add_argument("--concurrency", type=int, default=25,
                    help="ladder C,C: phases of 2*C requests (default 25: 50 per phase)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    info = machine()
    print_machine(info)
    sizes = [int(x) for x in a.sizes.split(",")]
    rows = []
    with FastDouble() as d, tempfile.TemporaryDirectory(prefix="ple-scale-") as tmp:
        for n in sizes:
            r = one(d.url, n, a.concurrency, a.max_tokens, Path(tmp))
            rows.append(r)
            print(f"N={r['requests']:>6} ({r['phases']} phases, exit {r['exit_code']}, "
                  f"{r['verdict']}): wall {r['wall_s']:.1f} s, peak RSS "
                  f"{r['peak_rss_mib']:.0f} MiB, manifest {r['manifest_bytes'] / 1e6:.2f} MB "
                  f"({r['manifest_bytes_per_request']:.0f} B/request), records "
                  f"{r['records_bytes'] / 1e6:.2f} MB ({r['records_bytes_per_request']:.0f} "
                  f"B/request), write per phase {1000 * r['write_mean_s']:.2f} ms mean, last "
                  f"{1000 * r['last_phase_write_s']:.1f} ms (serialize "
                  f"{1000 * r['final_serialize_s']:.1f} + write/fsync "
                  f"{1000 * r['final_write_fsync_s']:.1f} ms), all {r['writes']} writes "
                  f"{r['write_total_s']:.2f} s = {100 * r['write_share_of_wall']:.0f} % of wall, "
                  f"{r['bytes_written_total'] / 1e6:.1f} MB written")
    ns = [r["requests"] for r in rows]
    growth = {k: exponent(ns, [r[k] for r in rows]) for k in
              ("peak_rss_mib", "manifest_bytes", "records_bytes", "write_mean_s",
               "last_phase_write_s", "write_total_s", "bytes_written_total", "wall_s")}
    print("growth exponent k (figure ~ N^k, fit over all sizes): " + ", ".join(
        f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in growth.items()))
    # fixed costs hide the growth at small N: the exponent between the two largest sizes
    local = {k: exponent(ns[-2:], [r[k] for r in rows[-2:]]) for k in growth}
    print("growth exponent between the two largest sizes: " + ", ".join(
        f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in local.items()))
    if local["write_total_s"] is not None:
        verdict = "quadratically" if local["write_total_s"] > 1.5 else "about linearly"
        print(f"total write time grows {verdict} with the number of requests "
              f"(k = {local['write_total_s']:.2f}; bytes written k = "
              f"{local['bytes_written_total']:.2f}; mean write per phase k = "
              f"{local['write_mean_s']:.2f})")
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "args": vars(a) | {"json": str(a.json)},
                                      "rows": rows, "growth_exponents": growth,
                                      "growth_exponents_largest_two": local}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
