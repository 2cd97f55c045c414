"""The ``ple-harness selftest`` command (registered in :mod:`pleharness.cli`); the logic is in
:mod:`pleharness.selftest`."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from .cli import (P_SCEN, ApiKeyEnvOpt, BlockSizeOpt, ChunkSizeOpt, DtypeOpt, EngineArgOpt,
                  EngineEnvOpt, EnginePythonOpt, EngineProfileOpt, MaxModelLenOpt,
                  MaxNumSeqsOpt, ModelOpt, NumSpecOpt, ResultsDirOpt, RunIdOpt, StartTimeoutOpt,
                  TpOpt, UrlOpt, VocabSizeOpt, _engine_config, console, err_console)
from .faults.builtin import BUILTIN


def selftest(
    ctx: typer.Context,
    suite: Annotated[Optional[str], typer.Option(rich_help_panel=P_SCEN,
        help="The suite every pass runs: a suite name (scenarios/suites/), a path, or 'default' "
             "(the default suite of stress; about 10 x slower). Default: selftest, a short "
             "ladder and boundary depth 1.")] = None,
    scenario: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_SCEN,
        help="Run these scenarios instead of a suite (repeatable), e.g. --scenario boundary.")] = None,
    fault: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_SCEN,
        help="Plant only these fault classes (repeatable; default: all): "
             + ", ".join(BUILTIN) + ".")] = None,
    model: ModelOpt = None,
    engine_profile: EngineProfileOpt = None,
    tp: TpOpt = None,
    engine_python: EnginePythonOpt = None,
    engine_arg: EngineArgOpt = None,
    engine_env: EngineEnvOpt = None,
    start_timeout: StartTimeoutOpt = 900.0,
    url: UrlOpt = None,
    block_size: BlockSizeOpt = None,
    chunk_size: ChunkSizeOpt = None,
    num_speculative_tokens: NumSpecOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_model_len: MaxModelLenOpt = None,
    vocab_size: VocabSizeOpt = None,
    dtype: DtypeOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    results_dir: ResultsDirOpt = "results",
    run_id: RunIdOpt = None,
):
    """Detection power of a suite on this engine: launch the engine once (or attach with --url),
    then run the suite through an in-process fault-injection proxy once clean and once per
    planted fault class (a flipped token under load, a corrupted warm run, an out-of-vocabulary
    id, a run of token 0, a dropped streamed delta, a usage mismatch, a wrong finish_reason, a
    sentinel logprob, a response cut short). Reports per class detected or missed (never
    triggered is missed too) and the clean pass's false alarms; writes
    RESULTS/ID/selftest.json and one run folder per pass.

    Exit 0 every class detected and no false alarm, 1 a class missed or a false alarm, 2 usage
    error, 3 the engine failed to start or died, 4 internal error.
    """
    o = dict(locals())
    # no engine probe: its solo requests would shift the prompt runs that fault classes key on
    o.update(near_tie_nats=None, strict=False, golden=False, engine_probe=False)
    engine = _engine_config(ctx, o)
    from .errors import UsageError
    from .selftest import DEFAULT_SUITE, run_selftest
    from .stress import DEFAULT_SCENARIOS, StressConfig
    if suite is not None and scenario:
        raise UsageError("--suite and --scenario cannot be combined (a suite names its scenarios)")
    if scenario:
        scenarios = list(scenario)
    elif suite == "default":
        scenarios = list(DEFAULT_SCENARIOS)
    else:
        from .suites import load_suite
        scenarios = load_suite(suite or DEFAULT_SUITE).scenario_refs()
    engine.pop("run_id")
    cfg = StressConfig(**engine, scenarios=scenarios)
    raise typer.Exit(run_selftest(cfg, list(fault or BUILTIN), console, err_console,
                                  selftest_id=run_id))
