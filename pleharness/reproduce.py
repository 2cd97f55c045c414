"""Confirming a reproducer: replay it on a freshly started engine of the same configuration, N
times, and say how often it fails (the reproduction rate).

Why (shared/DESIGN.md, "A reproducer is only confirmed on a fresh engine"; issue 23): inside one
engine process, references cached from earlier requests and the engine's state (what ran first,
what is prefix-cached) can make a failure look reproducible that is not. A fuzz reproducer that
was "confirmed" in the process it came from passed when replayed on a fresh engine of the same
buggy configuration (H200, vLLM 0.26). So every reproducer the harness writes (fuzz's
``repro.toml``, explain's ``repro-N.toml``) is replayed as its own ``ple-harness stress --scenario
FILE`` run, each on a newly launched engine (same model, Python, arguments and environment as
the run it came from), and judged like any run: exit 1 (a parity or check failure) is a
reproduction, exit 0 is not, anything else (the engine failed to start, a usage error) is an
error that counts as neither. A passing replay whose inserts did not reach the engine while
their carrier ran (phase check ``inserts_landed``) did not exercise the schedule: it is
*inconclusive*, left out of the rate and replaced by another replay (up to N more).

Each replay is a whole ``stress`` run (:func:`pleharness.pipeline.replay_reproducer`, which runs
:func:`pleharness.pipeline.run_stress`; this module holds what a replay is and how its result
reads, and imports no step of a run), so its engine lives in that run's
:class:`~pleharness.engine.session.EngineSession` (launched, waited for, stopped with its process
group on every exit path); a replay interrupted by SIGINT / SIGTERM ends the confirmation with
:class:`~pleharness.engine.session.Interrupted`, which the caller's own session reports.

Attached engines (``--url``): no fresh engine can be started, so the replays run on the same
engine, and the result says so (``fresh_engine: false``).

Result (a :class:`~pleharness.manifest.tables.Confirmation`, stored in the manifest's
``reproducers`` table (:class:`~pleharness.manifest.tables.ReproducerRow`) and shown in the
reports; its JSON)::

    {"runs": 3, "reproduced": 3, "errors": 0, "inconclusive": 0, "fresh_engine": true,
     "rate": "3/3", "verdict": "reproduced 3/3 on fresh engines",
     "replays": [{"run": 1, "exit_code": 1, "reproduced": true, "manifest": "...",
                  "failing": ["r2-... differs from its reference at token position 5"]}, ...]}
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import (ConfirmationConfig, ControlConfig, EngineConfig, OutputConfig,
                     ReferenceConfig, StressConfig, SuiteConfig, VerdictConfig)
from .defaults import DEFAULT_START_TIMEOUT_S
from .engine.session import Target
from .engine.spares import SpareEngines
from .errors import UsageError
from .manifest import Manifest, load_manifest
from .option_rules import find_profile
from .profile import load_profile
from .redact import REDACTED
from .manifest.tables import ReproducerRow


@dataclass
class ReplayTarget:
    """How a reproducer is replayed: ``config``, the base configuration of every replay (the
    run's own, judged as the run recorded it: :func:`replay_base`), each replay being that
    config with the reproducer as its suite (:func:`replay_config`): a fresh launch of its
    engine group every time, or its attached engine (``attach.url``), the same one every time.

    A replay is a :func:`pleharness.pipeline.run_stress` of that config
    (:func:`pleharness.pipeline.replay_reproducer`). ``parallel``: replays side by side
    (:mod:`pleharness.engine.side_by_side`); ``engine_args_add``: arguments added to each
    replay's launch (e.g. a fixed KV cache size). ``build``: set when the replays run on another
    build of the engine than the run's (``confirm --engine-python``), named in the verdicts.
    ``spares``: engines started ahead of the replays (:mod:`pleharness.engine.spares`, fuzz's
    while it searches): a replay whose launch equals a spare's takes it over, fresh (it served
    nothing), instead of starting one."""

    config: StressConfig
    parallel: int = 1
    engine_args_add: list[str] = field(default_factory=list)
    build: str | None = None
    spares: SpareEngines | None = None

    @property
    def fresh(self) -> bool:
        """Whether each replay gets a freshly started engine (False when attached)."""
        return self.config.attach.url is None


def judging_options(run_options) -> dict[str, Any]:
    """The judging fields of a :class:`ReplayTarget` (``golden``, ``near_tie_nats``, ``strict``,
    ``reference_cache_state``) from a run's ``manifest.run_options``, so that every replay of
    that run's reproducers (``stress --confirm-runs``, ``explain``) judges at the run's own
    threshold and rules (issue 34: explain replayed a run made with ``--near-tie-nats`` at the
    dtype's default). ``near_tie_nats``: the threshold the run used (derived from the serving
    dtype or given), None for a run that recorded none."""
    o = run_options
    nats = o.near_tie_nats
    return {"golden": o.golden is not False,
            "near_tie_nats": float(nats) if nats is not None else None,
            "strict": bool(o.strict),
            "reference_cache_state": o.reference_cache_state or "warm"}


def replay_base(cfg: StressConfig, run_options) -> StressConfig:
    """The base configuration of a run's replays: ``cfg`` judged with the options the run
    recorded in ``run_options`` (:func:`judging_options`: the near-tie threshold it used,
    strict, golden, the reference cache state), its references taken solo and no control run
    (a replay repeats the run under test, not its second engines). ``stress --confirm-runs``
    passes the run's own config, explain and ``confirm`` the one they build from the run's
    manifest (:func:`run_config`): all judge a reproducer alike."""
    j = judging_options(run_options)
    return replace(cfg, verdict=VerdictConfig(near_tie_nats=j["near_tie_nats"],
                                              strict=j["strict"], golden=j["golden"]),
                   reference=ReferenceConfig(cache_state=j["reference_cache_state"]),
                   control=ControlConfig())


def load_launched_run(run: Path, job: str) -> tuple[Manifest, Path]:
    """The manifest and folder of a run the harness launched (``run``: its folder or its
    manifest.json), for a job that relaunches its engine (``job``: its name, for the messages).
    Raises UsageError for an unreadable manifest, a run that recorded no engine (it ended
    before its engine was up) or an attached one (``--url``: no launch to repeat)."""
    try:
        m = load_manifest(run)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run_dir = Path(run) if Path(run).is_dir() else Path(run).parent
    if m.engine.mode is None:
        raise UsageError(f"{run}: the run recorded no engine (status {m.status}: it ended "
                         f"before its engine was up, or was killed then): nothing to {job}")
    if m.engine.mode != "launched" or not m.engine.launch:
        raise UsageError(f"{run}: {job} relaunches the engine, so the run must have been "
                         "launched by the harness (not attached with --url)")
    return m, run_dir


def _profile_env(la: dict) -> dict[str, str]:
    """The ``[env]`` of the engine profile a launch record names (its path as recorded, else a
    shipped profile of that name); {} when it cannot be read."""
    name = la.get("profile")
    if not name:
        return {}
    for cand in (name, Path(name).stem):
        try:
            return dict(load_profile(find_profile(cand)).env)
        except (UsageError, OSError):
            continue
    return {}


def restore_env(m: Manifest) -> tuple[dict[str, str], list[str]]:
    """A launched run's engine environment as its launch record holds it, each value recorded
    as ``<redacted>`` (:mod:`pleharness.redact`: any variable that may hold a secret) restored
    from this process's environment, else from the engine profile the run used. Returns (the
    environment, one line per restored name saying where its value came from). Raises
    UsageError naming every redacted variable neither holds: replaying without it (or with an
    empty value) would start another configuration than the run had."""
    la = m.engine.launch or {}
    env, notes, missing = {}, [], []
    profile = None
    for k, v in (la.get("env") or {}).items():
        if v != REDACTED:
            env[k] = v
        elif k in os.environ:
            env[k] = os.environ[k]
            notes.append(f"{k}: from this shell's environment")
        else:
            profile = _profile_env(la) if profile is None else profile
            if k in profile:
                env[k] = profile[k]
                notes.append(f"{k}: from the run's engine profile {la.get('profile')}")
            else:
                missing.append(k)
    if missing:
        raise UsageError(
            f"the run's engine had {', '.join(missing)} set (recorded as <redacted>: such values "
            "are never written to run records) and neither this shell nor the run's engine "
            "profile holds a value: set each to the run's value in this shell (e.g. "
            f"{missing[0]}=VALUE ple-harness ...; {missing[0]}= for an empty one), so that the "
            "replays start the configuration the run had")
    return env, notes


def check_run_model(run: Path, model: str | None) -> None:
    """The run's model folder (its launch record's path) exists here; raises UsageError
    before any engine starts (a run made on another machine names that machine's path)."""
    if model and not Path(model).is_dir():
        raise UsageError(f"{run}: the run's model {model} is not a model folder here (the run "
                         "was made where it was; replays launch the run's configuration, so "
                         "run them where the model is, or with it at the same path)")


def run_target(m: Manifest, python: str | None = None,
               start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
               compile_cache: str | None = None) -> Target:
    """A launched run's engine as a launch target, from its manifest's launch record (model,
    python (``python`` overrides it), tp, engine_args, env, host; the served name): a value
    recorded as ``<redacted>`` is restored by :func:`restore_env` (UsageError when it cannot
    be). ``compile_cache``: another ``VLLM_CACHE_ROOT`` than the run's (``--compile-cache``;
    ``~`` expanded)."""
    la = m.engine.launch or {}
    env, _ = restore_env(m)
    if compile_cache:
        env["VLLM_CACHE_ROOT"] = os.path.abspath(os.path.expanduser(compile_cache))
    return Target(url=None, model_path=la["model"], served_name=m.engine.model,
                  python=python or la["python"], tp=la.get("tp", 1),
                  engine_args=list(la.get("engine_args") or []), engine_env=env,
                  host=la.get("host", "127.0.0.1"), start_timeout_s=start_timeout_s)


def run_config(m: Manifest, python: str | None = None,
               start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
               compile_cache: str | None = None) -> StressConfig:
    """A launched run's configuration as far as its manifest holds it, the base of its
    reproducers' replays (explain, ``ple-harness confirm``): its launch (:func:`run_target`: the
    launch record and the served name, ``compile_cache`` over its cache) as the engine group,
    judged as the run recorded it (:func:`replay_base`, as ``stress --confirm-runs`` judges)."""
    t = run_target(m, python, start_timeout_s, compile_cache)
    engine = EngineConfig(model=t.model_path, tp=t.tp, python=t.python, args=t.engine_args,
                          env=t.engine_env, served_model_name=t.served_name, host=t.host,
                          port=t.port, start_timeout_s=t.start_timeout_s)
    return replay_base(StressConfig(engine=engine), m.run_options)


def replay_config(target: ReplayTarget, path: Path, out_dir: Path, run_id: str) -> StressConfig:
    """One replay's configuration: the target's base config with the scenario file ``path`` as
    its whole suite, its run folder ``out_dir/run_id``, no confirmation of its own, and the
    target's ``engine_args_add`` after its engine's arguments."""
    base = target.config
    return replace(
        base, engine=replace(base.engine, args=[*base.engine.args, *target.engine_args_add]),
        suite=SuiteConfig(scenarios=[str(path)]),
        output=OutputConfig(results_dir=out_dir, run_id=run_id,
                            invocation=["ple-harness", "stress", "--scenario", str(path)]),
        confirmation=ConfirmationConfig(runs=0))


def rate_verdict(reproduced: int, runs: int, errors: int = 0, fresh: bool = True,
                 inconclusive: int = 0, build: str | None = None) -> str:
    """The one-line reproduction verdict, e.g. ``reproduced 3/3 on fresh engines``,
    ``reproduced 1/3 on fresh engines: intermittent (timing-dependent)``, ``0/3: not
    reproduced on fresh engines, timing-dependent``; attached runs say ``on the same engine
    (attached: no fresh engine can be started)``. ``errors``: replays that ended neither
    pass nor fail (counted in the denominator, named at the end). ``inconclusive``: passing
    replays that did not exercise the schedule (an insert that did not land while its carrier
    ran), not counted in ``runs``, named at the end. ``build``: the replays ran on another
    build of the engine than the run's (``confirm --engine-python``): the verdict names it, and
    0/N is "not reproduced on that build" (a fix, or a build that cannot show the failure), not
    a timing-dependent failure."""
    where = (f"on fresh engines of {build}" if build else "on fresh engines") if fresh else \
        "on the same engine (attached with --url: no fresh engine can be started)"
    err = f"; {errors} replay(s) ended in an error" if errors else ""
    if inconclusive:
        err += (f"; {inconclusive} more replay(s) inconclusive (an insert did not reach the "
                "engine while its carrier ran), not counted")
    if runs and reproduced == runs:
        return f"reproduced {reproduced}/{runs} {where}{err}"
    if reproduced:
        return f"reproduced {reproduced}/{runs} {where}: intermittent (timing-dependent){err}"
    if build:
        return f"0/{runs}: not reproduced {where}{err}"
    return f"0/{runs}: not reproduced {where}, timing-dependent{err}"


def still_failing(manifest, row: ReproducerRow) -> bool:
    """Whether the failure a reproducer row stands for still fails the run after the final
    judgement (control run, sides): a load phase of a scenario of the row's ``source`` kind
    (``manifest.scenarios[*].kind``; the whole run when no scenario is of that kind) that
    failed, or a request of it that is still a problem (:attr:`RequestRecord.is_problem`).
    A failure the control run reproduces (``also_in_control``) no longer fails, so its
    reproducer is not worth fresh engines (issue 34: confirmation comes after attribution)."""
    names = {s.get("name") for s in manifest.scenarios if s.get("kind") == row.source}

    def mine(scenario: str) -> bool:
        return not names or scenario in names
    return (any(p.status == "fail" for p in manifest.phases
                if p.role == "load" and mine(p.scenario))
            or any(r.is_problem for r in manifest.requests if mine(r.scenario)))


NOT_STILL_FAILING = ("not confirmed: the final judgement (control run, sides) no longer fails "
                     "what it reproduces")
