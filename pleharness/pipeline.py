"""The pipeline: the steps a ``stress`` run is made of, and the confirmation that replays a
run's reproducers as ``stress`` runs of their own.

:func:`run_stress` checks the options and input (:func:`pleharness.jobrun.check_input`), then
runs the named steps of :func:`_steps` in the frame of a stress or fuzz run
(:func:`pleharness.jobrun.run_job`, in the job frame :class:`pleharness.jobrecord.JobFrame`
that every job runs in: the run folder and manifest, every engine, the signals and
the GPU-memory check owned by one :class:`~pleharness.engine.session.EngineSession`, every
exception mapped to a manifest status and an exit code in one place): references (on a
reference engine if asked), engines (the engine under test), suite, control (the engine under
test's launch as a :class:`~pleharness.engine.session.Variant`), evidence, sides,
confirmation, verdict. The steps are :mod:`pleharness.jobrun`'s, the passes on each engine
:mod:`pleharness.passes`.

The confirmation step (:func:`confirm_reproducers`) replays every reproducer the suite wrote
(:func:`confirm_run_reproducers`, :func:`replay_reproducer`), each replay a :func:`run_stress`
of this module with the reproducer as its whole suite and no confirmation of its own
(:func:`pleharness.reproduce.replay_config`): the recursion of a stress run is an import, not a
callback handed down from the command line. What a replay is and how its result reads (the
replay's configuration, the rate and its verdict, whether a failure still fails) is
:mod:`pleharness.reproduce`, which imports nothing of this module.

The jobs import what they need from here, one floor down (a job imports no other job): the
``stress`` job (:mod:`pleharness.stress`) is :func:`run_stress`, the ``fuzz`` job
(:mod:`pleharness.fuzzjob`) confirms with :func:`confirm_reproducers`, ``confirm``
(:mod:`pleharness.confirmjob`) with :func:`confirm_run_reproducers`, ``explain`` with
:func:`replay_reproducer`, and each ``selftest`` pass is a :func:`run_stress`.
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from .causes import causes
from .config import StressConfig
from .engine.session import Engine, Interrupted, Target
from .engine.side_by_side import model_bytes, run_side_by_side
from .engine.side_by_side import plan as plan_side_by_side
from .engine.spares import SpareEngines
from .environment import gpu_inventory
from .errors import HarnessError, UsageError
from .files import private_dir
from .jobrun import (JobInput, JobRun, check_input, conclude, esc, evidence_step, open_session,
                     run_job, sides_step, start_engines, suite_step)
from .manifest import load_manifest
from .manifest.tables import Confirmation, ReplayRow, ReproducerRow, ReproductionColumns
from .passes import control_pass, reference_pass
from .reproduce import (NOT_STILL_FAILING, ReplayTarget, rate_verdict, replay_base,
                        replay_config, still_failing)


def run_stress(cfg: StressConfig, console: Console | None = None,
               err_console: Console | None = None, spares: SpareEngines | None = None) -> int:
    """Run a ``stress`` run (the ``stress`` job, a reproducer's replay, a selftest pass); returns
    the exit code (see :mod:`pleharness.errors`; 4 for an internal error, its traceback in
    ``<run>/harness-error.log``). Never leaves an engine. Reports go to
    ``console`` (stdout), errors and warnings to ``err_console`` (stderr). Raises UsageError
    (exit 2) for bad options or input, before anything is started or a run folder exists.
    ``spares``: engines started ahead that this run's launches may take over (a confirmation
    replay's: :func:`confirmation_spares`)."""
    console = console or Console(stderr=False)
    inputs = replace(check_input(cfg, console), spares=spares)
    return run_job(cfg, inputs, _steps, console, err_console)


def _steps(run: JobRun, stack: contextlib.ExitStack, inputs: JobInput) -> int:
    """The steps of a run, in this order, every engine in the run's session (closed with
    ``stack``), each a named step of the job frame (``run.step``: its name lands in the
    manifest's ``job.steps_done``); returns the exit code.

    1. references: taken on a reference engine (``--reference engine``; in the other modes the
       suite takes them, or they came from a manifest)
    2. engines: start or attach the engine under test (and the control engine beside it, when
       the side-by-side plan lets it)
    3. suite: the engine probe, the suite, and the judgement that needs all of it
    4. control: the suite again on the control engine, the divergences attributed
    5. evidence: the numerics envelope measured on the control run and every tolerance judged
       again at it, the control's solo answers compared with the run's (issue 47)
    6. sides: which side of each divergence is wrong; the tables from the final verdicts
    7. confirmation: the reproducers the suite wrote whose failure still fails after 4 to 6,
       replayed on fresh engines (``--confirm-runs``; issue 34: fresh engines are not spent on
       a failure the control run explains), each replay a run of :func:`run_stress`
    8. verdict: the verdict and the exit code (a control engine that failed: exit 3)
    """
    cfg, scenarios, target = run.cfg, inputs.scenarios, inputs.target
    open_session(run, stack)
    references = inputs.references
    if cfg.reference_mode == "engine":
        with run.step("references"):  # 1
            references = reference_pass(run, scenarios, target)
    with run.step("engines"):  # 2
        eng, control_eng = start_engines(run, scenarios, target)
    with run.step("suite"):  # 3
        suite_step(run, stack, inputs, eng, references)
    control = None
    if cfg.control:
        with run.step("control"):  # 4
            run.session.stop(eng)  # the control suite runs alone, as the suite did
            control = control_pass(run, scenarios, eng.facts, target, started=control_eng)
    with run.step("evidence"):  # 5
        evidence_step(run, control)
    with run.step("sides"):  # 6
        sides_step(run, scenarios, control)
    if cfg.confirmation.runs and run.manifest.tables.get("reproducers"):
        with run.step("confirmation"):  # 7
            confirm_reproducers(run, eng)
    with run.step("verdict"):  # 8
        return conclude(run)


def confirmation_spares(run: JobRun, target: Target) -> SpareEngines | None:
    """The engines of the first confirmation wave, started now, beside the engine under test
    (:mod:`pleharness.engine.spares`; fuzz starts them as its search begins, issue 49), or None
    when they cannot run beside it: no ``--confirm-runs``, an attached engine or a fixed
    ``--port``, a side-by-side plan of one engine, one that adds memory arguments to each
    engine (which the engine under test does not have: as for the control engine beside it,
    :func:`pleharness.jobrun.start_engines`), or the spares not fitting in what the engine
    under test leaves free (the side-by-side plan of that many engines, now). The spares are
    as many as the first wave (``min(--confirm-runs, --parallel-engines)``), each launched as a
    replay launches (:func:`~pleharness.reproduce.replay_config`); the job's exit stack must
    close them. What was decided is printed."""
    cfg, side = run.cfg, run.side
    n = min(cfg.confirmation.runs, side.n)
    if n < 1 or cfg.attach.url is not None or cfg.engine.port or side.n < 2 or side.add:
        return None
    rt = ReplayTarget(config=replay_base(cfg, run.manifest.run_options))
    try:  # the free memory now, with the engine under test running: do n more fit?
        plan_side_by_side(n, gpus=gpu_inventory(), model=model_bytes(target.model_path),
                          engine_args=target.engine_args, engine_env=target.engine_env)
        quiet = Console(file=io.StringIO())
        spec = replay_config(rt, Path("spare.toml"), run.run_dir, "spare").target(
            quiet).launch_spec()
    except UsageError as exc:
        run.console.print(esc(f"confirmation engines: started after the search ({exc})"),
                          highlight=False)
        return None
    run.console.print(f"confirmation engines: {n} started now, beside the search (each stays "
                      "fresh until a replay takes it)", highlight=False)
    return SpareEngines([spec] * n, run.run_dir / "confirm" / "spares",
                        start_timeout_s=target.start_timeout_s, api_key=target.api_key).start()


def confirm_reproducers(run: JobRun, eng: Engine, spares: SpareEngines | None = None) -> None:
    """Replay every reproducer the suite wrote (``tables["reproducers"]``) ``--confirm-runs``
    times, each on a freshly started engine of the run's configuration (the engine under test is
    stopped first: one engine at a time), or on the attached engine when there is no launch
    (:mod:`pleharness.reproduce`). The rates land in the table's rows and in
    ``summary.reproducers``. It runs after the control run, whose engine is stopped by then:
    every engine of the side-by-side plan is free for the confirmations. Each replay is a
    :func:`run_stress` of this module (:func:`confirm_run_reproducers`); ``spares``: engines
    started ahead for them (:func:`confirmation_spares`)."""
    cfg = run.cfg
    assert run.session is not None
    run.session.stop(eng)
    # the run's own config, judged as the run recorded it; each replay swaps in its reproducer
    rt = ReplayTarget(config=replay_base(cfg, run.manifest.run_options),
                      parallel=max(1, run.side.n), engine_args_add=list(run.side.add),
                      spares=spares)
    if run.side.n > 1 and cfg.attach.url is None:
        run.console.print(esc(f"confirmations: {run.side.why}"), highlight=False)
    def stamp(row) -> None:  # the first reproducer that reproduced on a fresh engine
        if row.confirmation is not None and row.confirmation.reproduced:
            run.manifest.timeline.mark("confirmed")

    rows = confirm_run_reproducers(run.manifest, run.run_dir, rt, cfg.confirmation.runs,
                                   log=lambda x: run.console.print(esc(x), highlight=False),
                                   on_row=stamp)
    run.manifest.summary.reproducers = [{"path": r.path, "verdict": r.verdict} for r in rows]
    run.save()


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
    (:func:`~pleharness.reproduce.still_failing`) is not replayed: its verdict says so. The
    replays' run folders go under ``out_dir`` (default ``run_dir/confirm``). ``on_row`` is
    called with each row once its verdict is in the manifest (e.g. to save what is known so
    far). Returns the rows."""
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


def replay_reproducer(path: Path, target: ReplayTarget, runs: int, out_dir: Path,
                      log: Callable[[str], Any] = print,
                      label: str | None = None) -> Confirmation:
    """Replay the scenario file ``path`` ``runs`` times (each a ``stress`` run under
    ``out_dir/<label>-<i>/``, on a fresh engine unless attached); returns the result of
    :mod:`pleharness.reproduce`'s docstring. ``log`` gets one line per replay. Up to
    ``target.parallel`` replays run side by side, each on its own engine
    (:mod:`pleharness.engine.side_by_side`; one at a time when attached or on a fixed
    ``--port``). Never raises for a replay that fails or errs (that
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
    """Replay ``path`` once as the ``stress`` run ``<label>-<i>`` under ``out_dir``
    (:func:`run_stress` with :func:`~pleharness.reproduce.replay_config`: no confirmation of its
    own): its row of the result's ``replays``. Raises Interrupted when the run was interrupted
    (exit 130 / 143)."""
    run_id = f"{label}-{i}"
    quiet = Console(file=io.StringIO(), width=200)
    refused = ""
    try:
        code = run_stress(replay_config(target, path, out_dir, run_id), quiet, quiet,
                          spares=target.spares)
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


def _failing_lines(run_dir: Path) -> list[str]:
    """The causes of a replay run's failure (its report's 'Why' lines), at most 4."""
    try:
        return causes(load_manifest(run_dir))[:4]
    except (ValueError, OSError) as exc:
        return [f"(manifest unreadable: {exc})"]
