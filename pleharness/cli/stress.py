"""``ple-harness stress``: parse the options and run :func:`pleharness.stress.run_stress`."""
from __future__ import annotations

import typer

from ..defaults import DEFAULT_REFERENCE
from ..stress import run_stress
from . import Command, app, console, err_console, warn
from .assemble import stress_config
from .options import (AttachOptions, ControlOptions, EngineOptions, GoldenProbeOptions,
                      OutputOptions, ReferenceOpt, ReferenceOptions, ScenarioOptions,
                      TimeoutOptions, VerdictOptions, grouped)


@app.command(cls=Command, epilog=(
    "Examples: ple-harness stress --engine-profile cpu-ngram\n\n"
    "ple-harness stress --engine-profile gpu-dense-bf16.example --model /models/dense "
    "--engine-python /opt/vllm/bin/python\n\n"
    "ple-harness stress --url http://127.0.0.1:8000 --block-size 16 --chunk-size 8192\n\n"
    "No options: the embedded model on the CPU engine. Every run writes results/RUN/ "
    "(summary.md first). More: docs/stress.md, docs/usage.md."))
@grouped
def stress(ctx: typer.Context, engine: EngineOptions, scen: ScenarioOptions,
           attach: AttachOptions, reference: ReferenceOpt = DEFAULT_REFERENCE,
           control: ControlOptions = None, golden: GoldenProbeOptions = None,
           ref: ReferenceOptions = None, verdict: VerdictOptions = None,
           timeouts: TimeoutOptions = None, output: OutputOptions = None):
    """Run the scenario suite against a launched (or attached) engine and judge every output: the main job.

    Launches the vLLM server (or attaches with --url), runs the suite (default: transitions,
    boundary, pairs, insert, sampled, ...), compares each output's token IDs with the same
    request alone, runs the checks, and writes the run folder with summary.md and a verdict.

    Exit 0 pass, 1 parity/check failure, 2 usage error (nothing started), 3 engine failed to
    start or died, 4 internal error, 130/143 interrupted.
    """
    cfg = stress_config(engine=engine, attach=attach, scen=scen, reference=reference,
                        control=control, golden=golden, ref=ref, verdict=verdict,
                        timeouts=timeouts, output=output, warn=warn)
    if scen.repeat_old is not None:
        warn("--repeat is deprecated: use --suite-repeats (--repeats is the transitions "
             "ladder's repeats)")
    raise typer.Exit(run_stress(cfg, console, err_console))
