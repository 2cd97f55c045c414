"""Harness request path vs vLLM's benchmark client on ONE real CPU engine, alternating A B A B.

The same workload (N token-ID prompts of one fixed length, fixed max_tokens, ignore_eos, greedy,
``return_token_ids`` on, at most C requests in flight) is driven

  A. through the harness's own path: ``pleharness.run.context.RunContext.run_phase`` (``EngineClient.run_batch``:
     C requests in flight on the client's asyncio event loop, with the phase watchdog), and its figures are
     the phase record's ``decode_tok_per_s`` and ``ttft_s_median``;
  B. through ``vllm.benchmarks.serve.benchmark`` (aiohttp + asyncio, ``--max-concurrency C``,
     request rate inf), figures ``output_throughput`` and ``median_ttft_ms``.

For each C: one unreported warm-up of each client, then ``--pairs`` pairs (A then B). Both clients
send the same prompts every run, so the prefix cache is equally warm for both. Prints one line per
run and per pair the ratio harness/vLLM of output tok/s, then the median ratio per C; with
``--json`` writes everything to a file.

``--prototype all`` adds a third arm per pair (A, A', B): the harness path with the client fixes of
``_prototypes.py`` monkeypatched in (connection keep-alive, no per-request environment scan).

Example: ``.venv/bin/python benchmarks/vs_vllm_bench.py --pairs 3 --concurrency 1,4,8``
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (fmt, launch_engine, machine, other_engines, print_machine,  # noqa: E402
                     vocab_size, wait_quiet)
from _prototypes import PROTOTYPES  # noqa: E402


def make_prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(16, vocab) for _ in range(length)] for _ in range(n)]


class HarnessDriver:
    """Runs phases through RunContext.run_phase, exactly as the scenarios do."""

    def __init__(self, url: str, model: str, work: Path, server=None):
        from rich.console import Console

        from pleharness.checks import REGISTRY
        from pleharness.engine.client import EngineClient
        from pleharness.engine.facts import EngineFacts
        from pleharness.manifest import Manifest
        from pleharness.run.context import RunContext, RunOptions

        client = EngineClient(url, model)
        client.resolve_model()
        facts = EngineFacts()
        facts.set("vocab_size", vocab_size(), "config.json")
        self.ctx = RunContext(client, Manifest(run_id="bench"), work / "manifest.json", facts,
                              Console(file=io.StringIO()), server=server, progress=None,
                              check_registry=REGISTRY,
                              # the same workload as vLLM's client: no logprobs (the stress
                              # default asks for top-2 logprobs for near-tie analysis, which costs
                              # the engine and the wire extra work)
                              options=RunOptions(logprobs=None))
        self.ctx.scenario_name = "bench"
        self.n = 0

    def run(self, prompts: list[list[int]], max_tokens: int, c: int) -> dict:
        from pleharness.prompts import Prompt
        from pleharness.request import RequestSpec

        self.n += 1
        specs = [RequestSpec(Prompt(key=f"b{i}", ids=tuple(p)), max_tokens, compare=False)
                 for i, p in enumerate(prompts)]
        outs = self.ctx.run_phase(f"bench{self.n}-C{c}", c, specs)
        ph = self.ctx.manifest.phases[-1]
        return {"tok_s": ph.decode_tok_per_s, "ttft_s": ph.ttft_s_median, "wall_s": ph.wall_s,
                "tokens": ph.completion_tokens,
                "errors": sum(1 for o in outs if o.completion.error is not None)}


def vllm_run(url: str, model: str, prompts: list[list[int]], max_tokens: int, c: int) -> dict:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    reqs = [SampleRequest(prompt=list(p), prompt_len=len(p), expected_output_len=max_tokens)
            for p in prompts]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        r = asyncio.run(benchmark(
            task_type=TaskType.GENERATION, endpoint_type="openai",
            api_url=url + "/v1/completions", base_url=url, model_id=model, model_name=model,
            tokenizer=None, input_requests=reqs, logprobs=None, request_rate=float("inf"),
            burstiness=1.0, disable_tqdm=True, num_warmups=0, profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
            selected_percentiles=[50.0], ignore_eos=True, goodput_config_dict={},
            max_concurrency=c, lora_modules=None, extra_headers=None,
            # the harness always asks for greedy sampling and the output token IDs
            extra_body={"temperature": 0.0, "return_token_ids": True},
            ready_check_timeout_sec=0))
    # median_ttft_ms is only filled in when a tokenizer is given; it is the median over the
    # successful requests' ttfts, recomputed here
    ttfts = [t for t, e in zip(r["ttfts"], r["errors"]) if not e]
    return {"tok_s": r["output_throughput"],
            "ttft_s": statistics.median(ttfts) if ttfts else None,
            "wall_s": r["duration"], "tokens": r["total_output_tokens"],
            "errors": len(reqs) - r["completed"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="A/B pairs per concurrency (default 3)")
    ap.add_argument("--concurrency", default="1,4,8", help="comma list (default 1,4,8)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--url", help="attach to a running engine instead of launching one")
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="extra engine argument (= form), repeatable; base: --block-size 32")
    ap.add_argument("--no-warmup", action="store_true", help="skip the unreported warm-up runs")
    ap.add_argument("--prototype", choices=sorted(PROTOTYPES),
                    help="add a third arm per pair: the harness path with this fix of "
                         "_prototypes.py monkeypatched in (run A, A', B)")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="wait up to this many seconds for other vLLM engines to end first")
    ap.add_argument("--json", type=Path, help="write all figures to this JSON file")
    a = ap.parse_args(argv)
    cs = [int(x) for x in a.concurrency.split(",") if x.strip()]
    prompts = make_prompts(a.num_prompts, a.prompt_len, a.seed, vocab_size())
    print(f"workload: {a.num_prompts} prompts x {a.prompt_len} token IDs, max_tokens "
          f"{a.max_tokens}, ignore_eos, greedy, concurrency {cs}, {a.pairs} pair(s) each")
    t_import = time.monotonic()
    import vllm.benchmarks.serve  # noqa: F401  (slow import, kept out of the timed runs)
    print(f"imported vllm.benchmarks.serve in {time.monotonic() - t_import:.1f} s")

    if a.wait_quiet:
        wait_quiet(a.wait_quiet)
    with tempfile.TemporaryDirectory(prefix="ple-bench-") as tmp:
        work = Path(tmp)
        with contextlib.ExitStack() as stack:
            server = None
            if a.url:
                url = a.url.rstrip("/")
                from pleharness.engine.client import EngineClient
                model = EngineClient(url).resolve_model()
            else:
                server = launch_engine(work, ["--block-size", "32", *a.engine_arg])
                t0 = time.monotonic()
                stack.enter_context(server)
                url, model = server.url, server.model_name
                print(f"engine ready after {time.monotonic() - t0:.1f} s at {url} "
                      f"(command: {' '.join(server.command[1:])})")
            mine = {server.proc.pid} if server else set()
            info = machine(mine)
            print_machine(info)
            if info["other_vllm_engines"]:
                print("WARNING: other vLLM engines are running:", *other_engines(mine), sep="\n  ")
            harness = HarnessDriver(url, model, work, server)
            fixed = HarnessDriver(url, model, work, server) if a.prototype else None
            results: dict = {"machine": info, "args": vars(a) | {"json": str(a.json)},
                             "by_concurrency": {}}
            for c in cs:
                if not a.no_warmup:
                    harness.run(prompts, a.max_tokens, c)
                    if fixed is not None:
                        with PROTOTYPES[a.prototype]():
                            fixed.run(prompts, a.max_tokens, c)
                    vllm_run(url, model, prompts, a.max_tokens, c)
                pairs = []
                for i in range(a.pairs):
                    ra = harness.run(prompts, a.max_tokens, c)
                    rf = None
                    if fixed is not None:
                        with PROTOTYPES[a.prototype]():
                            rf = fixed.run(prompts, a.max_tokens, c)
                    rb = vllm_run(url, model, prompts, a.max_tokens, c)
                    ratio = ra["tok_s"] / rb["tok_s"] if ra["tok_s"] and rb["tok_s"] else None
                    pairs.append({"harness": ra, "vllm": rb, "ratio": ratio})
                    if rf is not None:
                        pairs[-1]["harness_fixed"] = rf
                        pairs[-1]["ratio_fixed"] = rf["tok_s"] / rb["tok_s"]
                        print(f"C={c} pair {i + 1}: harness+{a.prototype} {fmt(rf['tok_s'], 1)} "
                              f"tok/s TTFT {fmt(rf['ttft_s'] * 1000, 1)} ms | ratio "
                              f"{fmt(pairs[-1]['ratio_fixed'], 3)}")
                    print(f"C={c} pair {i + 1}: harness {fmt(ra['tok_s'], 1)} tok/s TTFT "
                          f"{fmt(ra['ttft_s'] * 1000, 1)} ms ({ra['errors']} errors) | vllm "
                          f"{fmt(rb['tok_s'], 1)} tok/s TTFT {fmt(rb['ttft_s'] * 1000, 1)} ms "
                          f"({rb['errors']} errors) | ratio {fmt(ratio, 3)}")
                ratios = [p["ratio"] for p in pairs if p["ratio"] is not None]
                med = statistics.median(ratios) if ratios else None
                summary = {
                    "pairs": pairs, "median_ratio": med,
                    "harness_tok_s_median": statistics.median(p["harness"]["tok_s"] for p in pairs),
                    "vllm_tok_s_median": statistics.median(p["vllm"]["tok_s"] for p in pairs),
                    "harness_ttft_ms_median": 1000 * statistics.median(
                        p["harness"]["ttft_s"] for p in pairs),
                    "vllm_ttft_ms_median": 1000 * statistics.median(
                        p["vllm"]["ttft_s"] for p in pairs)}
                if fixed is not None:
                    summary["median_ratio_fixed"] = statistics.median(
                        p["ratio_fixed"] for p in pairs)
                    print(f"C={c} median ratio with {a.prototype}: "
                          f"{summary['median_ratio_fixed']:.3f}")
                results["by_concurrency"][str(c)] = summary
                print(f"C={c} median: harness {summary['harness_tok_s_median']:.1f} tok/s, vllm "
                      f"{summary['vllm_tok_s_median']:.1f} tok/s, TTFT "
                      f"{summary['harness_ttft_ms_median']:.1f} / "
                      f"{summary['vllm_ttft_ms_median']:.1f} ms; median ratio {fmt(med, 3)}")
            results["other_vllm_engines_at_end"] = len(other_engines(mine))
    print("summary: " + "; ".join(f"C={c} ratio {fmt(s['median_ratio'], 3)}"
                                  for c, s in results["by_concurrency"].items()))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
