"""``ple-harness facts``: the engine and attach options of ``stress`` (the same groups, checked
and resolved by :func:`pleharness.cli.assemble.engine_groups`: a shipped profile name is found,
a launch option with --url and an engine argument holding a space are refused), then
:func:`pleharness.factsjob.run_facts`."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import files
from ..defaults import DEFAULT_RESULTS_DIR
from ..factsjob import FactsConfig, run_facts
from . import Command, app, console
from ..option_rules import raise_all
from .assemble import engine_groups, option_problems
from .options import AttachOptions, EngineOptions, GoldenProbeOptions, Pick, given, grouped


@app.command(cls=Command, epilog=(
    "Example: ple-harness facts --url http://127.0.0.1:8000\n\n"
    "ple-harness facts --engine-profile gpu-tp4-mtp.example --model /models/moe-mtp "
    "--engine-python /opt/vllm/bin/python --json facts.json (then: ple-harness scenarios "
    "--facts facts.json)"))
@grouped
def facts(ctx: typer.Context,
          attach: Annotated[AttachOptions, Pick(only=("url", "served_model_name",
                                                            "api_key_env"))],
          engine: Annotated[EngineOptions, Pick(without=("host", "port"))],
          results_dir: Annotated[str, typer.Option(help="Where the launched engine's log folder "
                                                   "(facts-<time>) is created.")] = \
            DEFAULT_RESULTS_DIR,
          json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the facts "
                                                            "as JSON to this path.")] = None):
    """Print the engine facts the scenarios plan on (block size, chunk budget, k, capture sizes, ...) with their sources.

    Also KV capacity, dtype, max_model_len, ...; launches and stops the engine unless --url."""
    if json_path is not None:
        files.check_json_path(json_path)
    raise_all(option_problems(engine, attach, given=given(attach, engine),
                              results_dir=results_dir))  # "" is refused there
    # facts has no --engine-probe (FactsConfig measures nothing): the option's default
    eng, att = engine_groups(engine, attach, probe=GoldenProbeOptions().engine_probe)
    if att.url is None:  # a launched engine's log folder goes there
        files.check_writable_folder(Path(results_dir), "--results-dir")
    cfg = FactsConfig(url=att.url, model=eng.model, tp=eng.tp, engine_python=eng.python,
                      engine_args=eng.args, engine_env=eng.env,
                      served_model_name=eng.served_model_name, host=eng.host,
                      start_timeout_s=eng.start_timeout_s, api_key=att.api_key,
                      log_dir=Path(results_dir) / f"facts-{datetime.now():%Y%m%d-%H%M%S}",
                      json_path=json_path)
    raise typer.Exit(run_facts(cfg, console))
