"""``ple-harness stress``: parse the options and run :func:`pleharness.stress.run_stress`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import DEFAULT_SCENARIOS
from ..defaults import (DEFAULT_API, DEFAULT_CONFIRM_RUNS, DEFAULT_LOGPROBS,
                        DEFAULT_PARALLEL_ENGINES, DEFAULT_REFERENCE,
                        DEFAULT_REFERENCE_CACHE_STATE, DEFAULT_SUITE_REPEATS, confirm_runs_help)
from ..stress import run_stress
from . import Command, app, console, err_console, warn
from .assemble import stress_config
from .options import (API_HELP, P_CTRL, P_REF, P_SCEN, PARALLEL_ENGINES_HELP, Api,
                      AttachOptions, CacheState,
                      EngineOptions, GoldenProbeOptions, OutputOptions, TimeoutOptions,
                      VerdictOptions, given, grouped, option_group, values)


@option_group
class ScenarioOptions:
    """Which scenarios run, and overrides of their parameters."""

    scenario: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_SCEN,
        help="Scenario name (shipped, see `ple-harness scenarios`) or TOML path; repeatable. "
             f"Default: {', '.join(DEFAULT_SCENARIOS)}.")] = None
    suite: Annotated[Optional[str], typer.Option(rich_help_panel=P_SCEN,
        help="A suite file (name in scenarios/suites/ or path): scenarios with parameters, "
             "repeats and compare gates, e.g. nightly or premerge.")] = None
    ladder: Annotated[Optional[str], typer.Option(rich_help_panel=P_SCEN,
        help="Override the transitions concurrency ladder, e.g. 4,3,2,1,2,3,4,1.")] = None
    repeats: Annotated[Optional[int], typer.Option(min=1, max=10_000, rich_help_panel=P_SCEN,
        help="Override how often the transitions ladder repeats within one suite pass.")] = None
    max_tokens: Annotated[Optional[int], typer.Option(min=1, max=1_000_000,
        rich_help_panel=P_SCEN, help="Override max_tokens per request.")] = None
    suite_repeats: Annotated[int, typer.Option(min=1, rich_help_panel=P_SCEN,
        help="Run the whole suite N times on one engine (references taken once); throughput "
             "is reported as median/min/max over the repeats. Default: the suite's repeat, "
             "else 1.")] = DEFAULT_SUITE_REPEATS
    repeat_old: Annotated[Optional[int], typer.Option("--repeat", min=1, hidden=True,
        help="Deprecated spelling of --suite-repeats.")] = None
    api: Annotated[Api, typer.Option(rich_help_panel=P_SCEN, help=API_HELP)] = Api(DEFAULT_API)


@option_group
class ControlOptions:
    """The control run (attribution: docs/attribution.md)."""

    control_engine_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_CTRL,
        help="Control run: after the engine under test, launch a control engine with its "
             "arguments plus this one (repeatable, = form), run the same suite, and classify "
             "each divergence as also_in_control (engine numerics, a warning) or only_under_test, "
             "e.g. --control-engine-arg=--enforce-eager.")] = None
    control_drop_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_CTRL,
        help="Control run: remove this flag (and its value) from the engine's arguments, e.g. "
             "--control-drop-arg=--speculative-config (repeatable; _ and - are the same, as in "
             "vLLM). A flag not among them, or a control identical to the engine under test, is "
             "a usage error.")] = None
    control_engine_python: Annotated[Optional[str], typer.Option(rich_help_panel=P_CTRL,
        help="Control run on another build: the control engine is launched with this Python "
             "(e.g. the BASE build's virtual environment beside HEAD's --engine-python), the "
             "same model and arguments unless --control-engine-arg / --control-drop-arg change "
             "them; every solo greedy answer of the two builds is compared (pre-merge: 'HEAD "
             "answers differently from BASE here').")] = None
    control_profile: Annotated[Optional[Path], typer.Option(rich_help_panel=P_CTRL,
        help="Control run: the control engine's own profile, a path or a shipped name; only its "
             "engine_args and env apply (model, python, tp, host: the engine under test's, with a "
             "warning).")] = None


@option_group
class ReferenceOptions:
    """Where references come from and how they are taken (besides --reference)."""

    confirm_runs: Annotated[int, typer.Option(min=0, max=100, rich_help_panel=P_REF,
        help=confirm_runs_help("each reproducer a scenario writes (the fuzz kind's "
                               "repro.toml)"))] = DEFAULT_CONFIRM_RUNS
    parallel_engines: Annotated[str, typer.Option(rich_help_panel=P_REF,
        help=PARALLEL_ENGINES_HELP)] = str(DEFAULT_PARALLEL_ENGINES)
    golden_model: Annotated[Optional[str], typer.Option(rich_help_panel=P_REF,
        help="Model folder for the golden model when attaching with --url (default: the served "
             "model's root, when it is a local folder).")] = None
    reference_engine_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_REF,
        help="--reference engine: an argument added to the reference engine, repeatable, e.g. "
             "--reference-engine-arg=--enforce-eager. The reference engine inherits the engine "
             "under test's model, python, tp, env and arguments (profile engine_args, then "
             "--engine-arg); only the port differs. One identical to the engine under test is "
             "a usage error.")] = None
    reference_drop_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_REF,
        help="--reference engine: remove this flag (and its value) from the inherited "
             "arguments, e.g. --reference-drop-arg=--speculative-config (repeatable).")] = None
    reference_cache_state: Annotated[CacheState, typer.Option(rich_help_panel=P_REF,
        help="warm: run each reference prompt alone twice, judge the second (prefix-cached) "
             "run against the first, keep the second; cold: keep the first run.")] = \
        CacheState(DEFAULT_REFERENCE_CACHE_STATE)
    logprobs: Annotated[int, typer.Option(min=0, max=20, rich_help_panel=P_REF,
        help="Top-k logprobs per output token (needed for near-tie analysis; 0 = off).")] = \
        DEFAULT_LOGPROBS


ReferenceOpt = Annotated[str, typer.Option(rich_help_panel=P_REF,
    help="Where single-request references come from: 'solo' (this engine, one request at a "
         "time, before the load), 'engine' (a second launch of the engine under test's "
         "configuration changed by --reference-engine-arg / --reference-drop-arg, run first "
         "and stopped), 'golden' (transformers in float32 on the same weights: an "
         "implementation independent of vLLM; the engine's own solo runs are compared with "
         "it too), or 'manifest:PATH' (a previous run's references).")]


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
    groups = (engine, attach, scen, control, golden, ref, verdict, timeouts, output)
    cfg = stress_config(values(*groups, reference=reference), given(*groups), warn)
    if scen.repeat_old is not None:
        warn("--repeat is deprecated: use --suite-repeats (--repeats is the transitions "
             "ladder's repeats)")
    raise typer.Exit(run_stress(cfg, console, err_console))
