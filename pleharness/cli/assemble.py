"""One assembly of the configuration: a builder per config group of :mod:`pleharness.config`
from the typed option groups of the command line (:mod:`pleharness.cli.options`), used by
``stress``, ``fuzz``, ``selftest`` and ``facts`` alike. Each builder reads the attributes of the
groups it is given (a command without a group passes the group's defaults or the one value it
fixes: fuzz builds its own suite, selftest its verdict). :func:`option_problems` holds the
cross-option rules of the command line (a launch option with ``--url``, an attach-only fact
without it, ...); the value rules are :mod:`pleharness.config`'s. Every problem is a
:class:`~pleharness.errors.UsageError` naming the option, raised before anything is read or
started."""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from ..config import (DEFAULT_SCENARIOS, AttachConfig, ConfirmationConfig, ControlConfig,
                      EngineConfig, OutputConfig, ReferenceConfig, StressConfig, SuiteConfig,
                      VerdictConfig)
from ..defaults import DEFAULT_HOST
from ..divergence import normalize_dtype
from ..engine.inflight import Timeouts
from ..engine.launch import engine_python_check
from ..envelope import envelope_of_run
from ..errors import UsageError
from ..option_rules import (ENV_NAME, check_control_profile, check_url, engine_arg_problems,
                            find_profile, parse_env, parse_ladder, program, raise_all)
from ..profile import EngineProfile, load_profile
from ..redact import redact_argv
from ..suites import load_suite
from .options import (AttachOptions, ControlOptions, EngineOptions, GoldenProbeOptions,
                      OutputOptions, ReferenceOptions, ScenarioOptions, TimeoutOptions,
                      VerdictOptions, config_values)

# launch-only options (python name, flag): given with --url, a usage error
LAUNCH_ONLY = [("model", "--model"), ("engine_profile", "--engine-profile"), ("tp", "--tp"),
               ("engine_python", "--engine-python"), ("engine_arg", "--engine-arg"),
               ("engine_env", "--engine-env"), ("host", "--host"), ("port", "--port"),
               ("start_timeout", "--start-timeout"), ("compile_cache", "--compile-cache"),
               ("reference_engine_arg", "--reference-engine-arg"),
               ("reference_drop_arg", "--reference-drop-arg"),
               ("control_engine_arg", "--control-engine-arg"),
               ("control_drop_arg", "--control-drop-arg"), ("control_profile", "--control-profile"),
               ("control_engine_python", "--control-engine-python"),
               ("parallel_engines", "--parallel-engines")]
# attach-only fact options: (AttachOptions field, flag, how a launched engine gets that value,
# the AttachConfig.explicit_facts key)
ATTACH_FACTS = [
    ("block_size", "--block-size", "--engine-arg --block-size=N", "block_size"),
    ("chunk_size", "--chunk-size", "--engine-arg --max-num-batched-tokens=N",
     "max_num_batched_tokens"),
    ("num_speculative_tokens", "--num-speculative-tokens",
     "--engine-arg '--speculative-config={...\"num_speculative_tokens\": N}'",
     "num_speculative_tokens"),
    ("max_num_seqs", "--max-num-seqs", "--engine-arg --max-num-seqs=N", "max_num_seqs"),
    ("max_model_len", "--max-model-len", "--engine-arg --max-model-len=N", "max_model_len"),
    ("vocab_size", "--vocab-size", "the model's config.json", "vocab_size"),
    ("dtype", "--dtype", "--engine-arg --dtype=D, else the model's config.json", "dtype")]


def option_problems(engine: EngineOptions, attach: AttachOptions, *, given: Iterable[str],
                    results_dir: str, reference: str | None = None,
                    scen: ScenarioOptions | None = None, ref: ReferenceOptions | None = None,
                    control: ControlOptions | None = None) -> list[str]:
    """Every conflicting, ignored or malformed option of a run command, found before anything is
    read or started (one usage error lists them all). ``given``: the option names given on the
    command line or through the environment; ``reference``: ``--reference`` (None: the command
    has none); a group the command lacks is None (its defaults, nothing given)."""
    given = set(given)
    scen, ref, control = scen or ScenarioOptions(), ref or ReferenceOptions(), \
        control or ControlOptions()
    out: list[str] = []
    if attach.url is not None:
        problem = check_url(attach.url)
        if problem:
            out.append(problem)
        launch = [flag for name, flag in LAUNCH_ONLY if name in given]
        if launch:
            out.append(f"{', '.join(launch)}: launch option(s), but --url attaches to a running "
                       "engine that the harness does not start (drop them, or drop --url)")
        if reference == "engine":
            out.append("--reference engine needs a launched engine (not --url): the reference "
                       "engine is a second launch")
    else:
        for name, flag, how, _ in ATTACH_FACTS:
            if name in given:
                out.append(f"{flag} is for attaching with --url only: it would override the "
                           f"launched engine's real value; a launched engine takes it from "
                           f"{how}")
        for name, flag in (("reference_engine_arg", "--reference-engine-arg"),
                           ("reference_drop_arg", "--reference-drop-arg")):
            if name in given and reference != "engine":
                out.append(f"{flag} is ignored without --reference engine")
    if str(results_dir).strip() == "":
        out.append("--results-dir '': expected a folder path (e.g. results)")
    if scen.suite is not None and scen.scenario:
        out.append("--suite and --scenario cannot be combined (a suite names its scenarios)")
    if scen.repeat_old is not None and "suite_repeats" in given:
        out.append("--repeat (deprecated) and --suite-repeats given together: use --suite-repeats")
    engine_args = (("--engine-arg", engine.engine_arg),
                   ("--reference-engine-arg", ref.reference_engine_arg),
                   ("--control-engine-arg", control.control_engine_arg))
    for flag, items in engine_args:
        out += engine_arg_problems(list(items or []), flag)
    for flag, items in (*engine_args, ("--control-drop-arg", control.control_drop_arg),
                        ("--reference-drop-arg", ref.reference_drop_arg)):
        flags = [a for a in (items or []) if str(a).startswith("-")]
        twice = sorted({a for a in flags if flags.count(a) > 1})
        if twice:
            out.append(f"{flag} {', '.join(twice)}: given more than once (once is enough; a "
                       "repeated engine flag is a typo more often than an intent)")
    return out


def engine_groups(engine: EngineOptions, attach: AttachOptions, *, probe: bool
                  ) -> tuple[EngineConfig, AttachConfig]:
    """The engine and attach groups, the engine profile (a path or a shipped name) applied under
    the flags; ``probe``: ``--engine-probe`` (a command without it passes its value). The
    cross-option rules (:func:`option_problems`) are checked before. Raises UsageError naming
    the option (a bad profile, --dtype or --api-key-env)."""
    try:
        profile_path = find_profile(engine.engine_profile) if engine.engine_profile else None
    except UsageError as exc:
        raise UsageError(f"--engine-profile: {exc}") from None
    prof = load_profile(profile_path) if profile_path else EngineProfile()
    raise_all(engine_arg_problems(prof.engine_args, f"{profile_path}: engine_args item"))
    if attach.dtype is not None:
        if normalize_dtype(attach.dtype) is None:
            raise UsageError(f"--dtype {attach.dtype!r}: expected bfloat16, float16 or float32")
    api_key = api_key_from_env(attach.api_key_env)
    env = {**prof.env, **parse_env(engine.engine_env or [])}
    if engine.compile_cache:
        env["VLLM_CACHE_ROOT"] = compile_cache_dir(engine.compile_cache, env.get("VLLM_CACHE_ROOT"))
    eng = EngineConfig(
        model=engine.model or prof.model, tp=engine.tp or prof.tp or 1,
        python=engine.engine_python or prof.python or sys.executable,
        args=prof.engine_args + list(engine.engine_arg or []),
        env=env,
        served_model_name=attach.served_model_name or prof.served_model_name,
        host=engine.host or prof.host or DEFAULT_HOST, port=engine.port,
        start_timeout_s=engine.start_timeout,
        profile=str(profile_path) if profile_path else None,
        probe=probe)
    facts = {fact: getattr(attach, name) for name, _, _, fact in ATTACH_FACTS}
    att = AttachConfig(url=attach.url, api_key=api_key,
                       explicit_facts={k: v for k, v in facts.items() if v is not None})
    return eng, att


def compile_cache_dir(value: str, env_value: str | None = None) -> str:
    """``--compile-cache``'s folder as an absolute path (``~`` expanded); not created here (the
    engine's launch creates it: a later usage error leaves nothing behind). Raises UsageError
    when ``env_value`` (a ``VLLM_CACHE_ROOT`` the profile or ``--engine-env`` set) names
    another folder, the path is not a folder, or the folder (or, when missing, the nearest
    folder above it, where it would be created) is not writable by this user."""
    path = os.path.abspath(os.path.expanduser(value))
    if env_value is not None and os.path.abspath(os.path.expanduser(env_value)) != path:
        raise UsageError(f"--compile-cache {value}: VLLM_CACHE_ROOT={env_value} is set too (the "
                         "profile's [env] or --engine-env): give the folder once")
    here = path
    while not os.path.lexists(here):  # the nearest existing folder: where it would be made
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise UsageError(f"--compile-cache {value}: {here} is not a folder")
    if not os.access(here, os.W_OK | os.X_OK):
        raise UsageError(f"--compile-cache {value}: "
                         + ("not writable by this user" if here == path else
                            f"cannot create it ({here} is not writable by this user)"))
    return path


def api_key_from_env(name: str | None) -> str | None:
    """The API key held by the environment variable ``--api-key-env`` names (None: no option).
    Raises UsageError for a value that is no variable name (the key itself given by mistake:
    not echoed), a variable unset or empty, or a key an HTTP header cannot carry (non-ASCII, a
    line break or another control character; the key is never shown)."""
    if not name:
        return None
    if not ENV_NAME.fullmatch(name):
        raise UsageError("--api-key-env: expected the NAME of an environment variable that holds "
                         "the key; the value given is no variable name (not shown: it may be "
                         "the key itself): e.g. --api-key-env OPENAI_API_KEY")
    key = os.environ.get(name)
    if not key:
        raise UsageError(f"--api-key-env {name}: that environment variable is "
                         + ("empty" if name in os.environ else "not set"))
    if not (key.isascii() and key.isprintable()) or key != key.strip():
        raise UsageError(f"--api-key-env {name}: the key it holds has a non-ASCII character, a "
                         "line break, another control character or surrounding blanks, which an "
                         "HTTP Authorization header cannot carry (the key is not shown)")
    return key


def verdict_group(verdict: VerdictOptions, golden: GoldenProbeOptions,
                  timeouts: TimeoutOptions) -> VerdictConfig:
    """The verdict group (``--near-tie-nats``, ``--strict``, ``--numerics-from``, ``--golden``,
    ``--on-timeout``). Raises UsageError for a --numerics-from that is no run."""
    numerics_from = verdict.numerics_from
    if numerics_from is not None and numerics_from != "self":
        p = Path(numerics_from)
        if not (p / "manifest.json").is_file() and not p.is_file():
            raise UsageError(f"--numerics-from {numerics_from!r}: not a run folder or manifest "
                             "(or 'self')")
        envelope_of_run(numerics_from)  # read now: a run that measured nothing is refused
        # before the suite runs, not after it (where the run's own judgement would be lost)
    return VerdictConfig(**config_values(VerdictConfig, verdict, golden, timeouts))


def output_group(output: OutputOptions) -> OutputConfig:
    """The output group (``--results-dir``, ``--run-id``) and the invocation, as this harness
    was started (:func:`pleharness.option_rules.program`), secrets redacted."""
    return OutputConfig(**config_values(OutputConfig, output),
                        invocation=redact_argv(program() + sys.argv[1:]))


def suite_group(scen: ScenarioOptions, ref: ReferenceOptions) -> SuiteConfig:
    """``stress``'s suite group: the suite file's scenarios and repeat (unless --scenario /
    --suite-repeats), the scenario overrides (--ladder, --repeats, --max-tokens), --api and
    --logprobs (of ``ref``). Raises UsageError for a bad suite or ladder."""
    suite = load_suite(scen.suite) if scen.suite is not None else None
    overrides = {k: v for k, v in (("ladder", None if scen.ladder is None
                                    else parse_ladder(scen.ladder)),
                                   ("repeats", scen.repeats), ("max_tokens", scen.max_tokens))
                 if v is not None}
    explicit_repeats = "suite_repeats" in scen.given or scen.repeat_old is not None
    return SuiteConfig(
        scenarios=suite.scenario_refs() if suite else list(scen.scenario or DEFAULT_SCENARIOS),
        overrides=overrides,
        repeat=(scen.repeat_old or scen.suite_repeats) if explicit_repeats or not suite
        else suite.repeat,
        api=scen.api.value, **config_values(SuiteConfig, ref))


def reference_group(reference: str, ref: ReferenceOptions) -> ReferenceConfig:
    """The reference group (``--reference``, ``--reference-engine-arg``,
    ``--reference-drop-arg``, ``--reference-cache-state``, ``--golden-model``)."""
    return ReferenceConfig(source=reference, **config_values(ReferenceConfig, ref))


def control_group(control: ControlOptions, warn: Callable[[str], None]) -> ControlConfig:
    """The control group; a --control-profile is found and checked now
    (:func:`pleharness.option_rules.check_control_profile`, ``warn`` about the keys it ignores)."""
    ctl = ControlConfig(**config_values(ControlConfig, control))
    if ctl.profile:
        ctl = dataclasses.replace(ctl, profile=str(check_control_profile(ctl.profile, warn)))
    if ctl.python is not None:
        problem = engine_python_check(ctl.python)
        if problem:
            raise UsageError(f"--control-engine-python {ctl.python}: {problem}")
    return ctl


def timeouts_group(timeouts: TimeoutOptions) -> Timeouts:
    """The per-request timeouts, seconds (``--connect-timeout``, ``--first-token-timeout``,
    ``--between-tokens-timeout``, ``--request-timeout``)."""
    return Timeouts(**config_values(Timeouts, timeouts))


def confirmation_group(opts, *, runs_given: bool) -> ConfirmationConfig:
    """The confirmation group of the option group ``opts`` that holds ``--confirm-runs`` and
    ``--parallel-engines`` (a number or auto: stress's ReferenceOptions, fuzz's run options), and
    whether the command checks that --confirm-runs was given. Raises UsageError for a bad
    --parallel-engines."""
    return ConfirmationConfig(**config_values(ConfirmationConfig, opts), runs_given=runs_given)


def stress_config(*, engine: EngineOptions, attach: AttachOptions, scen: ScenarioOptions,
                  reference: str, control: ControlOptions, golden: GoldenProbeOptions,
                  ref: ReferenceOptions, verdict: VerdictOptions, timeouts: TimeoutOptions,
                  output: OutputOptions, warn: Callable[[str], None]) -> StressConfig:
    """The :class:`~pleharness.config.StressConfig` of ``ple-harness stress`` from its option
    groups (``reference``: ``--reference``): every group of it, checked in this order (every
    conflicting option at once, the engine and attach groups, then the suite, the control
    profile, --parallel-engines). Raises UsageError naming the option."""
    groups = (engine, attach, scen, control, golden, ref, verdict, timeouts, output)
    raise_all(option_problems(engine, attach, given=frozenset().union(*(g.given for g in groups)),
                              results_dir=output.results_dir, reference=reference, scen=scen,
                              ref=ref, control=control))
    eng, att = engine_groups(engine, attach, probe=golden.engine_probe)
    suite = suite_group(scen, ref)
    ctrl = control_group(control, warn)
    if scen.suite is not None and not ctrl:
        need = load_suite(scen.suite).control
        if need.required:
            raise UsageError(f"--suite {scen.suite}: its runs need a control run ("
                             f"{need.why or 'a defect that corrupts every run alike passes without one'}); "
                             "give --control-engine-python BASE/bin/python (HEAD against BASE), "
                             "or --control-drop-arg / --control-engine-arg / --control-profile")
    return StressConfig(engine=eng, attach=att, suite=suite,
                        reference=reference_group(reference, ref), control=ctrl,
                        verdict=verdict_group(verdict, golden, timeouts),
                        timeouts=timeouts_group(timeouts), output=output_group(output),
                        confirmation=confirmation_group(
                            ref, runs_given="confirm_runs" in ref.given))
