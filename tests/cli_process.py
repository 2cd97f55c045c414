"""``python -m pleharness ARGS`` as a process of its own, forked from a server that has already
imported the CLI (issue 49: the suite's time).

Each ``ple-harness`` call of the tests used to start a fresh interpreter that imported the
package, typer, rich, aiohttp and numpy again: 0.6-0.8 s of CPU a call, about 300 calls in the
no-engine pass alone. Here a :mod:`multiprocessing` fork server (the standard library's
``forkserver`` start method, one per test process) imports :mod:`pleharness.cli` once; each call
is a child forked from it that runs the package as ``python -m`` does (:func:`runpy.run_module`
with ``run_name="__main__"``, so click names the program ``python -m pleharness`` as before),
with the call's environment, working directory, argv, and its stdout and stderr in files of its
own. What the child does is the CLI's: its exit code (a signal's as ``-N``, as
:mod:`subprocess` reports it), its output, the engines and workers it starts, its exit handlers
(run as an interpreter's exit runs them).

What differs from a fresh interpreter: the modules the fork server imported were imported
before the call's environment was set, so a module that reads the environment at import time
sees the test process's (the harness reads its variables when a command runs); stdin is
``/dev/null``; the child's parent is the fork server. ``PLE_TEST_CLI_SPAWN=1`` runs every call
as a fresh interpreter instead (:func:`run_spawned`), e.g. to rule this module out.
"""
from __future__ import annotations

import atexit
import functools
import io
import locale
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

@functools.cache
def _forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pleharness.cli"])
    return ctx


def _fresh_stream(fd: int, encoding: str, errors: str) -> io.TextIOWrapper:
    """A text stream on ``fd`` as a fresh interpreter opens one for a file (block buffered;
    stderr line buffered as Python 3.9+ makes it)."""
    return io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
                            encoding=encoding, errors=errors, line_buffering=fd == 2)


def _child(args: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """In the forked child: the call's environment, directory and output files, then the
    package run as ``python -m pleharness ARGS``. Its SystemExit is the process's exit code."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    # the encoding the fork server's interpreter chose for its own streams, as a fresh one would
    encoding = sys.__stdout__.encoding if sys.__stdout__ is not None else "utf-8"
    sys.stdout = sys.__stdout__ = _fresh_stream(1, encoding, "strict")
    sys.stderr = sys.__stderr__ = _fresh_stream(2, encoding, "backslashreplace")
    sys.argv = [sys.argv[0], *args]
    try:
        runpy.run_module("pleharness", run_name="__main__", alter_sys=True)
    finally:
        # what an interpreter's exit does, in its order (multiprocessing's child would only join
        # the threads, after the target): join the non-daemon threads, then the exit handlers
        threading._shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def run_spawned(args: list[str], env: dict[str, str], cwd: Path,
                timeout: float) -> subprocess.CompletedProcess:
    """``python -m pleharness ARGS`` in a fresh interpreter (:func:`subprocess.run`)."""
    return subprocess.run([sys.executable, "-m", "pleharness", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def run_forked(args: list[str], env: dict[str, str], cwd: Path,
               timeout: float) -> subprocess.CompletedProcess:
    """``python -m pleharness ARGS`` in a child of the fork server: the same
    :class:`subprocess.CompletedProcess` (text output, universal newlines) and
    :class:`subprocess.TimeoutExpired` (the child killed first) as :func:`run_spawned`."""
    if os.environ.get("PLE_TEST_CLI_SPAWN") == "1":
        return run_spawned(args, env, cwd, timeout)
    cmd = [sys.executable, "-m", "pleharness", *args]
    with tempfile.TemporaryDirectory(prefix="ple-cli-") as d:
        out, err = Path(d) / "stdout", Path(d) / "stderr"
        proc = _forkserver().Process(target=_child, args=(list(args), dict(env), str(cwd),
                                                          str(out), str(err)))
        proc.start()
        proc.join(timeout)
        timed_out = proc.exitcode is None
        if timed_out:
            proc.kill()
            proc.join()
        code = proc.exitcode
        proc.close()
        # decoded as subprocess.run(text=True) decodes: the locale's encoding, universal newlines
        text = [p.read_text(encoding=locale.getpreferredencoding(False)) if p.exists() else ""
                for p in (out, err)]
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=text[0], stderr=text[1])
    return subprocess.CompletedProcess(cmd, code, text[0], text[1])
