"""Typed errors and exit codes of the whole harness (not only the engine layer).

Every error the harness reports as one clear line is a :class:`HarnessError`; its ``exit_code`` is
the process exit status. Exit codes (documented once, used by the CLI): 0 every compared hash
matched and no check failed; 1 a parity or check failure (or failed requests); 2 usage error; 3 the
engine failed to start or died; 4 an internal harness error (a bug, traceback in a log file);
130 / 143 interrupted by SIGINT / SIGTERM.
"""
from __future__ import annotations

import os
import signal
import tempfile
from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """The process exit status of every ``ple-harness`` command (as pytest's ``ExitCode``)."""

    OK = 0  #: every compared hash matched and no check failed (or the command did its job)
    FAIL = 1  #: a parity or check failure, failed requests, a failed gate
    USAGE = 2  #: bad input found before anything was started
    ENGINE = 3  #: the engine failed to start or died
    INTERNAL = 4  #: an unexpected harness error (a bug): short message, traceback in a log file
    SIGINT = 130  #: interrupted by SIGINT (Ctrl-C)
    SIGTERM = 143  #: interrupted by SIGTERM


def write_crash_log(text: str, directory=None) -> str:
    """Write a traceback to ``<directory>/harness-error.log`` (a run folder) or, without one, to a
    new ``ple-harness-error-*.log`` in the temporary directory; returns the path. Never raises."""
    try:
        if directory is not None:
            path = Path(directory) / "harness-error.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # like the manifest
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return str(path)
    except OSError:
        pass
    try:
        fd, name = tempfile.mkstemp(prefix="ple-harness-error-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return name
    except OSError:
        return "(could not be written)"


class HarnessError(Exception):
    """Base class for errors the harness reports as one clear line."""

    exit_code = ExitCode.USAGE


class UsageError(HarnessError):
    """Bad input found before anything was started (exit 2)."""

    exit_code = ExitCode.USAGE


class EngineError(HarnessError):
    """The engine failed to start or died (exit 3).

    Attributes:
        root_cause: the most telling line of the engine log (last ``...Error:`` line), or None.
        log_path: path of engine.log, or None when attached to a URL.
    """

    exit_code = ExitCode.ENGINE

    def __init__(self, message: str, root_cause: str | None = None, log_path: str | None = None):
        super().__init__(message)
        self.root_cause = root_cause
        self.log_path = log_path

    def __str__(self) -> str:
        parts = [super().__str__()]
        if self.root_cause:
            parts.append(f"root cause: {self.root_cause}")
        if self.log_path:
            parts.append(f"log: {self.log_path}")
        return "; ".join(parts)


class RequestTimeoutAbort(HarnessError):
    """Raised after a phase with timed-out requests when the policy is ``--on-timeout abort``
    (exit 1: the run fails, incomplete)."""

    exit_code = ExitCode.FAIL


class Interrupted(HarnessError):
    """SIGINT or SIGTERM arrived while the job owned the signals (an engine session, or a job's
    own SIGTERM handler); the exit code is 128 + the signal number (130, 143).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum
