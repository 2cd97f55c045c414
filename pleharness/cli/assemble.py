"""One assembly of the configuration: a builder per config group of :mod:`pleharness.config`
from the option values of the command line (a dict by Python name, as
:func:`pleharness.cli.options.values` gives them, and the names given on the command line),
used by ``stress``, ``fuzz``, ``selftest`` and ``facts`` alike. Each command builds the groups
it has options for and keeps the groups' defaults for the rest (fuzz builds its own suite,
selftest its verdict). The rules the values are checked by are :mod:`pleharness.config`'s;
every problem is a :class:`~pleharness.errors.UsageError` naming the option, raised before
anything is read or started."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config import (ATTACH_FACTS, DEFAULT_SCENARIOS, ENV_NAME, AttachConfig,
                      ConfirmationConfig, ControlConfig, EngineConfig, OutputConfig,
                      ReferenceConfig, StressConfig, SuiteConfig, VerdictConfig,
                      check_control_profile, engine_arg_problems, find_profile, option_problems,
                      parse_env, parse_ladder, program, raise_all)
from ..defaults import (DEFAULT_API, DEFAULT_ENGINE_PROBE, DEFAULT_GOLDEN, DEFAULT_HOST,
                        DEFAULT_ON_TIMEOUT, DEFAULT_PARALLEL_ENGINES, DEFAULT_RESULTS_DIR,
                        DEFAULT_START_TIMEOUT_S, DEFAULT_STRICT)
from ..divergence import normalize_dtype
from ..engine.inflight import Timeouts
from ..engine.launch import engine_python_check
from ..engine.side_by_side import parse_parallel
from ..errors import UsageError
from ..profile import EngineProfile, load_profile
from ..redact import redact_argv
from ..suites import load_suite


def engine_groups(o: Mapping[str, Any], given: Iterable[str]
                  ) -> tuple[EngineConfig, AttachConfig]:
    """The engine and attach groups (``o``: option values by Python name, as
    :func:`pleharness.config.option_problems` takes them), the engine profile (a path or a
    shipped name) applied under the flags. Raises UsageError naming the option (all conflicting
    options of ``o`` at once, then a bad profile, --dtype or --api-key-env)."""
    raise_all(option_problems(o, given))
    profile_path = find_profile(o["engine_profile"]) if o.get("engine_profile") else None
    prof = load_profile(profile_path) if profile_path else EngineProfile()
    raise_all(engine_arg_problems(prof.engine_args, f"{profile_path}: engine_args item"))
    if o.get("dtype") is not None:
        if normalize_dtype(o["dtype"]) is None:
            raise UsageError(f"--dtype {o['dtype']!r}: expected bfloat16, float16 or float32")
    api_key = api_key_from_env(o.get("api_key_env"))
    env = {**prof.env, **parse_env(o.get("engine_env") or [])}
    if o.get("compile_cache"):
        env["VLLM_CACHE_ROOT"] = compile_cache_dir(o["compile_cache"], env.get("VLLM_CACHE_ROOT"))
    engine = EngineConfig(
        model=o.get("model") or prof.model, tp=o.get("tp") or prof.tp or 1,
        python=o.get("engine_python") or prof.python or sys.executable,
        args=prof.engine_args + list(o.get("engine_arg") or []),
        env=env,
        served_model_name=o.get("served_model_name") or prof.served_model_name,
        host=o.get("host") or prof.host or DEFAULT_HOST, port=o.get("port"),
        start_timeout_s=o.get("start_timeout", DEFAULT_START_TIMEOUT_S),
        profile=str(profile_path) if profile_path else None,
        probe=o.get("engine_probe", DEFAULT_ENGINE_PROBE))
    attach = AttachConfig(url=o.get("url"), api_key=api_key,
                          explicit_facts={fact: o[name] for name, _, _, fact in ATTACH_FACTS
                                          if o.get(name) is not None})
    return engine, attach


def compile_cache_dir(value: str, env_value: str | None = None) -> str:
    """``--compile-cache``'s folder as an absolute path (``~`` expanded), created if missing.
    Raises UsageError when ``env_value`` (a ``VLLM_CACHE_ROOT`` the profile or ``--engine-env``
    set) names another folder, or the folder cannot be created or written."""
    path = os.path.abspath(os.path.expanduser(value))
    if env_value is not None and os.path.abspath(os.path.expanduser(env_value)) != path:
        raise UsageError(f"--compile-cache {value}: VLLM_CACHE_ROOT={env_value} is set too (the "
                         "profile's [env] or --engine-env): give the folder once")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--compile-cache {value}: cannot create it ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--compile-cache {value}: not writable by this user")
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


def verdict_group(o: Mapping[str, Any]) -> VerdictConfig:
    """The verdict group (``--near-tie-nats``, ``--strict``, ``--golden``, ``--on-timeout``; a
    command without one of them keeps its default)."""
    numerics_from = o.get("numerics_from")
    if numerics_from is not None and numerics_from != "self":
        p = Path(numerics_from)
        if not (p / "manifest.json").is_file() and not p.is_file():
            raise UsageError(f"--numerics-from {numerics_from!r}: not a run folder or manifest "
                             "(or 'self')")
    return VerdictConfig(near_tie_nats=o.get("near_tie_nats"),
                         strict=o.get("strict", DEFAULT_STRICT), numerics_from=numerics_from,
                         golden=o.get("golden", DEFAULT_GOLDEN),
                         on_timeout=_value(o.get("on_timeout", DEFAULT_ON_TIMEOUT)))


def output_group(o: Mapping[str, Any]) -> OutputConfig:
    """The output group (``--results-dir``, ``--run-id``) and the invocation, as this harness
    was started (:func:`pleharness.config.program`), secrets redacted."""
    return OutputConfig(results_dir=Path(o.get("results_dir", DEFAULT_RESULTS_DIR)),
                        run_id=o.get("run_id"),
                        invocation=redact_argv(program() + sys.argv[1:]))


def suite_group(o: Mapping[str, Any], given: Iterable[str]) -> SuiteConfig:
    """``stress``'s suite group: the suite file's scenarios and repeat (unless --scenario /
    --suite-repeats), the scenario overrides (--ladder, --repeats, --max-tokens), --api and
    --logprobs. Raises UsageError for a bad suite or ladder."""
    suite = load_suite(o["suite"]) if o.get("suite") is not None else None
    overrides = {k: v for k, v in (("ladder", None if o["ladder"] is None
                                    else parse_ladder(o["ladder"])),
                                   ("repeats", o["repeats"]), ("max_tokens", o["max_tokens"]))
                 if v is not None}
    explicit_repeats = "suite_repeats" in set(given) or o["repeat_old"] is not None
    return SuiteConfig(
        scenarios=suite.scenario_refs() if suite else list(o["scenario"] or DEFAULT_SCENARIOS),
        overrides=overrides,
        repeat=(o["repeat_old"] or o["suite_repeats"]) if explicit_repeats or not suite
        else suite.repeat,
        api=_value(o.get("api", DEFAULT_API)), logprobs=o["logprobs"])


def reference_group(o: Mapping[str, Any]) -> ReferenceConfig:
    """The reference group (``--reference``, ``--reference-engine-arg``,
    ``--reference-drop-arg``, ``--reference-cache-state``, ``--golden-model``)."""
    return ReferenceConfig(source=o["reference"],
                           engine_args=list(o["reference_engine_arg"] or []),
                           drop_args=list(o["reference_drop_arg"] or []),
                           cache_state=_value(o["reference_cache_state"]),
                           golden_model=o["golden_model"])


def control_group(o: Mapping[str, Any], warn: Callable[[str], None]) -> ControlConfig:
    """The control group; a --control-profile is found and checked now
    (:func:`pleharness.config.check_control_profile`, ``warn`` about the keys it ignores)."""
    profile = (check_control_profile(o["control_profile"], warn)
               if o.get("control_profile") else None)
    python = o.get("control_engine_python")
    if python is not None:
        problem = engine_python_check(python)
        if problem:
            raise UsageError(f"--control-engine-python {python}: {problem}")
    return ControlConfig(engine_args=list(o["control_engine_arg"] or []),
                         drop_args=list(o["control_drop_arg"] or []), python=python,
                         profile=str(profile) if profile else None)


def timeouts_group(o: Mapping[str, Any]) -> Timeouts:
    """The per-request timeouts, seconds (``--connect-timeout``, ``--first-token-timeout``,
    ``--between-tokens-timeout``, ``--request-timeout``)."""
    return Timeouts(o["connect_timeout"], o["first_token_timeout"],
                    o["between_tokens_timeout"], o["request_timeout"])


def confirmation_group(o: Mapping[str, Any], given: Iterable[str]) -> ConfirmationConfig:
    """The confirmation group (``--confirm-runs``, whether it was given, and
    ``--parallel-engines``: a number or auto). Raises UsageError for a bad --parallel-engines."""
    return ConfirmationConfig(
        runs=o["confirm_runs"], runs_given="confirm_runs" in set(given),
        parallel_engines=parse_parallel(o.get("parallel_engines", DEFAULT_PARALLEL_ENGINES)))


def stress_config(o: Mapping[str, Any], given: Iterable[str],
                  warn: Callable[[str], None]) -> StressConfig:
    """The :class:`~pleharness.config.StressConfig` of ``ple-harness stress`` from its option
    values by Python name (``o``) and the names given on the command line: every group of it,
    checked in this order (the engine and attach groups first, with every conflicting option
    at once, then the suite, the control profile, --parallel-engines). Raises UsageError
    naming the option."""
    given = frozenset(given)
    engine, attach = engine_groups(o, given)
    suite = suite_group(o, given)
    control = control_group(o, warn)
    if o.get("suite") is not None and not control:
        need = load_suite(o["suite"]).control
        if need.required:
            raise UsageError(f"--suite {o['suite']}: its runs need a control run ("
                             f"{need.why or 'a defect that corrupts every run alike passes without one'}); "
                             "give --control-engine-python BASE/bin/python (HEAD against BASE), "
                             "or --control-drop-arg / --control-engine-arg / --control-profile")
    return StressConfig(engine=engine, attach=attach, suite=suite, reference=reference_group(o),
                        control=control, verdict=verdict_group(o), timeouts=timeouts_group(o),
                        output=output_group(o), confirmation=confirmation_group(o, given))


def _value(choice: Any) -> Any:
    """An Enum choice's value (the CLI's choices are str Enums), else the value itself."""
    return getattr(choice, "value", choice)
