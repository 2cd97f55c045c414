"""One configuration layer: the config groups of the run commands and the rules their values
are checked by.

The command line (:mod:`pleharness.cli`) parses, then builds each config group once from its
typed option groups (:mod:`pleharness.cli.assemble`, one builder per group, which also checks
the cross-option rules of the command line: a launch option with ``--url``, an attach-only fact
without it, ...). The rules single values are checked by (engine arguments, the ``--url``,
``--ladder``, ``--engine-env``, finding an engine profile) are :mod:`pleharness.option_rules`.
The result is a :class:`StressConfig`, the composition of the groups
(:class:`EngineConfig`, :class:`AttachConfig`, :class:`SuiteConfig`, :class:`ReferenceConfig`,
:class:`ControlConfig`, :class:`VerdictConfig`, the :class:`~pleharness.engine.inflight.Timeouts`,
:class:`OutputConfig`, :class:`ConfirmationConfig`), whose :meth:`StressConfig.validate` checks
what depends on the resolved values. Every problem is a :class:`~pleharness.errors.UsageError`
naming the option (or the file and key); nothing has been read or started when one is raised.

A field that is an option as it stands carries that option (issue 50 item 4): its default, and
``Annotated[type, Opt(help=..., min=..., panel=...)]`` (:class:`pleharness.option.Opt`, plain
data): the command line makes the option of it (:func:`pleharness.cli.options.config_options`).
The options layered over an engine profile or read into something else (a suite, a key, a fact)
are declared by the command line.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from rich.console import Console

from .defaults import (DEFAULT_CONFIRM_RUNS, DEFAULT_ENGINE_PROBE, DEFAULT_GOLDEN, DEFAULT_HOST,
                       DEFAULT_LOGPROBS, DEFAULT_ON_TIMEOUT, DEFAULT_PARALLEL_ENGINES,
                       DEFAULT_REFERENCE, DEFAULT_REFERENCE_CACHE_STATE, DEFAULT_RESULTS_DIR,
                       DEFAULT_START_TIMEOUT_S, DEFAULT_STRICT, DEFAULT_SUITE_REPEATS,
                       confirm_runs_help)
from .engine.inflight import Timeouts
from .engine.session import Target, resolve_target
from .engine.side_by_side import parse_parallel
from .errors import UsageError
from .option import P_CTRL, P_OUT, P_REF, P_TIME, Opt, repeatable

DEFAULT_SCENARIOS = ["transitions", "boundary", "pairs", "insert", "sampled", "stop_strings",
                     "mixed_params", "disconnects", "prefix_isolation", "chat_api",
                     "prompt_logprobs", "constrained"]
REFERENCE_MODES = ("solo", "engine", "manifest", "golden")

PARALLEL_ENGINES_HELP = (
    "Engines started side by side for the confirmation replays, explain's launches and "
    "stress's control engine (which then starts beside the engine under test when the profile "
    "fixes --kv-cache-memory-bytes): a number, or auto: as many as fit in the GPU's free "
    "memory, 1 on the CPU. Each confirmation or explain engine gets a fixed KV cache size "
    "(--kv-cache-memory-bytes) and a small --gpu-memory-utilization share, so that its start "
    "does not profile memory a neighbour is allocating. More than fit: a usage error before "
    "anything starts.")


# -- the config groups: one per option group, built once by the command line -------------------
@dataclass(frozen=True)
class EngineConfig:
    """The engine under test's launch (options ``--model``, ``--engine-profile``, ``--tp``,
    ``--engine-python``, ``--engine-arg``, ``--engine-env``, ``--host``, ``--port``,
    ``--start-timeout``; ``--served-model-name`` and ``--engine-probe`` too), the engine profile
    applied under the flags.

    ``model``: a local model folder (None: the embedded tiny model); ``tp``: tensor-parallel
    size; ``python``: the Python that has vLLM; ``args``: the engine's arguments (the profile's
    engine_args, then ``--engine-arg``); ``env``: NAME -> VALUE (the profile's [env], then
    ``--engine-env``); ``served_model_name``: the model name to request (None: as the server
    lists it; attached engines too); ``host`` / ``port``: the listen address (port None: a free
    one); ``start_timeout_s``: seconds to wait for readiness; ``profile``: the profile's path,
    recorded with each launch; ``gpu_memory_tolerance_mib``: MiB of GPU memory the engines may
    leave held after they stopped (no option); ``probe``: measure the engine first
    (:mod:`pleharness.engine_probe`)."""

    model: str | None = None
    tp: int = 1
    python: str = field(default_factory=lambda: sys.executable)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    served_model_name: str | None = None
    host: str = DEFAULT_HOST
    port: int | None = None
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    profile: str | None = None
    gpu_memory_tolerance_mib: float = 1024.0
    probe: Annotated[bool, Opt(name="engine_probe", panel=P_REF,
                               envvar="PLE_HARNESS_ENGINE_PROBE", help=(
        "Measure the engine first with a few short requests (seeded samples reproduce alone and "
        "in a batch, greedy outputs repeat alone, warm run = cold run; manifest section "
        "engine_probe) and choose the seeded sampled requests from what was measured; off: from "
        "the configuration (only without speculative decoding)."))] = DEFAULT_ENGINE_PROBE


@dataclass(frozen=True)
class AttachConfig:
    """Attaching to a running engine (options ``--url``, ``--api-key-env`` and the attach-only
    facts ``--block-size`` ... ``--dtype``).

    ``url``: the server's base URL (None: the harness launches the engine); ``api_key``: the
    key read from ``--api-key-env`` (a Bearer token, and a launched engine's VLLM_API_KEY);
    ``explicit_facts``: engine fact -> value (block_size, max_num_batched_tokens,
    num_speculative_tokens, max_num_seqs, max_model_len, vocab_size, dtype)."""

    url: str | None = None
    api_key: str | None = None
    explicit_facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SuiteConfig:
    """What runs on the engine (options ``--scenario`` / ``--suite``, ``--ladder``, ``--repeats``,
    ``--max-tokens``, ``--suite-repeats``, ``--api``, ``--logprobs``; fuzz: its search options).

    ``scenarios``: scenario refs (a name, a TOML path, or (kind, params)); ``overrides``:
    parameter overrides by name (ladder, repeats, max_tokens); ``repeat``: suite passes on one
    engine; ``api``: the endpoint of requests with a message form (completions, chat, both:
    ``stress --api`` defaults to both, the other commands send completions); ``logprobs``:
    top-k logprobs per output token (0: off)."""

    scenarios: list = field(default_factory=lambda: list(DEFAULT_SCENARIOS))
    overrides: dict[str, Any] = field(default_factory=dict)
    repeat: int = DEFAULT_SUITE_REPEATS
    api: str = "completions"
    logprobs: Annotated[int, Opt(panel=P_REF, min=0, max=20, help=(
        "Top-k logprobs per output token (needed for near-tie analysis; 0 = off)."))] = \
        DEFAULT_LOGPROBS


@dataclass(frozen=True)
class ReferenceConfig:
    """Where single-request references come from and how they are taken (options
    ``--reference``, ``--reference-engine-arg``, ``--reference-drop-arg``,
    ``--reference-cache-state``, ``--golden-model``).

    ``source``: solo | engine | golden | manifest:PATH; ``engine_args``: appended to the engine's
    for the reference engine; ``drop_args``: flags removed from them; ``cache_state``: warm or
    cold (which run of a reference prompt is kept); ``golden_model``: the golden model's folder
    (None: the served model's)."""

    source: str = DEFAULT_REFERENCE
    engine_args: Annotated[list[str], repeatable(
        name="reference_engine_arg", panel=P_REF,
        help="--reference engine: an argument added to the reference engine, repeatable, e.g. "
             "--reference-engine-arg=--enforce-eager. The reference engine inherits the engine "
             "under test's model, python, tp, env and arguments (profile engine_args, then "
             "--engine-arg); only the port differs. One identical to the engine under test is a "
             "usage error.")] = field(default_factory=list)
    drop_args: Annotated[list[str], repeatable(
        name="reference_drop_arg", panel=P_REF,
        help="--reference engine: remove this flag (and its value) from the inherited "
             "arguments, e.g. --reference-drop-arg=--speculative-config (repeatable).")] = \
        field(default_factory=list)
    cache_state: Annotated[Literal["warm", "cold"], Opt(
        name="reference_cache_state", panel=P_REF,
        help="warm: run each reference prompt alone twice, judge the second (prefix-cached) run "
             "against the first, keep the second; cold: keep the first run.")] = \
        DEFAULT_REFERENCE_CACHE_STATE
    golden_model: Annotated[str | None, Opt(panel=P_REF, help=(
        "Model folder for the golden model (default: the launched model's folder; when "
        "attaching with --url, the served model's root when it is a local folder)."))] = None


@dataclass(frozen=True)
class ControlConfig:
    """The control run (options ``--control-engine-arg``, ``--control-drop-arg``,
    ``--control-profile``, ``--control-engine-python``; docs/attribution.md). True when one is
    asked for (any of them given).

    ``engine_args``: appended to the engine's arguments; ``drop_args``: flags removed from them;
    ``profile``: or the control's own engine profile (its path: engine_args and env);
    ``python``: another build's Python for the control engine (None: the engine under
    test's)."""

    engine_args: Annotated[list[str], repeatable(
        name="control_engine_arg", panel=P_CTRL,
        help="Control run: after the engine under test, launch a control engine with its "
             "arguments plus this one (repeatable, = form), run the same suite, and classify "
             "each divergence as also_in_control (engine numerics, a warning) or only_under_test, "
             "e.g. --control-engine-arg=--enforce-eager.")] = field(default_factory=list)
    drop_args: Annotated[list[str], repeatable(
        name="control_drop_arg", panel=P_CTRL,
        help="Control run: remove this flag (and its value) from the engine's arguments, e.g. "
             "--control-drop-arg=--speculative-config (repeatable; _ and - are the same, as in "
             "vLLM). A flag not among them, or a control identical to the engine under test, is "
             "a usage error.")] = field(default_factory=list)
    profile: Annotated[str | None, Opt(
        name="control_profile", panel=P_CTRL, cli_type=Path | None,
        parse=lambda p: None if p is None else str(p),
        help="Control run: the control engine's own profile, a path or a shipped name; only its "
             "engine_args and env apply (model, python, tp, host: the engine under test's, with a "
             "warning).")] = None
    python: Annotated[str | None, Opt(
        name="control_engine_python", panel=P_CTRL,
        help="Control run on another build: the control engine is launched with this Python "
             "(e.g. the BASE build's virtual environment beside HEAD's --engine-python), the "
             "same model and arguments unless --control-engine-arg / --control-drop-arg change "
             "them; every solo greedy answer of the two builds is compared (pre-merge: 'HEAD "
             "answers differently from BASE here').")] = None

    def __bool__(self) -> bool:
        """Whether a control run is asked for (any --control-* option)."""
        return bool(self.engine_args or self.drop_args or self.profile or self.python)


@dataclass(frozen=True)
class VerdictConfig:
    """How a divergence and a timed-out phase are judged (options ``--near-tie-nats``,
    ``--strict``, ``--golden``, ``--on-timeout``).

    ``near_tie_nats``: the near-tie threshold, nats (None: from the serving dtype,
    :mod:`pleharness.divergence`, raised to the run's measured numerics envelope,
    :mod:`pleharness.envelope`); ``strict``: any divergence fails; ``numerics_from``: without
    a control run, the run whose measured envelope applies (a run folder or manifest path, or
    ``self``; ``--numerics-from``); ``golden``: classify
    divergences with the golden model when one can be built; ``on_timeout``: continue or abort
    after a phase with timed-out requests."""

    near_tie_nats: Annotated[float | None, Opt(panel=P_REF, min=0.0, max=100.0, help=(
        "A divergence whose top-1/top-2 gap is below this (nats) is a near tie (warning), else "
        "hard (failure). Default: from the serving dtype: bfloat16 0.5, float16 0.0625, float32 "
        "0.01 (see pleharness/divergence.py)."))] = None
    strict: Annotated[bool, Opt(panel=P_REF, help=(
        "Any divergence fails, near ties too (for batch-invariant engines)."))] = DEFAULT_STRICT
    numerics_from: Annotated[str | None, Opt(panel=P_REF, help=(
        "Without a control run: take the engine's numerics envelope (how far its own numerics "
        "move logprobs and flip tokens; it sets the logprob tolerance and the near-tie "
        "threshold) from a clean run of this engine and configuration (its folder or "
        "manifest), or 'self' for a run that is itself the clean measurement. Default: "
        "measured on the control run; without one the dtype bound applies "
        "(docs/references.md)."))] = None
    golden: Annotated[bool, Opt(panel=P_REF, help=(
        "Classify each divergence with the golden model (transformers float32, started on the "
        "first divergence) when the model is a local folder that fits in memory: "
        "teacher-forced logprobs decide near tie vs hard."))] = DEFAULT_GOLDEN
    on_timeout: Annotated[Literal["continue", "abort"], Opt(panel=P_TIME, help=(
        "After a phase with timed-out requests (recorded as 'timeout', the phase fails): "
        "continue with the next phase, or abort the run (status incomplete)."))] = \
        DEFAULT_ON_TIMEOUT


@dataclass(frozen=True)
class OutputConfig:
    """Where the run folder goes (options ``--results-dir``, ``--run-id``), and how the run was
    started (``invocation``: the command line, secrets redacted, recorded in the manifest)."""

    results_dir: Annotated[Path, Opt(panel=P_OUT, cli_type=str, parse=Path, help=(
        "Where run folders are created."))] = Path(DEFAULT_RESULTS_DIR)
    run_id: Annotated[str | None, Opt(panel=P_OUT, help=(
        "Name of the run folder (must not exist). Default: timestamp + random suffix."))] = None
    invocation: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ConfirmationConfig:
    """Replaying the reproducers a run writes (options ``--confirm-runs``,
    ``--parallel-engines``; :mod:`pleharness.reproduce`).

    ``runs``: replays of each reproducer, each on a fresh engine (0: skip); ``runs_given``:
    ``--confirm-runs`` was on the command line; ``parallel_engines``: engines side by side
    (None: auto), for the replays and the control engine."""

    runs: Annotated[int, Opt(name="confirm_runs", panel=P_REF, min=0, max=100, help=(
        confirm_runs_help("each reproducer a scenario writes (the fuzz kind's repro.toml)")))] = \
        DEFAULT_CONFIRM_RUNS
    runs_given: bool = False
    parallel_engines: Annotated[int | None, Opt(panel=P_REF, cli_type=str, parse=parse_parallel,
                                                help=PARALLEL_ENGINES_HELP)] = \
        DEFAULT_PARALLEL_ENGINES


@dataclass(frozen=True)
class StressConfig:
    """Resolved options of one ``ple-harness stress`` run (see ``ple-harness stress --help``), one
    config group per option group, built once by the command line
    (:mod:`pleharness.cli.assemble`) and passed whole; a replay is the same config with another
    suite (:mod:`pleharness.reproduce`). ``timeouts``: the per-request timeouts, seconds
    (``--connect-timeout`` ... ``--request-timeout``).

    :meth:`validate` checks the options that depend on each other; :func:`run_stress` calls it
    before anything is read or started.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    attach: AttachConfig = field(default_factory=AttachConfig)
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    output: OutputConfig = field(default_factory=OutputConfig)
    confirmation: ConfirmationConfig = field(default_factory=ConfirmationConfig)

    @property
    def reference_mode(self) -> str:
        """solo | engine | manifest | golden (``--reference manifest:PATH`` gives manifest)."""
        return self.reference.source.split(":", 1)[0]

    def validate(self) -> None:
        """Raise UsageError (naming the option) for a malformed value or a combination that
        cannot run; nothing has been read or started yet."""
        mode, v, ref = self.reference_mode, self.verdict, self.reference
        for bad, msg in (
            (v.on_timeout not in ("continue", "abort"),
             f"--on-timeout {v.on_timeout!r}: expected continue or abort"),
            (self.suite.repeat < 1, "--suite-repeats must be >= 1"),
            (self.confirmation.runs < 0, f"--confirm-runs {self.confirmation.runs}: expected 0 "
                                         "(skip) or more replays"),
            (self.suite.api not in ("completions", "chat", "both"),
             f"--api {self.suite.api!r}: expected completions, chat or both"),
            (ref.cache_state not in ("cold", "warm"),
             f"--reference-cache-state {ref.cache_state!r}: expected cold or warm"),
            (mode not in REFERENCE_MODES,
             f"--reference {ref.source!r}: expected solo, engine, golden or manifest:PATH"),
            (mode == "golden" and not v.golden,
             "--reference golden needs the golden model (drop --no-golden)"),
            (mode == "engine" and self.attach.url is not None,
             "--reference engine needs a launched engine (not --url)"),
            (self.control and self.attach.url is not None,
             "--control-engine-arg / --control-drop-arg / --control-profile need a launched "
             "engine (not --url): the harness launches the control"),
            (ref.golden_model is not None and not Path(ref.golden_model).is_dir(),
             f"--golden-model {ref.golden_model}: not a model folder (checked before the "
             "engine, so that a typo does not cost an engine start)"),
        ):
            if bad:
                raise UsageError(msg)

    def target(self, console: Console) -> Target:
        """Resolve the engine target (:func:`pleharness.engine.session.resolve_target`); raises
        UsageError when the model, the engine's Python or the URL is not usable."""
        e = self.engine
        return resolve_target(url=self.attach.url, model=e.model, python=e.python, tp=e.tp,
                              engine_args=e.args, engine_env=e.env,
                              served_name=e.served_model_name, host=e.host, port=e.port,
                              api_key=self.attach.api_key, start_timeout_s=e.start_timeout_s,
                              log=console.print)
