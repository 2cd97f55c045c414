"""One job record and one job frame for every job (issue 50 item 2): ``stress``, ``fuzz``,
``confirm``, ``explain``, ``selftest`` and ``facts``.

:class:`JobRecord` is what every job writes about itself, in the same shape: the job, its
``status`` (one vocabulary, :data:`JobStatus`), ``exit_code``, ``reason``, ``root_cause``,
``started_at``, ``ended_at`` and the named steps it finished (``steps_done``). The
``manifest.json`` of a ``stress`` or ``fuzz`` run, ``confirm.json``, ``explain.json``,
``selftest.json`` and the ``facts --json`` file embed it under the key ``job``.

:func:`job_outcome` is the one mapping from an exception to (status, exit code, reason, root
cause); :class:`JobFrame` runs a job's named steps, catches every exception (``Exception`` and
``KeyboardInterrupt``) in one place through that mapping, stamps ``ended_at`` and saves the
record through the job's own callback (each job keeps writing its own file).

Floor 1: it imports only :mod:`pleharness.errors` and :mod:`pleharness.timeline`.
"""
from __future__ import annotations

import contextlib
import signal
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field, model_serializer

from .errors import (EngineError, ExitCode, HarnessError, Interrupted, RequestTimeoutAbort,
                     UsageError, write_crash_log)
from .timeline import now_iso

#: The status words of every job. running: not ended yet; complete: ran to its result (whatever
#: the verdict); incomplete: stopped part-way with its result unknown (``--on-timeout abort``,
#: or ended without a status); failed: an error ended it (an engine that did not start, a usage
#: error found once the engine was up, an internal error: the exit code tells which);
#: engine_died: the engine under test died after it was ready; interrupted: SIGINT / SIGTERM;
#: control_failed: a stress run judged without its control, whose engine failed.
JobStatus = Literal["running", "complete", "incomplete", "failed", "engine_died", "interrupted",
                    "control_failed"]
JOB_NAMES = ("stress", "fuzz", "confirm", "explain", "selftest", "facts")


class JobRecord(BaseModel):
    """What a job writes about itself, in every job's file under ``job``.

    Fields: ``job`` (stress, fuzz, confirm, explain, selftest, facts); ``status``
    (:data:`JobStatus`); ``exit_code`` (the process exit status, :class:`~pleharness.errors.
    ExitCode`; None while running); ``reason`` (why it ended as it did, None when it completed);
    ``root_cause`` (the engine log's most telling line when an engine failed, else None);
    ``started_at`` / ``ended_at`` (ISO 8601 UTC, :func:`~pleharness.timeline.now_iso`;
    ``ended_at`` None while running); ``steps_done`` (the names of the job's steps that
    finished, in order). Every key is written, also when None (one shape in every file).
    """

    job: str
    status: JobStatus = "running"
    exit_code: int | None = None
    reason: str | None = None
    root_cause: str | None = None
    started_at: str = Field(default_factory=now_iso)
    ended_at: str | None = None
    steps_done: list[str] = Field(default_factory=list)

    @model_serializer(mode="plain")
    def _every_key(self) -> dict[str, Any]:  # also under exclude_none: one shape everywhere
        return {k: (list(v) if isinstance(v, list) else v)
                for k, v in ((k, getattr(self, k)) for k in type(self).model_fields)}


class Outcome(NamedTuple):
    """How an exception ends a job: its ``status``, ``exit_code``, ``reason`` and
    ``root_cause`` (see :class:`JobRecord`)."""

    status: str
    exit_code: int
    reason: str
    root_cause: str | None


def job_outcome(exc: BaseException, *, engine_ready: bool = False,
                crash_dir: str | Path | None = None, write_log: bool = True) -> Outcome:
    """The one mapping from an exception that ended a job to its :class:`Outcome`:

    - :class:`~pleharness.errors.Interrupted`: interrupted, 128 + the signal (130 / 143);
      ``KeyboardInterrupt``: interrupted, 130;
    - :class:`~pleharness.errors.RequestTimeoutAbort`: incomplete, 1;
    - :class:`~pleharness.errors.EngineError`: engine_died when ``engine_ready`` (the engine
      under test was up), else failed; 3, its root cause;
    - :class:`~pleharness.errors.UsageError` and any other
      :class:`~pleharness.errors.HarnessError`: failed, its own exit code;
    - anything else (a harness bug): failed, 4; its traceback written to
      ``<crash_dir>/harness-error.log`` (without ``crash_dir``: a temporary file) and named in
      the reason, unless ``write_log`` is false (the command line writes it).

    Never raises."""
    if isinstance(exc, Interrupted):
        return Outcome("interrupted", 128 + exc.signum,
                       f"interrupted by {signal.Signals(exc.signum).name}", None)
    if isinstance(exc, KeyboardInterrupt):
        return Outcome("interrupted", int(ExitCode.SIGINT), "interrupted by SIGINT", None)
    if isinstance(exc, RequestTimeoutAbort):
        return Outcome("incomplete", int(ExitCode.FAIL), str(exc), None)
    if isinstance(exc, EngineError):
        return Outcome("engine_died" if engine_ready else "failed", int(ExitCode.ENGINE),
                       str(exc.args[0]) if exc.args else str(exc), exc.root_cause)
    if isinstance(exc, UsageError):
        return Outcome("failed", int(exc.exit_code), f"usage error (exit {exc.exit_code}): {exc}",
                       None)
    if isinstance(exc, HarnessError):
        return Outcome("failed", int(exc.exit_code), str(exc), None)
    reason = f"internal harness error: {exc.__class__.__name__}: {exc}"
    if write_log:
        log = write_crash_log("".join(traceback.format_exception(exc)), crash_dir)
        reason += f" (traceback in {Path(log).name if crash_dir is not None else log})"
    return Outcome("failed", int(ExitCode.INTERNAL), reason, None)


class JobFrame:
    """The frame every job runs in: a context manager around the job's named steps.

    ``job``: its name (:data:`JOB_NAMES`); ``save(record)``: the job's own writer, called when
    the frame is entered, after every finished step, by :meth:`complete` and when an exception
    ends the job (a job whose file has no place yet lets it do nothing); ``crash_dir``: where
    an internal error's traceback goes (the job may set it once its folder exists; while it is
    None and the exception leaves the frame, the command line writes the traceback);
    ``engine_ready()``:
    whether the engine under test is up now (an engine error then reads engine_died);
    ``on_error(exc, record)``: called once the record holds the exception's outcome, before it
    is saved (the job may print its lines and add what it knows, e.g. the engine's root cause);
    ``reraise``: whether the exception leaves the frame once recorded (the command line then
    prints its line and exits with the same code) or is kept in :attr:`error`.

    Use::

        with JobFrame("confirm", save) as frame:
            with frame.step("confirmation"):
                ...
            frame.complete(code)

    Raises what ``save`` raises; with ``reraise``, the exception that ended the job."""

    def __init__(self, job: str, save: Callable[[JobRecord], Any], *,
                 crash_dir: str | Path | None = None,
                 engine_ready: Callable[[], bool] | None = None,
                 on_error: Callable[[BaseException, JobRecord], Any] | None = None,
                 reraise: bool = True):
        self.record = JobRecord(job=job)
        self.save = save
        self.crash_dir = crash_dir
        self.engine_ready = engine_ready or (lambda: False)
        self.on_error = on_error
        self.reraise = reraise
        self.error: BaseException | None = None  #: the exception that ended the job, if any

    def __enter__(self) -> "JobFrame":
        self.save(self.record)
        return self

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Run one named step: once its body ends without an exception, ``name`` is appended
        to ``steps_done`` and the record saved."""
        yield
        self.record.steps_done.append(name)
        self.save(self.record)

    def complete(self, exit_code: int, status: str = "complete", reason: str | None = None
                 ) -> int:
        """The job ran to its result: ``status`` (complete unless the job knows better),
        ``exit_code``, ``ended_at`` now; saves and returns ``exit_code``."""
        r = self.record
        r.status, r.exit_code, r.reason, r.ended_at = status, int(exit_code), reason, now_iso()
        self.save(r)
        return int(exit_code)

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is None:
            return False
        r = self.record
        if not isinstance(exc, (Exception, KeyboardInterrupt)):  # SystemExit, GeneratorExit
            r.status, r.ended_at = "incomplete", now_iso()
            self.save(r)
            return False
        r.status, r.exit_code, r.reason, r.root_cause = job_outcome(
            exc, engine_ready=self.engine_ready(), crash_dir=self.crash_dir,
            write_log=self.crash_dir is not None or not self.reraise)
        r.ended_at = now_iso()
        self.error = exc
        if self.on_error is not None:
            self.on_error(exc, r)
        self.save(r)
        return not self.reraise
