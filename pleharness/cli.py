"""Command-line interface (typer). Thin: parses options and calls the job modules.

Exit codes: 0 pass; 1 parity/check failure; 2 usage error; 3 engine failed to start or died;
130 / 143 interrupted (SIGINT / SIGTERM).
"""
from __future__ import annotations


import sys
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from . import __version__
from .engine.client import Timeouts
from .engine.errors import HarnessError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Validation and stress-test harness for patched vLLM engines: launches the "
                       "engine, runs scenarios, compares every output's token IDs (SHA256) with a "
                       "single-request reference, and writes a results manifest with a verdict.")
console = Console(width=None if sys.stdout.isatty() else 160)


def _version(value: bool):
    if value:
        print(f"ple-harness {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False):
    pass


def _parse_ladder(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(">", ",").replace("C", "").split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--ladder {text!r}: expected comma-separated concurrency levels, "
                         "e.g. 4,3,2,1") from None


def _parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        if "=" not in it:
            raise UsageError(f"--engine-env {it!r}: expected NAME=VALUE")
        k, v = it.split("=", 1)
        out[k] = v
    return out


FACT_HELP = "Engine fact for boundary lengths when attaching with --url (launches know it)."


@app.command()
def stress(
    model: Annotated[Optional[str], typer.Option(help="Local model path to serve. Default: the "
                                                 "embedded tiny model (built and cached on first use).")] = None,
    url: Annotated[Optional[str], typer.Option(help="Attach to a running server at this base URL "
                                               "instead of launching one (e.g. http://127.0.0.1:8000).")] = None,
    engine_profile: Annotated[Optional[Path], typer.Option(
        help="TOML engine profile (model, python, tp, engine_args, [env]); flags override it.")] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", min=1, help="Tensor-parallel size "
                                              "(--tensor-parallel-size of the launched engine).")] = None,
    engine_python: Annotated[Optional[str], typer.Option(help="Python that has vLLM installed. "
                                                         "Default: this Python.")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(
        help="Extra argument for the engine server, repeatable; use the = form for values: "
             "--engine-arg --max-num-seqs=8. Appended last, so it overrides defaults.")] = None,
    engine_env: Annotated[Optional[list[str]], typer.Option(
        help="NAME=VALUE environment variable for the engine, repeatable.")] = None,
    scenario: Annotated[Optional[list[str]], typer.Option(
        help="Scenario name (shipped, see `ple-harness scenarios`) or TOML path; repeatable. "
             "Default: transitions, boundary, pairs, insert.")] = None,
    ladder: Annotated[Optional[str], typer.Option(help="Override the concurrency ladder, "
                                                  "e.g. 4,3,2,1,2,3,4,1.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Override how often the ladder repeats.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Override max_tokens per request.")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where run folders are created.")] = Path("results"),
    run_id: Annotated[Optional[str], typer.Option(help="Name of the run folder (must not exist). "
                                                  "Default: timestamp + random suffix.")] = None,
    host: Annotated[Optional[str], typer.Option(help="Listen address of a launched engine "
                                                "(default 127.0.0.1).")] = None,
    port: Annotated[Optional[int], typer.Option(min=1, max=65535, help="Listen port of a launched engine "
                                                "(default: a free port).")] = None,
    start_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for the engine to become "
                                                 "ready.")] = 900.0,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name to request "
                                                             "(default: as the server lists it).")] = None,
    block_size: Annotated[Optional[int], typer.Option(min=1, help="KV block size B. " + FACT_HELP)] = None,
    chunk_size: Annotated[Optional[int], typer.Option(min=1,
        help="Chunked-prefill budget C (max_num_batched_tokens). " + FACT_HELP)] = None,
    num_speculative_tokens: Annotated[Optional[int], typer.Option(min=0,
        help="Speculative tokens k (q = 1 + k). " + FACT_HELP)] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(min=1, help="max_num_seqs. " + FACT_HELP)] = None,
    max_model_len: Annotated[Optional[int], typer.Option(min=1, help="max_model_len M. " + FACT_HELP)] = None,
    vocab_size: Annotated[Optional[int], typer.Option(min=1, help="Vocabulary size V. " + FACT_HELP)] = None,
    dtype: Annotated[Optional[str], typer.Option(
        help="Serving dtype (bfloat16, float16, float32): sets the default near-tie threshold. "
             + FACT_HELP)] = None,
    api_key_env: Annotated[Optional[str], typer.Option(
        help="Name of an environment variable holding an API key: sent as a Bearer token and "
             "given to a launched engine (VLLM_API_KEY); never written anywhere.")] = None,
    connect_timeout: Annotated[float, typer.Option(min=0.1, max=86400, help="Seconds to connect.")] = 10.0,
    first_token_timeout: Annotated[float, typer.Option(
        min=0.1, max=86400, help="Seconds from sending a request to its first token.")] = 300.0,
    between_tokens_timeout: Annotated[float, typer.Option(
        min=0.1, max=86400, help="Longest gap between two streamed tokens, seconds.")] = 120.0,
    request_timeout: Annotated[float, typer.Option(min=0.1, max=604800,
                                                   help="Longest whole request, seconds.")] = 1800.0,
    on_timeout: Annotated[str, typer.Option(
        help="After a phase with timed-out requests (recorded as 'timeout', the phase fails): "
             "'continue' with the next phase, or 'abort' the run (status incomplete).")] = "continue",
    reference: Annotated[str, typer.Option(
        help="Where single-request references come from: 'solo' (this engine, one request at a "
             "time, before the load), 'engine' (a second launch with --reference-engine-arg, run "
             "first and stopped), 'golden' (transformers in float32 on the same weights: an "
             "implementation independent of vLLM; the engine's own solo runs are compared with "
             "it too), or 'manifest:PATH' (a previous run's references).")] = "solo",
    control_engine_arg: Annotated[Optional[list[str]], typer.Option(
        help="Control run: after the engine under test, launch a control engine with its "
             "arguments plus this one (repeatable, = form), run the same suite, and classify "
             "each divergence as also_in_control (engine numerics, a warning) or only_under_test, "
             "e.g. --control-engine-arg=--enforce-eager. See docs/attribution.md.")] = None,
    control_drop_arg: Annotated[Optional[list[str]], typer.Option(
        help="Control run: remove this flag (and its value) from the engine's arguments, e.g. "
             "--control-drop-arg=--speculative-config (repeatable).")] = None,
    control_profile: Annotated[Optional[Path], typer.Option(
        help="Control run: the control engine's own profile (engine_args and env).")] = None,
    golden: Annotated[bool, typer.Option(
        help="Classify each divergence with the golden model (transformers float32, started on "
             "the first divergence) when the model is a local folder that fits in memory: "
             "teacher-forced logprobs decide near tie vs hard.")] = True,
    golden_model: Annotated[Optional[str], typer.Option(
        help="Model folder for the golden model when attaching with --url (default: the served "
             "model's root, when it is a local folder).")] = None,
    reference_engine_arg: Annotated[Optional[list[str]], typer.Option(
        help="Argument of the reference engine (--reference engine), repeatable, e.g. "
             "--reference-engine-arg=--enforce-eager.")] = None,
    reference_cache_state: Annotated[str, typer.Option(
        help="'warm' (default): run each reference prompt alone twice, judge the second "
             "(prefix-cached) run against the first, keep the second; 'cold': keep the first "
             "run.")] = "warm",
    repeat: Annotated[int, typer.Option(min=1, help="Run the whole suite N times on one engine; "
                                        "throughput is reported as median/min/max over repeats.")] = 1,
    logprobs: Annotated[int, typer.Option(min=0, max=20, help="Top-k logprobs per output token (needed "
                                          "for near-tie analysis; 0 = off).")] = 2,
    near_tie_nats: Annotated[Optional[float], typer.Option(min=0.0,
        help="A divergence whose top-1/top-2 gap is below this (nats) is a near tie (warning), "
             "else hard (failure). Default: from the serving dtype: bfloat16 0.5, float16 "
             "0.0625, float32 0.01 (see pleharness/divergence.py).")] = None,
    strict: Annotated[bool, typer.Option(help="Any divergence fails, near ties too (for "
                                         "batch-invariant engines).")] = False,
    suite: Annotated[Optional[str], typer.Option(
        help="A suite file (name in scenarios/suites/ or path): scenarios with parameters, "
             "repeats and compare gates, e.g. nightly or premerge.")] = None,
):
    """Launch (or attach to) a vLLM server and run the stress scenarios against it."""
    from .profile import EngineProfile, load_profile
    from .stress import DEFAULT_SCENARIOS, StressConfig, run_stress

    prof = load_profile(engine_profile) if engine_profile else EngineProfile()
    suite_def = None
    if suite is not None:
        from .suites import load_suite
        suite_def = load_suite(suite)
        if scenario:
            raise UsageError("--suite and --scenario cannot be combined")
    overrides = {}
    if ladder is not None:
        overrides["ladder"] = _parse_ladder(ladder)
    if repeats is not None:
        overrides["repeats"] = repeats
    if max_tokens is not None:
        overrides["max_tokens"] = max_tokens
    facts = {k: v for k, v in {"block_size": block_size, "max_num_batched_tokens": chunk_size,
                               "num_speculative_tokens": num_speculative_tokens,
                               "max_num_seqs": max_num_seqs, "max_model_len": max_model_len,
                               "vocab_size": vocab_size, "dtype": dtype}.items()
             if v is not None}
    if dtype is not None:
        from .divergence import normalize_dtype
        if normalize_dtype(dtype) is None:
            raise UsageError(f"--dtype {dtype!r}: expected bfloat16, float16 or float32")
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env {api_key_env}: that environment variable is not set")
    cfg = StressConfig(
        model=model or prof.model, url=url, tp=tp or prof.tp or 1,
        engine_python=engine_python or prof.python or sys.executable,
        engine_args=prof.engine_args + list(engine_arg or []),
        engine_env={**prof.env, **_parse_env(engine_env or [])},
        scenarios=(suite_def.scenario_refs() if suite_def else list(scenario or DEFAULT_SCENARIOS)),
        overrides=overrides,
        results_dir=results_dir, run_id=run_id, host=host or prof.host or "127.0.0.1", port=port,
        start_timeout_s=start_timeout,
        served_model_name=served_model_name or prof.served_model_name,
        explicit_facts=facts, profile=str(engine_profile) if engine_profile else None,
        api_key=api_key, on_timeout=on_timeout, reference=reference,
        reference_engine_args=list(reference_engine_arg or []),
        repeat=repeat if repeat != 1 or not suite_def else suite_def.repeat,
        logprobs=logprobs, near_tie_nats=near_tie_nats, strict=strict, golden=golden,
        golden_model=golden_model, control_engine_args=list(control_engine_arg or []),
        control_drop_args=list(control_drop_arg or []),
        control_profile=str(control_profile) if control_profile else None,
        reference_cache_state=reference_cache_state,
        timeouts=Timeouts(connect_timeout, first_token_timeout, between_tokens_timeout,
                          request_timeout),
        invocation=["ple-harness"] + sys.argv[1:])
    raise typer.Exit(run_stress(cfg, console))


@app.command()
def facts(
    url: Annotated[Optional[str], typer.Option(help="Read a running server at this base URL.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Launch this local model (default: the "
                                                 "embedded tiny model) and read its facts.")] = None,
    engine_profile: Annotated[Optional[Path], typer.Option(help="TOML engine profile to launch.")] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", min=1, help="Tensor-parallel size.")] = None,
    engine_python: Annotated[Optional[str], typer.Option(help="Python that has vLLM installed.")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra engine argument, "
                                                            "repeatable (= form).")] = None,
    engine_env: Annotated[Optional[list[str]], typer.Option(help="NAME=VALUE for the engine, "
                                                            "repeatable.")] = None,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name to read.")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where the launched engine's log folder "
                                              "(facts-<time>) is created.")] = Path("results"),
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the facts as "
                                                      "JSON to this path.")] = None,
    start_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for a launched "
                                                 "engine.")] = 900.0,
):
    """Print the engine facts (block size, chunk budget, speculative tokens, capture sizes, KV
    capacity, dtype, ...) with their sources; launches and stops the engine unless --url."""
    from datetime import datetime

    from .factsjob import FactsConfig, run_facts
    from .profile import EngineProfile, load_profile

    prof = load_profile(engine_profile) if engine_profile else EngineProfile()
    if url and (model or engine_profile):
        raise UsageError("--url cannot be combined with --model or --engine-profile")
    cfg = FactsConfig(url=url, model=model or prof.model, tp=tp or prof.tp or 1,
                      engine_python=engine_python or prof.python or sys.executable,
                      engine_args=prof.engine_args + list(engine_arg or []),
                      engine_env={**prof.env, **_parse_env(engine_env or [])},
                      served_model_name=served_model_name or prof.served_model_name,
                      host=prof.host or "127.0.0.1", start_timeout_s=start_timeout,
                      log_dir=results_dir / f"facts-{datetime.now():%Y%m%d-%H%M%S}",
                      json_path=json_path)
    raise typer.Exit(run_facts(cfg, console))


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="Run folder or manifest.json.")],
    format: Annotated[str, typer.Option(help="console, markdown or junit.")] = "console",
    plot: Annotated[Optional[Path], typer.Option(
        help="Also write a PNG: decode tok/s and TTFT per phase, mismatches marked "
             "(needs matplotlib).")] = None,
):
    """Re-render a finished or interrupted run (console summary, Markdown for a PR, JUnit XML)."""
    from .compare import load
    from .report import render as render_console
    from .reports import to_junit, to_markdown

    m = load(run)
    if plot is not None:
        from .plot import plot_run
        console.print(f"plot written to {escape(str(plot_run(m, plot)))}")
    if format == "console":
        render_console(m, console)
        console.print(f"status {m.status}, verdict {m.verdict}, exit {m.exit_code}")
    elif format == "markdown":
        print(to_markdown(m), end="")
    elif format == "junit":
        print(to_junit(m), end="")
    else:
        raise UsageError(f"--format {format!r}: expected console, markdown or junit")


@app.command("compare")
def compare_cmd(
    base: Annotated[Path, typer.Argument(help="BASE run folder or manifest.")],
    head: Annotated[Path, typer.Argument(help="HEAD run folder or manifest.")],
    min_throughput_ratio: Annotated[Optional[float], typer.Option(min=0.0,
        help="Gate: every per-concurrency median HEAD/BASE decode throughput ratio >= R.")] = None,
    min_phase_ratio: Annotated[Optional[float], typer.Option(min=0.0,
        help="Gate: every per-phase HEAD/BASE ratio >= R (noisy for short phases).")] = None,
    threshold: Annotated[Optional[list[str]], typer.Option(
        help="Gate on HEAD's median decode tok/s, e.g. 'C4>=62.985'; repeatable.")] = None,
    suite: Annotated[Optional[str], typer.Option(
        help="Take the gates from this suite's [gates] (flags given here win).")] = None,
):
    """Compare two runs: per-request token parity, throughput ratios, gates. Exit 0 pass, 1 fail."""
    from rich.table import Table

    from .compare import compare, load

    if suite:
        from .suites import load_suite
        g = load_suite(suite).gates
        min_throughput_ratio = min_throughput_ratio if min_throughput_ratio is not None \
            else g.min_throughput_ratio
        min_phase_ratio = min_phase_ratio if min_phase_ratio is not None else g.min_phase_ratio
        threshold = threshold or g.thresholds

    res = compare(load(base), load(head), min_throughput_ratio, min_phase_ratio, threshold)
    t = Table(title="decode throughput per concurrency (median over repeats, tok/s)")
    for col in ("C", "BASE", "HEAD", "HEAD/BASE"):
        t.add_column(col, justify="right")
    for c, r in res.concurrency_ratios.items():
        t.add_row(c, f"{res.base_throughput[c]['median_tok_per_s']:.1f}",
                  f"{res.head_throughput[c]['median_tok_per_s']:.1f}", f"{r:.3f}")
    console.print(t)
    if res.phase_ratios:
        worst = sorted(res.phase_ratios.items(), key=lambda kv: kv[1])[:5]
        console.print("lowest per-phase ratios: " + ", ".join(f"{n} {r:.3f}" for n, r in worst))
    for mm in res.parity_mismatches[:20]:
        console.print(f"[red]parity:[/red] {mm['prompt']} (max_tokens {mm['max_tokens']}): "
                      f"BASE {mm['base']} vs HEAD {mm['head']}")
    if res.only_in_one:
        console.print(f"{res.only_in_one} prompt(s) issued by only one of the runs (not compared)")
    for g in res.gates_passed:
        console.print(f"[green]PASS[/green] {g}")
    for g in res.gate_failures:
        console.print(f"[red]FAIL[/red] {g}")
    console.print(f"verdict: {'pass' if res.passed else 'fail'}")
    raise typer.Exit(0 if res.passed else 1)


@app.command()
def scenarios():
    """List the shipped scenarios with a one-line description each."""
    from .scenarios import REGISTRY, scenario_dirs
    from .scenarios.base import load_scenario_file

    seen = set()
    for d in scenario_dirs():
        for f in sorted(d.glob("*.toml")):
            if f.stem in seen:
                continue
            seen.add(f.stem)
            try:
                sc = load_scenario_file(str(f))
                console.print(f"[bold]{f.stem}[/bold] ({sc.kind}): {sc.description}")
            except ValueError as exc:
                console.print(f"[red]{f.stem}[/red]: {exc}")
    console.print(f"scenario kinds: {', '.join(sorted(REGISTRY))}")


@app.command()
def probe(
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the result as JSON "
                                                      "to this path.")] = None,
    quick: Annotated[bool, typer.Option(help="Capability and a 100-replay self-test; no "
                                        "timings.")] = False,
    replays: Annotated[int, typer.Option(min=1, help="Self-test replays per row size.")] = 1000,
):
    """GPU pre-flight probe for deferred PLE row loading (stream memops inside CUDA graphs).

    Exit 0 when the probe answered (ok, fallback: synchronous, or unavailable: no GPU / no CUDA),
    1 when the self-test failed.
    """
    import json

    from .probe import render, run_probe
    result = run_probe(selftest=True, timings=not quick, replays=100 if quick else replays)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    render(result, console)
    raise typer.Exit(1 if result.get("status") == "failed" else 0)


@app.command()
def explain(
    run: Annotated[Path, typer.Argument(help="Run folder (or manifest.json) of a launched run.")],
    suspect: Annotated[Optional[list[str]], typer.Option(
        help="A further suspect: an engine argument (= form) whose control engine is tried too, "
             "repeatable, e.g. --suspect=--enforce-eager.")] = None,
    suspect_drop: Annotated[Optional[list[str]], typer.Option(
        help="A further suspect: an engine flag removed (with its value) from the launch, "
             "repeatable, e.g. --suspect-drop=--speculative-config.")] = None,
    auto_suspects: Annotated[bool, typer.Option(
        help="Also try the suspects derived from the run's facts (speculative decoding, prefix "
             "caching, chunked prefill, and on GPUs CUDA graphs and FULL graphs).")] = True,
    include_warnings: Annotated[bool, typer.Option(
        help="Explain every divergence, near ties and also_in_control ones too (default: only "
             "those that fail the run).")] = False,
    tries: Annotated[int, typer.Option(min=1, max=100, help="Attempts per replay (batching is "
                                       "not perfectly repeatable).")] = 3,
    budget_s: Annotated[float, typer.Option(min=1.0, help="Time cap, seconds: configurations "
                                            "not started by then are skipped.")] = 3600.0,
    engine_python: Annotated[Optional[str], typer.Option(
        help="Python with vLLM (default: the run's).")] = None,
    start_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for each "
                                                 "engine.")] = 900.0,
):
    """Which engine feature causes each failing divergence of a finished run: replays the smallest
    failing case on engines that each switch one suspect off (speculative decoding, prefix
    caching, chunked prefill, CUDA graphs, ...); writes RUN/explain/ (table, JUnit, reproducers).
    Exit 0 when done (the table is the result), 2 usage error, 3 engine failure."""
    from .explain import explain as run_explain
    run_explain(run, suspects_extra=list(suspect or []), suspects_drop=list(suspect_drop or []),
                auto_suspects=auto_suspects, include_warnings=include_warnings, tries=tries,
                budget_s=budget_s,
                engine_python=engine_python, start_timeout_s=start_timeout,
                console=Console(stderr=True))


@app.command("build-model")
def build_model(
    engine_python: Annotated[Optional[str], typer.Option(
        help="Python with torch, transformers and tokenizers (for --verify). Default: this "
             "Python.")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Also retrain the model from its recipe (build_tiny.py, about 5 minutes "
                         "on 2 cores) and compare the result with the pinned weights: exit 0 when "
                         "identical, 1 when they differ (expected on another CPU family; the "
                         "shipped weights stay authoritative).")] = False,
):
    """Verify the embedded model's pinned SHA256 digests and print its path (and, with --verify,
    whether its recipe reproduces it here)."""
    from .model import WEIGHTS_SHA256, ensure_embedded_model, rebuild
    path = ensure_embedded_model()
    print(path)
    err = Console(stderr=True)
    err.print(f"embedded model verified: weights SHA256 {WEIGHTS_SHA256}", highlight=False)
    if verify:
        res = rebuild(engine_python or sys.executable, log=err.print)
        err.print(f"rebuilt weights SHA256 {res['weights_sha256']}: "
                  + ("identical to the pinned weights" if res["same"] else
                     "DIFFERENT from the pinned weights (files: "
                     + ", ".join(res["differing_files"]) + ")"), highlight=False)
        raise typer.Exit(0 if res["same"] else 1)


def _exit_now_if_requests_hang(code: int) -> None:
    """After an interrupted run, request threads may still wait for an engine that never answers
    (a request cut off before its response headers cannot be woken). Everything is recorded and
    the engine is stopped by then, so exit without joining them (the interpreter would)."""
    import threading
    if any(t.name.startswith("ple-req") and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run() -> None:
    """Console entry point: maps harness errors to their exit codes with one clear line."""
    try:
        rc = app(standalone_mode=False)
        _exit_now_if_requests_hang(rc if isinstance(rc, int) else 0)
        sys.exit(rc if isinstance(rc, int) else 0)
    except HarnessError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception as exc:  # click's usage errors (typer may bundle its own copy of click)
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise


