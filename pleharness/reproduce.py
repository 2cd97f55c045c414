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

Each replay is a whole ``stress`` run, so its engine lives in that run's
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

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from .causes import causes
from .config import (ConfirmationConfig, ControlConfig, EngineConfig, OutputConfig,
                     ReferenceConfig, StressConfig, SuiteConfig, VerdictConfig, find_profile)
from .defaults import DEFAULT_START_TIMEOUT_S
from .engine.session import Interrupted, Target
from .engine.side_by_side import run_side_by_side
from .errors import HarnessError, UsageError
from .files import private_dir
from .manifest import Manifest, load_manifest
from .profile import load_profile
from .redact import REDACTED
from .manifest.tables import Confirmation, ReplayRow, ReproducerRow, ReproductionColumns


@dataclass
class ReplayTarget:
    """How a reproducer is replayed: ``config``, the base configuration of every replay (the
    run's own, judged as the run recorded it: :func:`replay_base`), each replay being that
    config with the reproducer as its suite (:func:`replay_config`): a fresh launch of its
    engine group every time, or its attached engine (``attach.url``), the same one every time.

    ``runner``: the run a replay is, ``runner(cfg, console, err_console) -> exit code``
    (:func:`pleharness.stress.run_stress`, handed in by the job that confirms: this module
    stays below the jobs and imports none). ``parallel``: replays side by side
    (:mod:`pleharness.engine.side_by_side`); ``engine_args_add``: arguments added to each
    replay's launch (e.g. a fixed KV cache size). ``build``: set when the replays run on another
    build of the engine than the run's (``confirm --engine-python``), named in the verdicts."""

    runner: Callable[[Any, Console, Console], int]
    config: StressConfig
    parallel: int = 1
    engine_args_add: list[str] = field(default_factory=list)
    build: str | None = None

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


def _failing_lines(run_dir: Path) -> list[str]:
    """The causes of a replay run's failure (its report's 'Why' lines), at most 4."""
    try:
        return causes(load_manifest(run_dir))[:4]
    except (ValueError, OSError) as exc:
        return [f"(manifest unreadable: {exc})"]


def replay_reproducer(path: Path, target: ReplayTarget, runs: int, out_dir: Path,
                      log: Callable[[str], Any] = print,
                      label: str | None = None) -> Confirmation:
    """Replay the scenario file ``path`` ``runs`` times (each a ``stress`` run under
    ``out_dir/<label>-<i>/``, on a fresh engine unless attached); returns the result of the
    module docstring. ``log`` gets one line per replay. Up to ``target.parallel`` replays run
    side by side, each on its own engine (:mod:`pleharness.engine.side_by_side`; one at a time
    when attached or on a fixed ``--port``). Never raises for a replay that fails or errs (that
    is the result); raises ValueError for ``runs`` < 1 and
    :class:`~pleharness.engine.session.Interrupted` when a replay was interrupted (exit 130 /
    143, or a signal while side-by-side replays ran: their engines are killed first)."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    label = label or Path(path).stem
    private_dir(out_dir)
    par = 1 if (not target.fresh or target.config.engine.port) else max(1, target.parallel)
    replays: list[ReplayRow] = []
    i = 0
    # an inconclusive replay (it passed without exercising its inserts) is replaced by another,
    # up to ``runs`` extra replays in all
    while True:
        want = runs - sum(1 for r in replays if not r.inconclusive)
        if want <= 0 or i >= 2 * runs:
            break
        wave = list(range(i + 1, i + 1 + min(want, par, 2 * runs - i)))
        i = wave[-1]
        rows = run_side_by_side([(lambda k=k: _replay_once(path, target, out_dir, label, k))
                                 for k in wave], par)
        for k, row in zip(wave, rows):
            if isinstance(row, BaseException):
                raise row
            replays.append(row)
            code = row.exit_code
            what = "reproduced" if code == 1 else \
                f"inconclusive ({row.inconclusive}): another replay" \
                if row.inconclusive else "passed (not reproduced)" if code == 0 else \
                f"error (exit {code}): {row.error}"
            log(f"  replay {k} ({runs} wanted) of {Path(path).name} "
                f"{'on a fresh engine' if target.fresh else 'on the same engine'}"
                + (f", {len(wave)} side by side" if len(wave) > 1 else "") + f": {what}")
    counted = [r for r in replays if not r.inconclusive]
    n = sum(r.reproduced for r in counted)
    errors = sum(1 for r in counted if r.exit_code not in (0, 1))
    left_out = len(replays) - len(counted)
    return Confirmation(runs=len(counted), reproduced=n, errors=errors, inconclusive=left_out,
                        fresh_engine=target.fresh, rate=f"{n}/{len(counted)}",
                        verdict=rate_verdict(n, len(counted), errors, target.fresh, left_out,
                                             target.build),
                        side_by_side=par, replays=replays)


def _replay_once(path: Path, target: ReplayTarget, out_dir: Path, label: str,
                 i: int) -> ReplayRow:
    """Replay ``path`` once as the ``stress`` run ``<label>-<i>`` under ``out_dir``: its row of
    the result's ``replays``. Raises Interrupted when the run was interrupted (exit 130 / 143)."""
    run_id = f"{label}-{i}"
    quiet = Console(file=io.StringIO(), width=200)
    refused = ""
    try:
        code = target.runner(replay_config(target, path, out_dir, run_id), quiet, quiet)
    except HarnessError as exc:  # a usage error before the run folder existed
        code, refused = exc.exit_code, str(exc)
    if code in (130, 143):
        raise Interrupted(code - 128)
    rdir = out_dir / run_id
    row = ReplayRow(run=i, exit_code=code, reproduced=code == 1,
                    manifest=str(rdir / "manifest.json")
                    if (rdir / "manifest.json").exists() else None)
    try:  # read once: the error's reason, an unexercised schedule, the engine's start
        m = load_manifest(rdir, with_requests=False)
    except (ValueError, OSError):
        m = None
    if code == 1:
        row.failing = _failing_lines(rdir)
    elif code == 0:
        why = _not_exercised(m) if m is not None else None
        if why:
            row.inconclusive = why
    else:
        row.error = (m.reason if m is not None else None) or refused or \
            quiet.file.getvalue().strip()[-500:] or f"the replay ended with exit {code}"
    if m is not None:
        row.engine_ready_s = m.engine.ready_s
    return row


def _not_exercised(m) -> str | None:
    """Why a passing replay's manifest ``m`` did not exercise its schedule (a phase check
    ``inserts_landed`` that warned: :func:`pleharness.scenarios.shared.inserting.landing_check`),
    else None."""
    for ph in m.phases:
        for c in ph.checks:
            if c.name == "inserts_landed" and c.status != "pass":
                return f"phase {ph.name}: {c.detail}"
    return None


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


def confirm_run_reproducers(manifest, run_dir: Path, target: ReplayTarget, runs: int,
                            log: Callable[[str], Any] = print,
                            out_dir: Path | None = None,
                            on_row: Callable[[ReproducerRow], Any] | None = None
                            ) -> list[ReproducerRow]:
    """Confirm every reproducer a run wrote (``manifest.tables["reproducers"]``:
    :class:`~pleharness.manifest.tables.ReproducerRow`, ``path`` relative to ``run_dir``,
    ``source``, and optionally ``fallback``: a larger failing schedule to try when the
    reproducer reproduces 0 times). Each row gets ``confirmation`` (the result of
    :func:`replay_reproducer`), and ``fallback_confirmation`` when the fallback was tried; the
    row's ``verdict`` is the line the reports show. A row whose failure no longer fails the run
    (:func:`still_failing`) is not replayed: its verdict says so. The replays' run folders go
    under ``out_dir`` (default ``run_dir/confirm``). ``on_row`` is called with each row once
    its verdict is in the manifest (e.g. to save what is known so far). Returns the rows."""
    out_dir = out_dir or run_dir / "confirm"
    rows = ReproducerRow.rows(manifest, "reproducers")
    for i, row in enumerate(rows):
        if row.confirmation is not None:
            continue
        if not still_failing(manifest, row):
            row.verdict = NOT_STILL_FAILING
            manifest.tables["reproducers"][i] = row.model_dump()
            log(f"{row.path}: {row.verdict}")
            if on_row is not None:
                on_row(row)
            continue
        path = run_dir / row.path
        log(f"confirming {row.path}: {runs} replay(s) "
            f"{'each on a freshly started engine' if target.fresh else 'on the attached engine'}")
        res = replay_reproducer(path, target, runs, out_dir, log)
        row.confirmation = res
        row.verdict = res.verdict
        if res.reproduced == 0 and row.fallback:
            fb = run_dir / row.fallback
            log(f"  {row.path} did not reproduce: trying the larger failing schedule "
                f"{row.fallback}")
            fres = replay_reproducer(fb, target, runs, out_dir, log)
            row.fallback_confirmation = fres
            row.verdict = (f"{res.verdict}: here is the larger failing schedule {row.fallback}"
                           + (f" ({row.fallback_schedule})" if row.fallback_schedule else "")
                           + f", {fres.verdict}")
        manifest.tables["reproducers"][i] = row.model_dump()
        log(f"{row.path}: {row.verdict}")
        _summary_reproduction(manifest, row, res, target.fresh)
        if on_row is not None:
            on_row(row)
    return rows


def _summary_reproduction(manifest, row: ReproducerRow, res: Confirmation, fresh: bool) -> None:
    """The reproduction columns (:class:`~pleharness.manifest.tables.ReproductionColumns`) of
    the first row of ``row``'s summary table (e.g. fuzz_summary: confirmed = failed on a fresh
    engine); nothing when it names none or the table is empty. Any table a kind names works:
    the row keeps its other columns as they are."""
    table = manifest.tables.get(row.summary_table or "") or []
    if not table:
        return
    fb = row.fallback_confirmation
    table[0] = ReproductionColumns(
        confirmed=res.reproduced > 0, reproduction=row.verdict, reproduction_rate=res.rate,
        larger_reproduction_rate=fb.rate if fb is not None else None,
        confirmed_on_fresh_engine=fresh).merged_into(table[0])
