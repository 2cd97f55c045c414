"""Option groups of the commands, each option declared ONCE with its flag, help, bounds and panel.

A group is a dataclass whose fields are typer options (``Annotated[type, typer.Option(...)]``
with a default). Where the option fills a field of a config group (:mod:`pleharness.config`,
:class:`~pleharness.engine.inflight.Timeouts`), the field declares it: its default, and its help,
bounds and panel as an :class:`~pleharness.option.Opt` annotation; :func:`config_options` makes
the typer options of such fields, :func:`options_group` a group of them, and
:func:`config_values` the config group's fields of the parsed options (issue 50 item 4: the
option is the config field). The options the builders of :mod:`pleharness.cli.assemble` layer
over an engine profile, or read into something else (a suite, a key, a fact), are written here.

A command takes a group whole by naming it as a parameter's type, or part of it with
:class:`Pick`::

    @app.command(cls=Command)
    @grouped
    def fuzz(ctx: typer.Context, engine: Annotated[EngineOptions, Pick(without=("host",
             "port"))], output: OutputOptions, ...): ...

:func:`grouped` replaces each group parameter by the group's options, in field order (so
``--help`` lists them where the group stands, in their panels), and calls the command with one
group instance per parameter; ``group.given`` holds the names given on the command line. The
values are checked in :mod:`pleharness.config`, never here.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..config import (DEFAULT_SCENARIOS, ConfirmationConfig, ControlConfig, EngineConfig,
                      OutputConfig, ReferenceConfig, SuiteConfig, VerdictConfig)
from ..defaults import DEFAULT_API, DEFAULT_HOST, DEFAULT_START_TIMEOUT_S, DEFAULT_SUITE_REPEATS
from ..engine.inflight import Timeouts
from ..option import P_ATTACH, P_ENGINE, P_REF, P_SCEN, FieldOption, options_of

COMPILE_CACHE_HELP = (
    "Folder of the torch.compile / CUDA-graph cache every engine of the job uses "
    "(VLLM_CACHE_ROOT). Default: vLLM's own, $VLLM_CACHE_ROOT or ~/.cache/vllm, kept between "
    "jobs, so a configuration compiles once per machine. Each engine start reports whether it "
    "found its graphs there (warm) or compiled them (cold).")

FACT_HELP = "Attach only."


class Api(str, Enum):
    """``--api``: which endpoint requests whose prompt has a message form go to."""

    completions = "completions"
    chat = "chat"
    both = "both"


API_HELP = (
    "Endpoint of the load requests whose prompt is exactly a chat template of messages (the "
    "stop_strings and insert counting prompts): both (default): each also sent as a chat twin "
    "to /v1/chat/completions in the same phase, compared with the same completions reference; "
    "chat: sent only there; completions: only /v1/completions. Token-ID prompts (random IDs, "
    "padded templates) and the references always use /v1/completions. A model without a chat "
    "template falls back to completions with a note (manifest run_options.api_used).")


@dataclass(frozen=True)
class Pick:
    """Which fields of a group a command takes (``only`` or all ``without`` some) and the defaults
    it gives them (``defaults``: name -> value). A left-out field keeps its group default."""

    only: tuple[str, ...] = ()
    without: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)

    def names(self, group: type) -> list[str]:
        """The picked field names of ``group``, in its order."""
        all_ = [f.name for f in dataclasses.fields(group)]
        bad = set(self.only) | set(self.without) | set(self.defaults)
        if bad - set(all_):
            raise TypeError(f"{group.__name__} has no option(s) {sorted(bad - set(all_))}")
        return [n for n in all_ if (not self.only or n in self.only) and n not in self.without]


def given_names(ctx: typer.Context, names) -> frozenset[str]:
    """The ``names`` given on the command line or through the environment (not defaults)."""
    def given(name: str) -> bool:
        src = ctx.get_parameter_source(name)  # typer may bundle its own click: compare by name
        return getattr(src, "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    return frozenset(n for n in names if given(n))


def _group_of(annotation) -> tuple[type | None, Pick]:
    if typing.get_origin(annotation) is Annotated:
        base, *meta = typing.get_args(annotation)
        picks = [m for m in meta if isinstance(m, Pick)]
        if dataclasses.is_dataclass(base) and getattr(base, "option_group", False):
            return base, (picks[0] if picks else Pick())
    if dataclasses.is_dataclass(annotation) and getattr(annotation, "option_group", False):
        return annotation, Pick()
    return None, Pick()


def grouped(fn):
    """Decorator: expand the option-group parameters of command ``fn`` into their options (see
    the module docstring); the wrapper passes ``fn`` one group instance per group parameter, its
    ``given`` attribute set. Raises TypeError for a field picked that the group lacks, or an
    option name used twice."""
    sig = inspect.signature(fn, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str], dict[str, Any]]] = {}
    for p in sig.parameters.values():
        group, pick = _group_of(p.annotation)
        if group is None:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        hints = typing.get_type_hints(group, include_extras=True)
        defaults = {f.name: f.default for f in dataclasses.fields(group)}
        names = pick.names(group)
        groups[p.name] = (group, names, pick.defaults)
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=hints[n],
                                     default=pick.defaults.get(n, defaults[n])) for n in names]
    ctx_name = next((p.name for p in params if p.annotation is typer.Context), None)
    if ctx_name is None:
        raise TypeError(f"{fn.__name__}: a grouped command takes a typer.Context parameter")
    seen = [p.name for p in params]
    if len(seen) != len(set(seen)):
        raise TypeError(f"{fn.__name__}: an option name used twice: "
                        f"{sorted({n for n in seen if seen.count(n) > 1})}")

    @functools.wraps(fn)
    def command(**kw):
        ctx = kw[ctx_name]  # typer's own click (it may bundle one): its context, passed in
        for name, (group, names, defaults) in groups.items():
            inst = group(**{**defaults, **{n: kw.pop(n) for n in names}})
            inst.given = given_names(ctx, names)
            kw[name] = inst
        return fn(**kw)

    command.__signature__ = sig.replace(parameters=params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def option_group(cls):
    """Class decorator: a dataclass whose fields are options, usable as a command parameter's
    type under :func:`grouped`. ``sources``: option name -> the config field it fills (set by
    :func:`options_group`)."""
    cls = dataclass(cls)
    cls.option_group = True
    cls.given = frozenset()
    cls.sources = getattr(cls, "sources", {})
    return cls


def config_options(cls: type, *fields: str, panel: str | None = None,
                   help: dict[str, str] | None = None) -> list[tuple[str, Any, Any, FieldOption]]:
    """The options of config class ``cls``'s fields ``fields`` (none: every field that carries
    an :class:`~pleharness.option.Opt`, in field order), each as (option name, typer type,
    default, the field): the type and default are the field's (or the Opt's ``cli_type`` and the
    field default as one: None where the field's is None or empty), its help, bounds and panel
    the Opt's. A command may give its own ``panel`` and ``help`` (field -> text). Raises
    TypeError for a field with no Opt."""
    found = options_of(cls)
    missing = [f for f in (*fields, *(help or {})) if f not in found]
    if missing:
        raise TypeError(f"{cls.__name__} has no option field(s) {missing}")
    out = []
    for name in fields or found:
        src = found[name]
        opt = src.opt
        kw: dict[str, Any] = {"rich_help_panel": panel or opt.panel,
                              "help": (help or {}).get(name, opt.help)}
        kw.update({k: v for k, v in (("min", opt.min), ("max", opt.max)) if v is not None})
        if opt.envvar:
            kw.update(envvar=opt.envvar, show_envvar=True)
        default = src.default
        if opt.cli_type is not None:
            default = None if default is None or default == [] else opt.cli_type(default)
        out.append((src.name, Annotated[opt.cli_type or src.type, typer.Option(**kw)], default,
                    src))
    return out


def options_group(name: str, doc: str, *parts: list[tuple]) -> type:
    """An option group (:func:`option_group`) called ``name`` of ``parts``, in --help order: lists
    of options, from :func:`config_options` or written out as (name, typer type, default)."""
    specs = [spec for part in parts for spec in part]
    cls = dataclasses.make_dataclass(name, [spec[:3] for spec in specs])
    cls.__doc__, cls.__module__ = doc, __name__
    cls.sources = {spec[0]: spec[3] for spec in specs if len(spec) > 3}
    return option_group(cls)


def config_values(cls: type, *groups) -> dict[str, Any]:
    """{field: value} of config class ``cls`` for each of its fields that an option of
    ``groups`` fills (:func:`options_group`), the option's value parsed as the field's
    (:attr:`pleharness.option.Opt.parse`): ``cls(**config_values(cls, ...))`` builds the group."""
    return {src.field: src.value(getattr(g, name)) for g in groups
            for name, src in g.sources.items() if src.cls is cls}


def given(*groups, extra=frozenset()) -> frozenset[str]:
    """The option names given on the command line across ``groups`` (plus ``extra``)."""
    return frozenset().union(extra, *(g.given for g in groups))


@option_group
class EngineOptions:
    """How the harness launches the engine under test."""

    model: Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE, help="Local model "
        "path to serve. Default: the embedded tiny model (shipped with the package, "
        "SHA256-verified).")] = None
    engine_profile: Annotated[Optional[Path], typer.Option(rich_help_panel=P_ENGINE,
        help="TOML engine profile, a path or a shipped name (cpu-ngram): model, python, tp, "
             "engine_args, \\[env]; flags override it.")] = None
    tp: Annotated[Optional[int], typer.Option("--tp", min=1, rich_help_panel=P_ENGINE,
        help="Tensor-parallel size (--tensor-parallel-size of the launched engine).")] = None
    engine_python: Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE,
        help="Python that has vLLM installed. Default: this Python.")] = None
    engine_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_ENGINE,
        help="Extra argument for the engine server, repeatable; use the = form for values: "
             "--engine-arg --max-num-seqs=8. Appended last, so it overrides defaults.")] = None
    engine_env: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_ENGINE,
        help="NAME=VALUE environment variable for the engine, repeatable.")] = None
    host: Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE,
        help=f"Listen address of a launched engine (default {DEFAULT_HOST}).")] = None
    port: Annotated[Optional[int], typer.Option(min=1, max=65535, rich_help_panel=P_ENGINE,
        help="Listen port of a launched engine (default: a free port).")] = None
    start_timeout: Annotated[float, typer.Option(min=1.0, rich_help_panel=P_ENGINE,
        help="Seconds to wait for a launched engine to become ready.")] = DEFAULT_START_TIMEOUT_S
    compile_cache: Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE,
        help=COMPILE_CACHE_HELP)] = None


def _fact(help_: str, min_: int = 1):
    """The type of an attach-only integer fact option (``min_``: its lower bound)."""
    return Annotated[Optional[int], typer.Option(min=min_, rich_help_panel=P_ATTACH,
                                                 help=f"{help_} {FACT_HELP}")]


@option_group
class AttachOptions:
    """Attaching to a running engine (--url), and the facts the harness cannot read from it."""

    url: Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
        help="Attach to a running server at this base URL instead of launching one "
             "(e.g. http://127.0.0.1:8000). The engine facts below set the boundary lengths of "
             "an attached engine; with a launch they are an error (the engine's own arguments "
             "set them: --engine-arg --block-size=32).")] = None
    block_size: _fact("KV block size B.") = None
    chunk_size: _fact("Chunked-prefill budget C (max_num_batched_tokens).") = None
    num_speculative_tokens: _fact("Speculative tokens k (q = 1 + k).", min_=0) = None
    max_num_seqs: _fact("max_num_seqs: most requests scheduled at once.") = None
    max_model_len: _fact("max_model_len M.") = None
    vocab_size: _fact("Vocabulary size V.") = None
    dtype: Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
        help="Serving dtype (bfloat16, float16, float32): sets the default near-tie threshold. "
             + FACT_HELP)] = None
    served_model_name: Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
        help="Model name to request (default: as the server lists it).")] = None
    api_key_env: Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
        help="Name of an environment variable holding an API key: sent as a Bearer token and "
             "given to a launched engine (VLLM_API_KEY); never written anywhere.")] = None


GoldenProbeOptions = options_group(
    "GoldenProbeOptions", "The golden model and the engine probe (what decides near ties and "
    "seeded samples).",
    config_options(VerdictConfig, "golden"), config_options(EngineConfig, "probe"))

VerdictOptions = options_group(
    "VerdictOptions", "How a divergence is judged.",
    config_options(VerdictConfig, "near_tie_nats", "strict", "numerics_from"))

TimeoutOptions = options_group(
    "TimeoutOptions", "Request timeouts and what a phase with timed-out requests does.",
    config_options(Timeouts), config_options(VerdictConfig, "on_timeout"))

OutputOptions = options_group("OutputOptions", "Where the run folder goes.",
                              config_options(OutputConfig))


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


ControlOptions = options_group(
    "ControlOptions", "The control run (attribution: docs/attribution.md).",
    config_options(ControlConfig, "engine_args", "drop_args", "python", "profile"))


ReferenceOptions = options_group(
    "ReferenceOptions", "Where references come from and how they are taken (besides "
    "--reference).",
    config_options(ConfirmationConfig, "runs", "parallel_engines"),
    config_options(ReferenceConfig, "golden_model", "engine_args", "drop_args", "cache_state"),
    config_options(SuiteConfig, "logprobs"))


ReferenceOpt = Annotated[str, typer.Option(rich_help_panel=P_REF,
    help="Where single-request references come from: 'solo' (this engine, one request at a "
         "time, before the load), 'engine' (a second launch of the engine under test's "
         "configuration changed by --reference-engine-arg / --reference-drop-arg, run first "
         "and stopped), 'golden' (transformers in float32 on the same weights: an "
         "implementation independent of vLLM; the engine's own solo runs are compared with "
         "it too), or 'manifest:PATH' (a previous run's references).")]
