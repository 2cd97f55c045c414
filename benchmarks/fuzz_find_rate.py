"""How often `ple-harness fuzz` finds a planted corruption, and how fast it runs on the CPU engine.

One real CPU engine (embedded model, profiles/cpu-ngram.toml: q = 4, B = 32, C = 256,
max_num_seqs 8), started here or attached with --upstream. Three parts:

1. ``clean``: fuzz against the engine itself, --max-examples CLEAN (must pass: no false alarm);
   seconds per example.
2. ``seeds``: for each seed, a fresh forwarding double that plants one fault; fuzz --no-shrink
   --max-examples BUDGET; found or not, examples to the first failure. ``--fault crowded``
   (default; tests/doubles.py CorruptWhenCrowded): only streamed completions of length
   n*C + q = 260 while >= 3 requests are in flight. ``--fault insert`` (CorruptInserted): only
   requests that arrive while a streamed decode has streamed >= INSERT_AT (24) tokens, i.e. a
   prefill inserted into a running decode past position 24 (default --max-drawn-tokens 12 < 24: only a
   drawn carrier decode gets there).
3. ``shrink``: one seed with shrinking (--shrink-budget), then the repro.toml replayed with
   `ple-harness stress --scenario repro.toml` through a fresh double (must fail) and straight
   against the engine (must pass).

Prints one JSON line per result and a summary; --out writes them all to a JSON file.

    .venv/bin/python benchmarks/fuzz_find_rate.py --seeds 10 --budget 200 --clean 100
    .venv/bin/python benchmarks/fuzz_find_rate.py --fault insert --parts seeds,shrink --clean 0
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # this checkout's pleharness

from conftest import load_json, run_cli  # noqa: E402
from doubles import CorruptInserted, CorruptWhenCrowded, FaultProxy  # noqa: E402

C, B, K, VOCAB = 256, 32, 3, 793
TARGET = C + 1 + K  # n*C + q with n = 1
INSERT_AT = 24  # the insert fault: arrives while a streamed decode is past this many tokens
FACTS = ["--block-size", str(B), "--chunk-size", str(C), "--num-speculative-tokens", str(K),
         "--max-num-seqs", "8"]


def fuzz(url: str, out: Path, run_id: str, *args: str) -> tuple[int, dict]:
    r = run_cli("fuzz", "--url", url, "--results-dir", str(out), "--run-id", run_id, *FACTS,
                "--no-golden", *args, timeout=3600)
    m = load_json(out / run_id / "manifest.json")
    return r.returncode, m


def faulty_proxy(upstream: str, kind: str = "crowded") -> tuple[FaultProxy, object]:
    fault = CorruptInserted(INSERT_AT, VOCAB) if kind == "insert" else \
        CorruptWhenCrowded(TARGET, 3, VOCAB)
    proxy = FaultProxy(upstream, fault)
    fault.proxy = proxy
    return proxy, fault


def emit(results: list, row: dict) -> None:
    results.append(row)
    print(json.dumps(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", help="attach to this CPU engine (default: launch one)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=200, help="max examples per seed")
    ap.add_argument("--clean", type=int, default=100, help="examples of the clean run (0: skip)")
    ap.add_argument("--shrink-budget", type=float, default=600.0, help="0: skip the shrink part")
    ap.add_argument("--parts", default="clean,seeds,shrink")
    ap.add_argument("--fault", choices=["crowded", "insert"], default="crowded")
    ap.add_argument("--results-dir", default=str(ROOT / "results" / "fuzz-bench"))
    ap.add_argument("--out", help="write every result to this JSON file")
    a = ap.parse_args()
    out = Path(a.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: list[dict] = []
    srv = None
    if a.upstream:
        upstream = a.upstream
    else:
        from pleharness.engine.launch import EngineServer, LaunchSpec
        from pleharness.model import SERVED_NAME, ensure_embedded_model
        from pleharness.profile import load_profile
        prof = load_profile(ROOT / "profiles" / "cpu-ngram.toml")
        spec = LaunchSpec(model=str(ensure_embedded_model(sys.executable)), python=sys.executable,
                          engine_args=prof.engine_args, env=prof.env,
                          served_model_name=SERVED_NAME)
        srv = EngineServer(spec, out / f"engine-{stamp}", start_timeout_s=900)
        srv.start()
        upstream = srv.url
    parts = set(a.parts.split(","))
    try:
        if "clean" in parts and a.clean:
            t0 = time.monotonic()
            rc, m = fuzz(upstream, out, f"clean-{stamp}", "--max-examples", str(a.clean),
                         "--seed", "0")
            s = m["tables"]["fuzz_summary"][0]
            emit(results, {"part": "clean", "exit": rc, "examples": s["examples_run"],
                           "failing": s["failing_examples"], "s_per_example": s["s_per_example"],
                           "wall_s": round(time.monotonic() - t0, 1),
                           "near_ties": m["summary"].get("near_ties")})
        if "seeds" in parts:
            for sd in range(a.first_seed, a.first_seed + a.seeds):
                proxy, fault = faulty_proxy(upstream, a.fault)
                t0 = time.monotonic()
                with proxy:
                    rc, m = fuzz(proxy.url, out, f"{a.fault}-seed{sd}-{stamp}", "--max-examples",
                                 str(a.budget), "--seed", str(sd), "--no-shrink")
                s = m["tables"]["fuzz_summary"][0]
                emit(results, {"part": "seed", "fault": a.fault, "seed": sd, "exit": rc,
                               "found": s["examples_to_failure"] is not None,
                               "examples_to_failure": s["examples_to_failure"],
                               "examples_run": s["examples_run"],
                               "s_per_example": s["s_per_example"],
                               "first_failing": s["minimal_schedule"],
                               "double_hits": len(fault.hits),
                               "wall_s": round(time.monotonic() - t0, 1)})
        if "shrink" in parts and a.shrink_budget:
            sd = a.first_seed
            proxy, fault = faulty_proxy(upstream, a.fault)
            run = f"{a.fault}-shrink{sd}-{stamp}"
            t0 = time.monotonic()
            with proxy:
                rc, m = fuzz(proxy.url, out, run, "--max-examples", str(a.budget), "--seed",
                             str(sd), "--shrink-budget", str(a.shrink_budget))
            s = m["tables"]["fuzz_summary"][0]
            row = {"part": "shrink", "fault": a.fault, "seed": sd, "exit": rc,
                   "minimal": s["minimal_schedule"],
                   "failing_rows": m["tables"].get("fuzz_failing"),
                   "shrink_steps": len(m["tables"]["fuzz_shrink_steps"]),
                   "examples_run": s["examples_run"], "confirmed": s["confirmed"],
                   "wall_s": round(time.monotonic() - t0, 1)}
            repro = out / run / "repro.toml"
            if repro.exists():
                proxy2, _ = faulty_proxy(upstream, a.fault)
                with proxy2:
                    r = run_cli("stress", "--url", proxy2.url, "--scenario", str(repro),
                                "--results-dir", str(out), "--run-id", run + "-replay", *FACTS,
                                "--no-golden", timeout=1800)
                row["replay_through_double_exit"] = r.returncode
                r = run_cli("stress", "--url", upstream, "--scenario", str(repro),
                            "--results-dir", str(out), "--run-id", run + "-replay-clean", *FACTS,
                            "--no-golden", timeout=1800)
                row["replay_clean_exit"] = r.returncode
            emit(results, row)
    finally:
        if srv is not None:
            srv.stop()
    seeds = [r for r in results if r["part"] == "seed"]
    if seeds:
        found = [r["examples_to_failure"] for r in seeds if r["found"]]
        print(json.dumps({"summary": True, "fault": a.fault, "seeds": len(seeds),
                          "found": len(found),
                          "median_examples_to_failure": statistics.median(found) if found
                          else None, "budget": a.budget}), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
