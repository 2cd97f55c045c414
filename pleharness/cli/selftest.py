"""``ple-harness selftest``: parse, then :func:`pleharness.selftest.run_selftest`."""
from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Optional

import typer

from .. import config, option_rules
from ..config import StressConfig, SuiteConfig, VerdictConfig
from ..errors import UsageError
from ..faults import BUILTIN
from ..selftest import DEFAULT_SUITE, run_selftest
from ..suites import load_suite
from . import Command, app, console, err_console
from .assemble import engine_groups, option_problems, output_group
from .options import (P_SCEN, AttachOptions, EngineOptions, OutputOptions, Pick,
                      ScenarioOptions, given, grouped)


@app.command("selftest", cls=Command, epilog=(
    "Example: ple-harness selftest\n\n"
    "ple-harness selftest --engine-profile cpu-ngram --fault flip_under_load\n\n"
    "More: docs/selftest.md."))
@grouped
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
    engine: Annotated[EngineOptions, Pick(without=("host", "port"))] = None,
    attach: Annotated[AttachOptions, Pick(without=("served_model_name",))] = None,
    output: OutputOptions = None,
):
    """Would this suite catch a broken engine here? Plants fault classes and counts catches and false alarms.

    Detection power of a suite on this engine: launch the engine once (or attach with --url),
    then run the suite through an in-process fault-injection proxy once clean and once per
    planted fault class (a flipped token under load, a corrupted warm run, an out-of-vocabulary
    id, a run of token 0, a dropped streamed delta, a usage mismatch, a wrong finish_reason, a
    sentinel logprob, a response cut short), and once per request-feature family (stop strings,
    token-level stops, penalties, chat, disconnects, prefix isolation, sampled, prompt logprobs,
    several choices, logprobs): a family's pass runs only its family's scenario, the clean pass
    runs them all. Reports per class detected or missed (never triggered is missed too) and the
    clean pass's false alarms; writes
    RESULTS/ID/selftest.json and one run folder per pass.

    Exit 0 every class detected and no false alarm, 1 a class missed or a false alarm, 2 usage
    error, 3 the engine failed to start or died, 4 internal error.
    """
    groups = (engine, attach, output)
    if suite is not None and not suite.strip():
        raise UsageError(f"--suite {suite!r}: an empty value (an unset variable in a CI job?): "
                         "give a suite or leave the option out")
    twice = sorted({f for f in fault or [] if (fault or []).count(f) > 1})
    if twice:
        raise UsageError(f"--fault {', '.join(twice)}: given more than once")
    option_rules.raise_all(option_problems(
        engine, attach, given=given(*groups), results_dir=output.results_dir,
        scen=ScenarioOptions(suite=suite, scenario=scenario)))
    # no engine probe: its solo requests would shift the prompt runs that fault classes key on
    eng, att = engine_groups(engine, attach, probe=False)
    if scenario:
        scenarios = list(scenario)
    elif suite == "default":
        scenarios = list(config.DEFAULT_SCENARIOS)
    else:
        scenarios = load_suite(suite or DEFAULT_SUITE).scenario_refs()
    # --run-id names the selftest folder (selftest_id); each pass names its own run
    cfg = StressConfig(engine=eng, attach=att, suite=SuiteConfig(scenarios=scenarios),
                       verdict=VerdictConfig(golden=False),
                       output=replace(output_group(output), run_id=None))
    raise typer.Exit(run_selftest(cfg, list(fault or BUILTIN), console, err_console,
                                  selftest_id=output.run_id))
