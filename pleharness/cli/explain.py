"""``ple-harness explain``: parse, then :func:`pleharness.explain.explain`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import option_rules
from ..defaults import (DEFAULT_CONFIRM_RUNS, DEFAULT_PARALLEL_ENGINES, DEFAULT_START_TIMEOUT_S,
                        confirm_runs_help)
from ..engine.side_by_side import parse_parallel
from ..explain import explain as run_explain
from . import Command, app, err_console
from .assemble import compile_cache_dir
from .options import COMPILE_CACHE_HELP


@app.command(cls=Command, epilog=(
    "Example: ple-harness explain results/RUN\n\n"
    "It prints an estimate of its engine launches first; results in RUN/explain/ "
    "(explain.md: the diagnosis to paste into a PR). More: docs/attribution.md."))
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
                                                 "engine.")] = DEFAULT_START_TIMEOUT_S,
    confirm_runs: Annotated[int, typer.Option(min=0, max=100, help=confirm_runs_help(
        "each repro-N.toml"))] = DEFAULT_CONFIRM_RUNS,
    confirm_all: Annotated[bool, typer.Option(help=(
        "Confirm every case's reproducer (default: one per distinct diagnosis, the smallest; "
        "the others say 'same diagnosis as case N')."))] = False,
    parallel_engines: Annotated[str, typer.Option(help=(
        "Engines started side by side: the suspects' configurations (never across the two "
        "rounds) and the confirmation replays (a number, or auto: as many as fit in the GPU's "
        "free memory, 1 on the CPU). Each gets a fixed KV cache size (--kv-cache-memory-bytes) "
        "and a small --gpu-memory-utilization share; more than fit: a usage error."))] = \
        str(DEFAULT_PARALLEL_ENGINES),
    compile_cache: Annotated[Optional[str], typer.Option(
        help=COMPILE_CACHE_HELP + " Default here: the run's.")] = None,
):
    """Which engine feature each failing divergence of a run needs, replayed with one suspect off at a time.

    Replays the smallest failing case on engines that each switch one suspect off (speculative
    decoding, prefix caching, chunked prefill, CUDA graphs, ...), then the 2x2 table of two
    features it needs together and other values of k, the chunk budget or the block size; names
    every condition it needs, the narrowest single change and what is not involved; writes
    RUN/explain/ (table, diagnosis, JUnit, reproducers). Exit 0 when done (the table is the result), 2 usage error, 3 engine
    failure."""
    option_rules.raise_all(option_rules.engine_arg_problems(list(suspect or []), "--suspect"))
    run_explain(run, suspects_extra=list(suspect or []), suspects_drop=list(suspect_drop or []),
                auto_suspects=auto_suspects, include_warnings=include_warnings, tries=tries,
                budget_s=budget_s,
                engine_python=engine_python, start_timeout_s=start_timeout,
                console=err_console, confirm_runs=confirm_runs,
                parallel_engines=parse_parallel(parallel_engines), confirm_all=confirm_all,
                compile_cache=compile_cache_dir(compile_cache) if compile_cache else None)
