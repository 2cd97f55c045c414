"""``ple-harness confirm``: parse, then :func:`pleharness.confirmjob.run_confirm`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..confirmjob import run_confirm
from ..defaults import DEFAULT_CONFIRM_RUNS, DEFAULT_PARALLEL_ENGINES, DEFAULT_START_TIMEOUT_S
from ..engine.side_by_side import parse_parallel
from . import Command, app, err_console
from .assemble import compile_cache_dir
from .options import COMPILE_CACHE_HELP


@app.command(cls=Command, epilog=(
    "Example: ple-harness confirm results/RUN --runs 5 --engine-python /opt/fixed/bin/python"))
def confirm(
    run: Annotated[Path, typer.Argument(help="Run folder (or manifest.json) of a launched run "
                                        "that wrote a reproducer (e.g. a fuzz run).")],
    runs: Annotated[int, typer.Option(min=1, max=100, help="Replays of each reproducer, each "
                                      "on a freshly started engine.")] = DEFAULT_CONFIRM_RUNS,
    engine_python: Annotated[Optional[str], typer.Option(
        help="Python with vLLM (default: the run's), e.g. that of a patched build: exit 0 "
             "when no reproducer fails there any more.")] = None,
    start_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for each "
                                                 "engine.")] = DEFAULT_START_TIMEOUT_S,
    parallel_engines: Annotated[str, typer.Option(help=(
        "Replays started side by side: a number, or auto (as many as fit in the GPU's free "
        "memory, 1 on the CPU). Each gets a fixed KV cache size (--kv-cache-memory-bytes) and a "
        "small --gpu-memory-utilization share; more than fit: a usage error."))] = \
        str(DEFAULT_PARALLEL_ENGINES),
    compile_cache: Annotated[Optional[str], typer.Option(
        help=COMPILE_CACHE_HELP + " Default here: the run's.")] = None,
):
    """Replay a finished run's reproducers on fresh engines (e.g. of a patched build): do they still fail?

    The reproducers are those the run wrote (its reproducers table: fuzz's repro.toml), each
    replayed --runs times on a freshly started engine of the run's configuration (its launch and
    judging options, from its manifest), and say how often each still fails. Writes
    RUN/confirm-TIME/confirm.json (rewritten after every reproducer) and the replays' run
    folders beside it; the run's own manifest is not changed.

    Exit 0 no reproducer failed again, 1 a reproducer failed again, 2 usage error, 3 every
    replay ended in an error (e.g. the engine did not start), 130/143 interrupted.
    """
    raise typer.Exit(run_confirm(
        run, runs, engine_python=engine_python, start_timeout_s=start_timeout,
        console=err_console, parallel_engines=parse_parallel(parallel_engines),
        compile_cache=compile_cache_dir(compile_cache) if compile_cache else None))
