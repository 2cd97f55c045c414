"""The ``confirm`` job: replay the reproducers a finished run wrote, each ``--runs`` times on a
freshly started engine of the run's configuration, and say how often each still fails.

Why a job of its own (issue 34): a reproducer is only trusted once it fails on a fresh engine
(shared/DESIGN.md, "A reproducer is only confirmed on a fresh engine"). ``stress --confirm-runs``
and ``fuzz --confirm-runs`` confirm within the run that wrote it; this job does it later, for a
run made with ``--confirm-runs 0`` (a quick nightly), with more replays, or against another
build of the engine (``--engine-python``): a patched engine on which no reproducer fails any
more is green (exit 0), one on which a reproducer still fails is red (exit 1).

Its phases, in order:

1. run: the run's manifest (a run the harness launched:
   :func:`pleharness.reproduce.load_launched_run`) and its ``reproducers`` table;
2. configuration: the run's launch and judging options from its manifest
   (:func:`pleharness.reproduce.run_config`: the near-tie threshold, strict, golden and the
   reference cache state it recorded, so it judges a reproducer as ``stress`` and ``explain``
   do), ``--engine-python`` overriding its Python;
3. confirmation: every reproducer whose failure still fails the run (one its control run
   explains is not replayed) replayed ``--runs`` times, each replay a ``stress`` run of the
   reproducer (:func:`pleharness.pipeline.run_stress`, imported one floor down: a job imports
   no other job), its folder under ``RUN/confirm-<time>-<random>/``
   (:func:`pleharness.pipeline.confirm_run_reproducers`);
4. result: ``confirm.json`` there (:class:`ConfirmResult`, rewritten after every reproducer, so
   an interrupted job keeps what it learned) and the exit code.

The run's own manifest and reports are not changed.

Exit codes (:class:`~pleharness.errors.ExitCode`): 0 no reproducer failed again, 1 a reproducer
failed again (reproduced at least once), 2 usage error, 3 no replay of any reproducer ran to a
verdict (every one ended in an error: e.g. the engine did not start), 130 / 143 interrupted.
"""
from __future__ import annotations

import contextlib
import secrets
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape

from .defaults import DEFAULT_START_TIMEOUT_S
from .engine.launch import engine_python_check
from .engine.session import Interrupted
from .engine.side_by_side import model_bytes
from .engine.side_by_side import plan as plan_side_by_side
from .environment import gpu_inventory
from .errors import ExitCode, HarnessError, UsageError
from .jobrecord import JobFrame, JobRecord
from .manifest import now_iso, write_atomic
from .manifest.tables import ReproducerRow
from .pipeline import confirm_run_reproducers
from .reproduce import (ReplayTarget, check_run_model, load_launched_run, restore_env,
                        run_config, run_target)
from .run.rundir import new_run_dir
from .scenarios import load_scenario_file
from .timeline import Timeline


class ConfirmResult(BaseModel):
    """``confirm.json``: the confirmed ``run`` (its id and folder), the replays per reproducer
    (``runs``), the engine's Python, the job's record (``job``:
    :class:`~pleharness.jobrecord.JobRecord`, the steps run, configuration, confirmation,
    result) and from it ``status`` (running, complete, interrupted, failed), ``exit_code``
    (None while running; status failed with exit 3 when no replay ran to a verdict),
    ``started_at`` and ``ended_at``, and the ``reproducers`` rows of the
    run, each with this job's ``confirmation`` and ``verdict`` (:class:`ReproducerRow`)."""

    run_id: str
    run_dir: str
    runs: int
    engine_python: str
    started_at: str
    ended_at: str | None = None
    status: str = "running"
    exit_code: int | None = None
    job: JobRecord | None = None  # the job's record (pleharness.jobrecord): status, exit code ...
    reproducers: list[ReproducerRow] = []
    side_by_side: dict = {}  # pleharness.engine.side_by_side.SideBySide.record
    timeline: Timeline = Field(default_factory=Timeline)  # confirmed after N s (issue 49)


def run_confirm(run: Path, runs: int, *, engine_python: str | None = None,
                start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                console: Console | None = None, parallel_engines: int | None = 1,
                compile_cache: str | None = None) -> int:
    """Confirm the reproducers of the launched run ``run`` (its folder or manifest.json):
    ``runs`` (>= 1) replays of each, on fresh engines of its configuration (``engine_python``:
    another Python with vLLM, default the run's; ``start_timeout_s``: seconds to wait for
    each engine); each replay is a ``stress`` run (:func:`pleharness.pipeline.run_stress`).
    ``parallel_engines``: replays started side by side (None: auto;
    :func:`pleharness.engine.side_by_side.plan`, each with a fixed KV cache size on a GPU).
    ``compile_cache``: the replays' ``VLLM_CACHE_ROOT`` (default: the run's). Progress goes to
    ``console``. Returns the exit code of the module docstring. Raises UsageError (exit 2)
    before anything starts: ``runs`` < 1, an unreadable or attached run, a
    run with no reproducer, a reproducer file that is gone, an ``engine_python`` without vLLM,
    more engines side by side than fit."""
    console = console or Console(stderr=True)
    if runs < 1:
        raise UsageError(f"--runs {runs}: at least one replay is needed")
    with _sigterm_interrupts():
        return _confirm(run, runs, engine_python, start_timeout_s, console, parallel_engines,
                        compile_cache)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the job runs, SIGTERM raises Interrupted (as Ctrl-C raises KeyboardInterrupt), also
    between two replays, when no engine session owns the signals: confirm.json then says
    "interrupted" instead of being left "running" by a process the signal killed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, _frame):
        raise Interrupted(signum)
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _confirm(run: Path, runs: int, engine_python: str | None, start_timeout_s: float,
             console: Console, parallel_engines: int | None, compile_cache: str | None) -> int:
    """:func:`run_confirm` once its signals are set: the phases of the module docstring, each a
    step of the job frame (:class:`~pleharness.jobrecord.JobFrame`), whose record
    ``confirm.json`` embeds (``job``) once its folder exists."""
    box: dict = {}  # the result and its file, once the job's folder exists

    def save(_record: JobRecord | None = None) -> None:
        if "result" in box:
            result, m = box["result"], box["manifest"]
            rec = result.job = frame.record
            result.status, result.exit_code = rec.status, rec.exit_code
            result.started_at, result.ended_at = rec.started_at, rec.ended_at
            result.reproducers = ReproducerRow.rows(m, "reproducers")
            write_atomic(box["path"], result.model_dump_json(indent=2, exclude_none=True) + "\n")

    def ended(_exc: BaseException, _record: JobRecord) -> None:
        if "result" in box:
            box["result"].timeline.mark("ended")

    frame = JobFrame("confirm", save, on_error=ended)
    try:
        with frame:
            with frame.step("run"):  # 1
                m, run_dir = load_launched_run(run, "confirm")
                rows = ReproducerRow.rows(m, "reproducers")
                if not rows:
                    raise UsageError(f"{run}: the run wrote no reproducer (a fuzz run that found "
                                     "a failing schedule writes repro.toml; explain confirms its "
                                     "own repro-N.toml)")
                check_reproducers(run, run_dir, rows)
            with frame.step("configuration"):  # 2
                replays = _configuration(m, run, run_dir, rows, runs, engine_python,
                                         start_timeout_s, compile_cache, parallel_engines,
                                         console, box, frame)
            path = box["path"]

            def on_row(row: ReproducerRow) -> None:  # confirm.json rewritten after every one
                if row.confirmation is not None and row.confirmation.reproduced:
                    box["result"].timeline.mark("confirmed")
                save()

            with frame.step("confirmation"):  # 3
                confirm_run_reproducers(m, run_dir, replays, runs,
                                        log=lambda line: console.print(escape(line),
                                                                       highlight=False),
                                        out_dir=path.parent, on_row=on_row)
            with frame.step("result"):  # 4
                code = _exit_code(ReproducerRow.rows(m, "reproducers"))
                box["result"].timeline.mark("ended")
            if code == ExitCode.ENGINE:  # nothing was confirmed: the job failed (its engines)
                frame.complete(code, "failed", "no replay of any reproducer ran to a verdict "
                               "(each ended in an error, e.g. its engine did not start: see "
                               "the replays' manifests)")
            else:
                frame.complete(code)
    except (Interrupted, KeyboardInterrupt):  # a replay's, or Ctrl-C between replays
        if "path" not in box:
            raise
        console.print(f"[red]{escape(frame.record.reason or 'interrupted')}[/red]: "
                      f"what was confirmed so far is in {escape(str(box['path']))}")
    result = box["result"]
    console.print(f"confirm: status {result.status}, exit {result.exit_code}; "
                  f"{escape(str(box['path']))}", highlight=False)
    console.print(f"time line: {escape(result.timeline.line())}", highlight=False)
    return int(result.exit_code)


def _configuration(m, run: Path, run_dir: Path, rows: list[ReproducerRow], runs: int,
                   engine_python: str | None, start_timeout_s: float,
                   compile_cache: str | None, parallel_engines: int | None, console: Console,
                   box: dict, frame: JobFrame) -> ReplayTarget:
    """Phase 2: the run's configuration (``--engine-python`` over its Python), checked, the
    side-by-side plan, then the job's folder ``RUN/confirm-<time>-<random>/`` and its
    ``confirm.json`` (into ``box``: ``result``, ``manifest``, ``path``; the frame's traceback
    folder set to it). Returns the replays' target. Raises UsageError for an engine Python
    without vLLM, a model that is gone, more engines side by side than fit."""
    cfg = run_config(m, engine_python, start_timeout_s, compile_cache)
    problem = engine_python_check(cfg.engine.python)
    if problem:
        raise UsageError(f"--engine-python {cfg.engine.python}: {problem}")
    check_run_model(run, cfg.engine.model)
    target = run_target(m, engine_python, start_timeout_s, compile_cache)
    side = plan_side_by_side(parallel_engines, gpus=gpu_inventory(),
                             model=model_bytes(target.model_path),
                             engine_args=target.engine_args, engine_env=target.engine_env)
    for line in restore_env(m)[1]:
        console.print(f"note: the run's engine environment value of {escape(line)} (the run "
                      "recorded it as <redacted>)", highlight=False)
    stamp = now_iso().replace(":", "").replace("-", "")[:15]  # e.g. 20261206T073550
    _, out_dir = new_run_dir(run_dir, f"confirm-{stamp}-{secrets.token_hex(2)}")
    # this job's confirmation of every row, whatever the run itself confirmed
    earlier = ("confirmation", "fallback_confirmation", "verdict")
    m.tables["reproducers"] = [{k: v for k, v in r.model_dump().items() if k not in earlier}
                               for r in rows]
    box.update(manifest=m, path=out_dir / "confirm.json", result=ConfirmResult(
        run_id=m.run_id, run_dir=str(run_dir), runs=runs, engine_python=cfg.engine.python,
        started_at=frame.record.started_at, side_by_side=side.record()))
    frame.crash_dir = out_dir
    console.print(f"confirm {escape(m.run_id)}: {len(rows)} reproducer(s), {runs} replay(s) "
                  f"each on a freshly started engine; results in {escape(str(out_dir))}",
                  highlight=False)
    if side.n > 1:
        console.print(escape(side.why), highlight=False)
    other = engine_python not in (None, (m.engine.launch or {}).get("python"))
    return ReplayTarget(config=cfg, parallel=side.n, engine_args_add=list(side.add),
                        build=f"--engine-python {engine_python}" if other else None)


def check_reproducers(run: Path, run_dir: Path, rows: list[ReproducerRow]) -> None:
    """Every reproducer (and larger fallback) a run's table names is a file inside the run
    folder that reads as a scenario; raises UsageError naming each one that is not, before any
    engine starts (a replay of a broken file would only fail once its engine was up)."""
    problems = []
    for rel in dict.fromkeys(p for r in rows for p in (r.path, r.fallback) if p):
        path = (run_dir / rel).resolve()
        if Path(rel).is_absolute() or not path.is_relative_to(run_dir.resolve()):
            problems.append(f"{rel}: outside the run folder (the reproducers table names files "
                            "the run wrote, relative to its folder)")
        elif not path.is_file():
            problems.append(f"{rel}: file not found")
        else:
            try:
                load_scenario_file(str(path))
            except (HarnessError, ValueError, OSError) as exc:
                problems.append(f"{rel}: not a replayable scenario: {exc}")
    if problems:
        raise UsageError(f"{run}: reproducer file(s) that cannot be replayed:\n"
                         + "\n".join(f"  - {x}" for x in problems))


def _exit_code(rows: list[ReproducerRow]) -> ExitCode:
    """1 when a reproducer (or its larger fallback) reproduced at least once; 3 when no
    replay ran to a verdict (each ended in an error); else 0."""
    results = [c for r in rows for c in (r.confirmation, r.fallback_confirmation)
               if c is not None]
    if any(c.reproduced for c in results):
        return ExitCode.FAIL
    if results and all(c.errors == c.runs for c in results):
        return ExitCode.ENGINE
    return ExitCode.OK

