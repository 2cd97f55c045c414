"""What the harness client sustains against an engine double that streams pre-made tokens instantly.

The double (``_fastdouble.py``, asyncio, in its own process so its CPU time is not counted) answers
every streamed completion at once with a cached SSE stream in vLLM's chunk layout (one token per
event). For each concurrency C it drives N requests

  - ``client``: the request path alone, as ``RunContext.run_phase`` drives it: ``EngineClient.run_batch``
    of ``acomplete`` (asyncio, C in flight); with an older pleharness on the path (one without
    ``run_batch``, e.g. ``--pleharness /path/to/old/checkout``), a ThreadPoolExecutor(C) over ``complete``, which
    was that version's phase mechanism, so old and new are measured by the same script;
  - ``threads``: a ThreadPoolExecutor(C) over the blocking facade ``EngineClient.complete`` (what
    explain and custom ``issue`` functions use);
  - ``run_phase``: one ``RunContext.run_phase`` of N requests (the path the scenarios use: watchdog,
    then per-request records, checks and the manifest write after the phase, timed separately);

and prints requests/s, streamed tokens/s, the harness's CPU ms per request (process CPU time, all
threads), the double's CPU ms per request and TCP connections opened per request. ``--profile``
adds a cProfile of the thread that runs the requests (the client's event loop) during a batch at the
highest C, bucketed by module (JSON decoding, aiohttp, asyncio, socket, the harness's own code).
``--pin H,D`` pins the harness process to CPU H and the double to CPU D (``sched_setaffinity``, like
``taskset``), so each has one core of its own.

Example: ``.venv/bin/python benchmarks/client_overhead.py --requests 4000 --pin 0,1 --profile``
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _pleharness_from(argv: list[str]) -> None:
    """Import pleharness from ``--pleharness DIR`` (default: this checkout, not whatever the
    virtual environment has installed), before anything imports it."""
    root = Path(__file__).resolve().parent.parent
    for i, arg in enumerate(argv):
        if arg == "--pleharness" and i + 1 < len(argv):
            root = Path(argv[i + 1])
        elif arg.startswith("--pleharness="):
            root = Path(arg.split("=", 1)[1])
    sys.path.insert(0, str(root.resolve()))


_pleharness_from(sys.argv[1:])
from _common import FastDouble, machine, print_machine  # noqa: E402


def counters(client) -> dict[str, int]:
    text = client.metrics_text() or ""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"fastdouble_(\w+)_total (\d+)", text)}


def prompts_for(n: int, length: int) -> list[list[int]]:
    # distinct prompts (the double caches each stream, so this costs it nothing after the first)
    return [[16 + (i * 7 + j) % 500 for j in range(length)] for i in range(min(n, 256))]


def run_client(client, prompts, n: int, c: int, max_tokens: int) -> tuple[float, list]:
    """The phase mechanism of the loaded pleharness: run_batch of acomplete (asyncio), or a
    ThreadPoolExecutor over complete for a version without run_batch."""
    if not hasattr(client, "run_batch"):
        return run_threads(client, prompts, n, c, max_tokens)

    async def job(i):
        return await client.acomplete(prompts[i % len(prompts)], max_tokens)
    t0 = time.perf_counter()
    outs = client.run_batch(range(n), c, job).wait()
    return time.perf_counter() - t0, outs


def run_threads(client, prompts, n: int, c: int, max_tokens: int) -> tuple[float, list]:
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


BUCKETS = [("json decoding", ("json/", "orjson")), ("aiohttp", ("/aiohttp/",)),
           ("asyncio event loop", ("asyncio/",)), ("requests", ("/requests/",)),
           ("urllib3", ("/urllib3/",)), ("http.client / email header parsing",
                                         ("http/client.py", "email/")),
           ("socket / selectors", ("socket.py", "selectors.py", "ssl.py")),
           ("harness client (engine/client.py + rooms)",
            ("pleharness/engine/client.py", "pleharness/engine/completion.py",
             "pleharness/engine/streaming.py", "pleharness/engine/inflight.py")),
           ("threading / queue", ("threading.py", "queue.py"))]


def profile(client, prompts, n: int, max_tokens: int, c: int) -> dict:
    """cProfile of the thread doing the requests: the client's event loop during a batch at C
    (or, for a version without run_batch, sequential requests in this thread)."""
    pr = cProfile.Profile()
    if hasattr(client, "run_batch"):
        client._run(_call_async(pr.enable))
        run_client(client, prompts, n, c, max_tokens)
        client._run(_call_async(pr.disable))
        what = f"the client's event loop during {n} requests at C={c}"
    else:
        pr.enable()
        for i in range(n):
            client.complete(prompts[i % len(prompts)], max_tokens)
        pr.disable()
        what = f"{n} sequential requests"
    st = pstats.Stats(pr, stream=io.StringIO())
    total = 0.0
    per: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        total += tt
        key = "other"
        for b, pats in BUCKETS:
            if any(p in filename for p in pats):
                key = b
                break
        if filename == "~":
            if "json" in func or "scanner" in func or "decode" in func or "orjson" in func:
                key = "json decoding"
            elif any(w in func for w in ("socket", "recv", "send", "connect", "epoll", "select")):
                key = "socket / selectors"
            else:
                key = "builtins (other)"
        per[key] = per.get(key, 0.0) + tt
    print(f"profile of {what} x {max_tokens} tokens (cProfile inflates the absolute times; "
          f"shares matter): {1000 * total / n:.3f} ms/request")
    out = {}
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        out[k] = v / total
        print(f"  {k:<46} {100 * v / total:5.1f} %")
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(15)
    print("  top functions by own time:")
    for line in buf.getvalue().splitlines():
        if re.match(r"\s+\d", line):
            print("   " + line.strip()[:150])
    return out


async def _call_async(fn):
    fn()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per run (default 2000)")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--paths", default="client,run_phase",
                    help="comma-separated: client, threads, run_phase (default client,run_phase)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile of the request thread during a batch at the highest C")
    ap.add_argument("--pin", metavar="H,D",
                    help="pin the harness to CPU H and the double to CPU D (like taskset)")
    ap.add_argument("--pleharness", metavar="DIR",
                    help="repository whose pleharness to measure (default: this checkout; e.g. an "
                         "older checkout, for old-vs-new figures from the same script)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    from rich.console import Console

    from pleharness.checks import REGISTRY
    from pleharness.engine.client import EngineClient
    from pleharness.engine.facts import EngineFacts
    from pleharness.manifest import Manifest
    from pleharness.prompts import Prompt
    from pleharness.request import RequestSpec
    from pleharness.run.context import RunContext

    pin = None
    if a.pin:
        try:
            pin = [int(x) for x in a.pin.split(",")]
            assert len(pin) == 2
        except (ValueError, AssertionError):
            ap.error(f"--pin {a.pin!r}: expected two CPU numbers H,D")
        os.sched_setaffinity(0, {pin[0]})  # before any thread starts: they inherit it
    import pleharness
    impl = "asyncio (EngineClient.run_batch)" if hasattr(EngineClient, "run_batch") else \
        "threads (ThreadPoolExecutor over EngineClient.complete)"
    info = machine()
    print_machine(info)
    cs = [int(x) for x in a.concurrency.split(",")]
    paths = a.paths.split(",")
    n, mt = a.requests, a.max_tokens
    prompts = prompts_for(n, a.prompt_len)
    print(f"pleharness from {Path(pleharness.__file__).parent}; client path: {impl}")
    print(f"{n} requests per run, prompt {a.prompt_len} IDs, {mt} tokens each (1 per SSE event)"
          + (f"; harness on CPU {pin[0]}, double on CPU {pin[1]}" if pin else ""))
    results: dict = {"machine": info, "args": vars(a) | {"json": str(a.json)},
                     "pleharness": str(Path(pleharness.__file__).parent), "client_impl": impl,
                     "load_average": os.getloadavg(), "runs": []}
    with FastDouble() as double, tempfile.TemporaryDirectory(prefix="ple-overhead-") as tmp:
        if pin:
            os.sched_setaffinity(double.proc.pid, {pin[1]})
        client = EngineClient(double.url)
        client.resolve_model()
        run_client(client, prompts, min(n, 50), 4, mt)  # warm-up (imports, code paths)
        for c in cs:
            if "client" in paths:
                results["runs"].append(measure(
                    f"client C={c}", lambda: (*run_client(client, prompts, n, c, mt), {}),
                    double, client, n, mt) | {"path": "client", "concurrency": c})
            if "threads" in paths:
                results["runs"].append(measure(
                    f"threads C={c}", lambda: (*run_threads(client, prompts, n, c, mt), {}),
                    double, client, n, mt) | {"path": "threads", "concurrency": c})
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
            results["profile_shares"] = profile(client, prompts, min(n, 2000), mt,
                                                max(cs))
    results["load_average_after"] = os.getloadavg()
    print(f"load average before / after: {results['load_average'][0]:.2f} / "
          f"{results['load_average_after'][0]:.2f}")
    print("summary: " + "; ".join(f"{r['label']}: {r['req_per_s']:.0f} req/s, "
                                  f"{r['tok_per_s']:.0f} tok/s, {r['cpu_ms_per_req']:.2f} CPU ms/req"
                                  for r in results["runs"]))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
