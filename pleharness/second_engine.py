"""The second engines of a stress run, the reference engine (``--reference engine``) and the
control engine (``--control``): their launch as a :class:`~pleharness.engine.session.Variant` of
the engine under test's, the usage errors for one that would change nothing
(:func:`second_engine_problems`), and the side-by-side plan of the control engine and the
confirmation replays (:func:`side_by_side_plan`). The passes that run on them are
:mod:`pleharness.passes`."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .attribution import same_config_problem, unused_drops
from .config import StressConfig
from .engine.fact_sources import positions_warning
from .engine.session import Target, Variant
from .engine.side_by_side import SideBySide, model_bytes
from .engine.side_by_side import plan as plan_side_by_side
from .environment import gpu_inventory
from .errors import UsageError
from .profile import load_profile


REFERENCE_INHERITS = ("the engine under test's model, python, tp, host, environment and "
                      "arguments (profile engine_args, then --engine-arg), less "
                      "--reference-drop-arg flags, plus --reference-engine-arg values; only the "
                      "port differs (a free one)")


def reference_variant(cfg: StressConfig) -> Variant:
    """The reference engine's launch: see :data:`REFERENCE_INHERITS`."""
    return Variant.of(drop=cfg.reference.drop_args, add=cfg.reference.engine_args)


def control_variant(cfg: StressConfig) -> Variant:
    """The control engine's launch: the engine under test's arguments less --control-drop-arg
    flags plus --control-engine-arg values, or --control-profile's engine_args (plus
    --control-engine-arg) with its [env] over the engine's environment; launched with
    --control-engine-python when given (another build)."""
    if cfg.control.profile:
        prof = load_profile(Path(cfg.control.profile))
        return Variant.of(add=cfg.control.engine_args, env=prof.env, base=prof.engine_args,
                          python=cfg.control.python)
    return Variant.of(drop=cfg.control.drop_args, add=cfg.control.engine_args,
                      python=cfg.control.python)


def reference_config(cfg: StressConfig, target: Target) -> tuple[list[str], dict[str, str]]:
    """The reference engine's (arguments, environment) (:func:`reference_variant`)."""
    return reference_variant(cfg).apply(target.engine_args, target.engine_env)


def control_config(cfg: StressConfig, target: Target) -> tuple[list[str], dict[str, str]]:
    """The control engine's (arguments, environment) (:func:`control_variant`)."""
    return control_variant(cfg).apply(target.engine_args, target.engine_env)


def second_engine_problems(cfg: StressConfig, target: Target) -> list[str]:
    """Usage-error lines for a control or reference engine that would change nothing: a dropped
    flag that is not among the engine's arguments, or a configuration identical to the engine
    under test's after the profile, --engine-arg and the drops are applied (issue 25: an
    identical control turns every deterministic corruption into ``also_in_control``)."""
    out: list[str] = []
    if target.url is not None:
        return out
    for flag, drops, active in (("--control-drop-arg", cfg.control.drop_args, cfg.control),
                                ("--reference-drop-arg", cfg.reference.drop_args,
                                 cfg.reference_mode == "engine")):
        if not active:
            continue
        for d in unused_drops(target.engine_args, drops):
            out.append(f"{flag}={d}: not among the engine under test's arguments "
                       f"({' '.join(target.engine_args) or 'none'}), so dropping it changes "
                       "nothing")
    other_build = cfg.control.python is not None and cfg.control.python != target.python
    if cfg.control and not out and not other_build:
        args, env = control_config(cfg, target)
        hint = " and ".join(x for x, v in (
            (f"--control-profile {cfg.control.profile}", cfg.control.profile),
            ("--control-drop-arg " + " ".join(cfg.control.drop_args), cfg.control.drop_args),
            ("--control-engine-arg " + " ".join(cfg.control.engine_args),
             cfg.control.engine_args)) if v)
        p = same_config_problem(hint, "control", args, env, target.engine_args, target.engine_env)
        if p:
            out.append(p)
    if cfg.reference_mode == "engine" and not out:
        args, env = reference_config(cfg, target)
        given = " and ".join(x for x, v in (
            ("--reference-drop-arg " + " ".join(cfg.reference.drop_args), cfg.reference.drop_args),
            ("--reference-engine-arg " + " ".join(cfg.reference.engine_args),
             cfg.reference.engine_args)) if v)
        p = same_config_problem(given or "--reference engine without --reference-engine-arg or "
                                "--reference-drop-arg", "reference", args, env,
                                target.engine_args, target.engine_env)
        if p:
            out.append(p)
    return out


def raise_if_second_engine_is_the_same(cfg: StressConfig, target: Target) -> None:
    """Raise UsageError with every line of :func:`second_engine_problems`, if any."""
    problems = second_engine_problems(cfg, target)
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} problems with the options:\n"
                         + "\n".join(f"  - {x}" for x in problems))


def with_second_engine_warnings(cfg: StressConfig, target: Target) -> Target:
    """``target`` with the positions warnings of its control and reference engines' own
    launches added (:func:`~pleharness.engine.fact_sources.positions_warning`: a
    ``--control-engine-arg=--max-model-len N`` beyond the model's declared length dies or
    answers outside the model's positions as the engine under test's would), each led by its
    role; a warning equal to the engine under test's is not repeated. Attached: unchanged."""
    if cfg.attach.url is not None or target.model_path is None:
        return target
    extra = []
    for role, on, config in (("control engine", bool(cfg.control), control_config),
                             ("reference engine", cfg.reference_mode == "engine",
                              reference_config)):
        if on:
            w = positions_warning(target.model_path, *config(cfg, target))
            if w and w not in target.warnings:
                extra.append(f"{role}: {w}")
    return replace(target, warnings=(*target.warnings, *extra)) if extra else target


def side_by_side_plan(cfg: StressConfig, target: Target) -> SideBySide:
    """The side-by-side plan of the run's confirmation replays and of its control engine
    (``--parallel-engines``; :func:`pleharness.engine.side_by_side.plan`): one at a time when
    attached, or with neither confirmations nor a control. Raises UsageError when the engines
    asked for do not fit."""
    if cfg.attach.url is not None or not (cfg.confirmation.runs or cfg.control) or \
            cfg.confirmation.parallel_engines == 1:
        return SideBySide()
    return plan_side_by_side(cfg.confirmation.parallel_engines, gpus=gpu_inventory(),
                             model=model_bytes(target.model_path),
                             engine_args=target.engine_args, engine_env=target.engine_env)
