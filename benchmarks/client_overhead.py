"""What the harness client sustains against an engine double that streams pre-made tokens instantly.

The double (``_fastdouble.py``, asyncio, in its own process so its CPU time is not counted) answers
every streamed completion at once with a cached SSE stream in vLLM's chunk layout (one token per
event). For each concurrency C it drives N requests

  - ``client``: a ThreadPoolExecutor(C) over ``EngineClient.complete`` (the request path alone);
  - ``run_phase``: one ``RunContext.run_phase`` of N requests (the path the scenarios use: watchdog,
    then per-request records, checks and the manifest write after the phase, timed separately);

and prints requests/s, streamed tokens/s, the harness's CPU ms per request (process CPU time, all
threads), the double's CPU ms per request and TCP connections opened per request. ``--profile``
adds a cProfile of sequential requests, bucketed by module (JSON decoding, requests, urllib3,
http.client, socket, the harness's own code). ``--prototype NAME`` repeats the ``client`` runs with a fix
of ``_prototypes.py`` monkeypatched in (keepalive, no_env_lookup, all).

Example: ``.venv/bin/python benchmarks/client_overhead.py --requests 2000 --profile --prototype all``
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import FastDouble, machine, print_machine  # noqa: E402
from _prototypes import PROTOTYPES  # noqa: E402


def counters(client) -> dict[str, int]:
    text = client.metrics_text() or ""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"fastdouble_(\w+)_total (\d+)", text)}


def prompts_for(n: int, length: int) -> list[list[int]]:
    # distinct prompts (the double caches each stream, so this costs it nothing after the first)
    return [[16 + (i * 7 + j) % 500 for j in range(length)] for i in range(min(n, 256))]


def run_client(client, prompts, n: int, c: int, max_tokens: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=c, thread_name_prefix="bench") as pool:
        futs = [pool.submit(client.complete, prompts[i % len(prompts)], max_tokens)
                for i in range(n)]
        outs = [f.result() for f in futs]
    return time.perf_counter() - t0, outs


def measure(label: str, fn, double, client, n: int, max_tokens: int) -> dict:
    before = counters(client)
    dcpu0, cpu0, t0 = double.cpu_s(), time.process_time(), time.perf_counter()
    wall_req, outs, extra = fn()
    wall_all = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    dcpu = double.cpu_s() - dcpu0
    after = counters(client)
    errors = sum(1 for o in outs if o.error is not None)
    tokens = sum(len(o.token_ids) for o in outs)
    r = {"label": label, "requests": n, "errors": errors, "tokens": tokens,
         "wall_s": wall_req, "wall_all_s": wall_all,
         "req_per_s": n / wall_req, "tok_per_s": tokens / wall_req,
         "cpu_ms_per_req": 1000 * cpu / n, "double_cpu_ms_per_req": 1000 * dcpu / n,
         "cpu_util": cpu / wall_all,
         "connections_per_req": (after.get("connections", 0) - before.get("connections", 0)) / n,
         **extra}
    assert tokens == n * max_tokens or errors, "short outputs without errors"
    print(f"{label:<28} {r['req_per_s']:8.1f} req/s {r['tok_per_s']:9.0f} tok/s  harness CPU "
          f"{r['cpu_ms_per_req']:.3f} ms/req ({100 * r['cpu_util']:.0f}% of a core)  double CPU "
          f"{r['double_cpu_ms_per_req']:.3f} ms/req  new conns/req "
          f"{r['connections_per_req']:.2f}  errors {errors}"
          + (f"  [record+checks+manifest {r['post_phase_ms']:.0f} ms]" if "post_phase_ms" in r
             else ""))
    return r


BUCKETS = [("json decoding", ("json/",)), ("requests", ("/requests/",)),
           ("urllib3", ("/urllib3/",)), ("http.client / email header parsing",
                                         ("http/client.py", "email/")),
           ("socket / selectors", ("socket.py", "selectors.py", "ssl.py")),
           ("harness client (pleharness/engine/client.py)", ("pleharness/engine/client.py",)),
           ("threading / queue", ("threading.py", "queue.py"))]


def profile(client, prompts, n: int, max_tokens: int) -> dict:
    pr = cProfile.Profile()
    pr.enable()
    for i in range(n):
        client.complete(prompts[i % len(prompts)], max_tokens)
    pr.disable()
    st = pstats.Stats(pr, stream=io.StringIO())
    total = 0.0
    per: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        total += tt
        name = "other (builtins: " + func + ")" if filename == "~" else None
        key = "other"
        for b, pats in BUCKETS:
            if any(p in filename for p in pats):
                key = b
                break
        if filename == "~":
            if "json" in func or "scanner" in func or "decode" in func:
                key = "json decoding"
            elif "socket" in func or "recv" in func or "sendall" in func or "connect" in func:
                key = "socket / selectors"
            else:
                key = "builtins (other)"
        del name
        per[key] = per.get(key, 0.0) + tt
    print(f"profile of {n} sequential requests x {max_tokens} tokens (cProfile inflates the "
          f"absolute times; shares matter): {1000 * total / n:.2f} ms/request")
    out = {}
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        out[k] = v / total
        print(f"  {k:<46} {100 * v / total:5.1f} %")
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(12)
    print("  top functions by own time:")
    for line in buf.getvalue().splitlines():
        if re.match(r"\s+\d", line):
            print("   " + line.strip()[:150])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per run (default 2000)")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--paths", default="client,run_phase", help="client and/or run_phase")
    ap.add_argument("--profile", action="store_true", help="cProfile of sequential requests")
    ap.add_argument("--prototype", action="append", default=[], choices=sorted(PROTOTYPES),
                    help="also run the client path with this fix of _prototypes.py monkeypatched "
                         "in (repeatable)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    from rich.console import Console

    from pleharness.checks import REGISTRY
    from pleharness.engine.client import EngineClient
    from pleharness.engine.facts import EngineFacts
    from pleharness.manifest import Manifest
    from pleharness.prompts import Prompt
    from pleharness.request import RequestSpec
    from pleharness.runner import RunContext

    info = machine()
    print_machine(info)
    cs = [int(x) for x in a.concurrency.split(",")]
    paths = a.paths.split(",")
    n, mt = a.requests, a.max_tokens
    prompts = prompts_for(n, a.prompt_len)
    print(f"{n} requests per run, prompt {a.prompt_len} IDs, {mt} tokens each (1 per SSE event)")
    results: dict = {"machine": info, "args": vars(a) | {"json": str(a.json)}, "runs": []}
    with FastDouble() as double, tempfile.TemporaryDirectory(prefix="ple-overhead-") as tmp:
        client = EngineClient(double.url)
        client.resolve_model()
        run_client(client, prompts, min(n, 50), 4, mt)  # warm-up (imports, code paths)
        for c in cs:
            if "client" in paths:
                results["runs"].append(measure(
                    f"client C={c}", lambda: (*run_client(client, prompts, n, c, mt), {}),
                    double, client, n, mt) | {"path": "client", "concurrency": c})
                for proto in a.prototype:
                    client_p = EngineClient(double.url, client.model)  # fresh sessions
                    with PROTOTYPES[proto]():
                        results["runs"].append(measure(
                            f"client+{proto} C={c}",
                            lambda: (*run_client(client_p, prompts, n, c, mt), {}),
                            double, client, n, mt) | {"path": f"client+{proto}",
                                                      "concurrency": c})
            if "run_phase" in paths:
                facts = EngineFacts()
                facts.set("vocab_size", 600, "double")
                ctx = RunContext(client, Manifest(run_id="overhead"), Path(tmp) / "manifest.json",
                                 facts, Console(file=io.StringIO()), check_registry=REGISTRY)
                ctx.scenario_name = "overhead"
                specs = [RequestSpec(Prompt(key=f"p{i}", ids=tuple(prompts[i % len(prompts)])),
                                     mt, compare=False) for i in range(n)]

                def phase():
                    t0 = time.perf_counter()
                    outs = ctx.run_phase(f"C{c}", c, specs)
                    total = time.perf_counter() - t0
                    wall = ctx.manifest.phases[-1].wall_s
                    return wall, [o.completion for o in outs], {
                        "post_phase_ms": 1000 * (total - wall)}

                results["runs"].append(measure(f"run_phase C={c}", phase, double, client, n, mt)
                                       | {"path": "run_phase", "concurrency": c})
        if a.profile:
            results["profile_shares"] = profile(client, prompts, min(n, 500), mt)
    print("summary: " + "; ".join(f"{r['label']}: {r['req_per_s']:.0f} req/s, "
                                  f"{r['tok_per_s']:.0f} tok/s, {r['cpu_ms_per_req']:.2f} CPU ms/req"
                                  for r in results["runs"]))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
