"""One engine session: launch or attach, readiness, signals, the kill list and GPU-memory release,
for every job and role.

``ple-harness stress`` (the engine under test, the reference engine, the control engine, the
fresh-engine replays of :mod:`pleharness.reproduce`), ``fuzz``, ``facts``, ``selftest`` and
``explain`` (the configuration under test and each suspect) all resolve their engine with
:func:`resolve_target` (which model, which arguments: the embedded model's defaults are added
here) and start it inside one :class:`EngineSession` (``with EngineSession(...) as session:
eng = session.start(target)``): launch or attach, wait until ready (the wait notices a process
that exits, :class:`~pleharness.engine.launch.EngineServer`), resolve the served model, read
the engine facts. The session owns what every launched engine needs on every exit path: it
stops each engine's whole process group when it closes (or earlier, :meth:`EngineSession.stop`);
while it is open SIGINT / SIGTERM raise :class:`Interrupted` (a second signal SIGKILLs the engines
running now and skips the stop grace period); after the engines stopped it checks that the GPUs'
memory came back (:func:`gpu_memory_after`). The pattern is vLLM's benchmarks/sweep/server.py
(own process group, a health wait that notices a crashed process, ``os.killpg`` of the whole
group on exit).

A second engine of another configuration (the control engine, the reference engine, an
``explain`` suspect) is a :class:`Variant` of the target's launch: flags dropped, flags added.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.markup import escape

from ..environment import gpu_inventory
from ..errors import EngineError, Interrupted, UsageError
from ..model import SERVED_NAME, ensure_embedded_model
from ..redact import redact_argv, redact_url
from ..timeline import EngineStart
from .client import EngineClient
from .inflight import Timeouts
from .fact_sources import flag_name, parse_engine_args, positions_warning
from .facts import EngineFacts, gather_facts
from .launch import EngineServer, LaunchSpec, engine_python_check, redact_env, signal_group
from .spares import SpareEngines
from .registry import leftover_engines, leftover_text

# Engine arguments added when the embedded model is launched: block size 32 is valid on the CPU
# attention backend (which refuses 16) and on GPUs.
# The chunked-prefill budget is set so that the boundary lengths n*C + q are known and short.
# float32: the embedded model's own dtype (vLLM's --dtype auto would downcast it to bfloat16), so
# the engine and the golden reference (transformers, float32) compute the same numbers: measured
# 16/16 greedy outputs identical on the CPU engine, at golden margins down to 0.0036 nats.
EMBEDDED_ENGINE_ARGS = ["--block-size", "32", "--max-num-batched-tokens", "256",
                        "--dtype", "float32"]
EMBEDDED_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@dataclass(frozen=True)
class Target:
    """Where a job's engine comes from: a URL to attach to, or what to launch.

    ``engine_args`` / ``engine_env``: the launch arguments and environment (the embedded model's
    defaults included); ``base_args``: what a second launch of another configuration (the
    reference engine) starts from (the embedded defaults, or nothing for a user's model).
    ``model_path`` is None when attaching.
    """

    url: str | None
    model_path: str | None
    served_name: str | None
    python: str
    tp: int = 1
    engine_args: list[str] = field(default_factory=list)
    engine_env: dict[str, str] = field(default_factory=dict)
    base_args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int | None = None
    api_key: str | None = None
    start_timeout_s: float = 900.0
    warnings: tuple[str, ...] = ()  # said before the launch (the run's manifest keeps them)

    def launch_spec(self, engine_args: list[str] | None = None, env: dict[str, str] | None = None,
                    port: int | None = None) -> LaunchSpec:
        """The launch of this target's model with other ``engine_args`` / ``env`` (default: its
        own) on ``port`` (default: a free one, or the target's own port with its own args)."""
        own = engine_args is None
        return LaunchSpec(model=self.model_path, python=self.python, tp=self.tp,
                          engine_args=list(self.engine_args if own else engine_args),
                          env=dict(self.engine_env if env is None else env), host=self.host,
                          port=self.port if own and port is None else port,
                          served_model_name=self.served_name)


def defaults_not_overridden(defaults: list[str], user: list[str]) -> list[str]:
    """The ``--flag value`` pairs of ``defaults`` (a flat list of pairs) whose flag the user's
    arguments do not set."""
    given = set(parse_engine_args(user))
    out = []
    for i in range(0, len(defaults), 2):
        if defaults[i] not in given:
            out += defaults[i: i + 2]
    return out


def resolve_target(*, url: str | None, model: str | None, python: str, tp: int = 1,
                   engine_args: list[str] | None = None, engine_env: dict[str, str] | None = None,
                   served_name: str | None = None, host: str = "127.0.0.1",
                   port: int | None = None, api_key: str | None = None,
                   start_timeout_s: float = 900.0,
                   log: Callable[[str], Any] = print) -> Target:
    """Resolve what to launch (or check what to attach to) before anything is started.

    Launching: ``python`` must import vLLM; without ``model`` the embedded model is used (its
    files verified, :func:`pleharness.model.ensure_embedded_model`) with
    :data:`EMBEDDED_ENGINE_ARGS` before the user's arguments (a flag the user sets wins) and
    :data:`EMBEDDED_ENV`. Attaching: ``url``'s ``/health`` must answer 200 within 10 s.

    Raises UsageError (the interpreter cannot import vLLM, the model path does not exist, nothing
    answers at ``url``); HarnessError when the embedded model's files do not verify.
    """
    args, env, base = list(engine_args or []), dict(engine_env or {}), []
    warnings: tuple[str, ...] = ()
    if url is None:
        problem = engine_python_check(python)
        if problem:
            raise UsageError(problem)
        if model is None:
            model = str(ensure_embedded_model(python, log=log))
            served_name = served_name or SERVED_NAME
            args = defaults_not_overridden(EMBEDDED_ENGINE_ARGS, args) + args
            base = list(EMBEDDED_ENGINE_ARGS)  # a reference engine starts from the defaults
            env = {**EMBEDDED_ENV, **env}
        elif not Path(model).exists():
            raise UsageError(f"model path {model} does not exist")
        elif not Path(model).is_dir():
            raise UsageError(f"--model {model}: a file, not a model folder (expected a folder "
                             "with config.json and the weights)")
        warning = positions_warning(model, args, env)
        if warning:
            log(escape(warning))
            warnings = (warning,)
    elif not EngineClient(url, api_key=api_key).health(timeout=10):
        raise UsageError(f"--url: no engine answers GET {redact_url(url.rstrip('/'))}/health "
                         "with 200 (is the server running and the URL right?)")
    return Target(url=url, model_path=model, served_name=served_name, python=python, tp=tp,
                  engine_args=args, engine_env=env, base_args=base, host=host, port=port,
                  api_key=api_key, start_timeout_s=start_timeout_s, warnings=warnings)


class Engine(NamedTuple):
    """A ready engine: its client (model resolved), the launched server (None when attached),
    the facts (None when not gathered), the ``/v1/models`` card and the engine's version."""

    client: EngineClient
    server: EngineServer | None
    facts: EngineFacts | None
    card: dict
    version: str | None

    def record(self) -> dict[str, Any]:
        """Manifest fields of a launched engine: command, version, ready_s (seconds, 3 places)."""
        srv = self.server
        return {"command": redact_argv(srv.command) if srv else None, "version": self.version,
                "ready_s": round(srv.ready_s or 0, 3) if srv else None}


def launch_record(spec: LaunchSpec, profile: str | None = None) -> dict[str, Any]:
    """The manifest's record of a launch: model, python, tp, engine_args, env (secrets redacted,
    :func:`pleharness.engine.launch.redact_env`), host, profile, compile_cache (the
    ``VLLM_CACHE_ROOT`` every engine of the job shares)."""
    return {"model": spec.model, "python": spec.python, "tp": spec.tp,
            "engine_args": redact_argv(spec.engine_args), "env": redact_env(spec.env),
            "host": spec.host, "profile": profile,
            "compile_cache": spec.env.get("VLLM_CACHE_ROOT")}




# -- a second configuration: flags dropped and added ---------------------------------------------
def control_args(engine_args: Sequence[str], drop: Sequence[str] = (),
                 add: Sequence[str] = ()) -> list[str]:
    """The arguments of a variant launch: ``engine_args`` without the flags in ``drop`` (each
    with its value, in the ``--flag value`` or ``--flag=value`` form; ``_`` and ``-`` in a flag
    name are the same flag, as in vLLM's parser), then ``add`` appended (later flags win in
    vLLM's argparse)."""
    out, i, args = [], 0, list(engine_args)
    drop = {flag_name(d) for d in drop}
    while i < len(args):
        a = args[i]
        if flag_name(a) in drop:
            i += 1 if "=" in a or i + 1 >= len(args) or args[i + 1].startswith("--") else 2
            continue
        out.append(a)
        i += 1
    return out + list(add)


@dataclass(frozen=True)
class Variant:
    """Another configuration of a target's launch, the one mechanism behind the control engine
    (``--control-drop-arg`` / ``--control-engine-arg`` / ``--control-profile``), the reference
    engine (``--reference-drop-arg`` / ``--reference-engine-arg``) and ``explain``'s suspects
    (``--suspect`` / ``--suspect-drop`` and the derived ones).

    The launch arguments are ``base`` (default: the target's own) without the flags of ``drop``,
    then ``add`` (:func:`control_args`); the environment is the target's with ``env`` over it.
    ``python``: another build's Python (``--control-engine-python``: the BASE build beside HEAD),
    None: the target's. Everything else (model, tp, host, served name) is the target's; the port
    is a free one.
    """

    drop: tuple[str, ...] = ()
    add: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    base: tuple[str, ...] | None = None
    python: str | None = None

    @classmethod
    def of(cls, drop: Sequence[str] = (), add: Sequence[str] = (),
           env: dict[str, str] | None = None, base: Sequence[str] | None = None,
           python: str | None = None) -> "Variant":
        """A variant from lists and a dict (the options' shapes)."""
        return cls(tuple(drop), tuple(add), tuple((env or {}).items()),
                   None if base is None else tuple(base), python)

    def apply(self, engine_args: Sequence[str], engine_env: dict[str, str]
              ) -> tuple[list[str], dict[str, str]]:
        """(arguments, environment) of the variant of a launch with these."""
        base = engine_args if self.base is None else self.base
        return control_args(base, self.drop, self.add), {**engine_env, **dict(self.env)}

    def spec(self, target: "Target") -> LaunchSpec:
        """The variant's launch of ``target``'s model (on a free port)."""
        spec = target.launch_spec(*self.apply(target.engine_args, target.engine_env))
        return replace(spec, python=self.python) if self.python else spec


# -- the session ---------------------------------------------------------------------------------
def gpu_memory_after(before: list[dict], tolerance_mib: float, console: Console,
                     wait_s: float = 30.0) -> dict[str, Any]:
    """Per-GPU memory after the engines stopped, against the pre-launch ``before``
    (:func:`pleharness.environment.gpu_inventory` rows): polled every 2 s until every GPU is
    back within ``tolerance_mib`` MiB or ``wait_s`` seconds passed. Returns the manifest's
    ``environment`` fields ``gpus_after_shutdown``, ``gpu_memory_released`` and, when not
    released, ``gpu_memory_warning`` (also printed)."""
    deadline = time.monotonic() + wait_s
    while True:
        after = gpu_inventory() or []
        by_index = {g["index"]: g for g in after}
        leaked = [(b["index"], by_index[b["index"]]["memory_used_mib"] - b["memory_used_mib"])
                  for b in before if b["index"] in by_index and
                  by_index[b["index"]]["memory_used_mib"] - b["memory_used_mib"] > tolerance_mib]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(2)
    out: dict[str, Any] = {"gpus_after_shutdown": after, "gpu_memory_released": not leaked}
    if leaked:
        msg = ", ".join(f"GPU {i}: +{d:.0f} MiB" for i, d in leaked)
        out["gpu_memory_warning"] = f"not back to baseline after {wait_s:.0f} s: {msg}"
        console.print(f"[yellow]warning:[/yellow] GPU memory {out['gpu_memory_warning']}")
    return out


class EngineSession:
    """The engines of one job, as a context manager: ``with EngineSession(console, log_dir) as
    session: eng = session.start(target)``.

    While open: SIGINT / SIGTERM raise :class:`Interrupted` in the main thread (``signals``;
    off in other threads, where Python cannot set handlers); a second signal SIGKILLs the
    process groups of the engines running now and makes the remaining stops skip their grace
    period. On close (every exit path): every engine still running is stopped, last started
    first, its whole process group (:meth:`EngineServer.stop`); then, when ``gpus_before`` was
    given and an engine was launched, the GPU memory is checked (:func:`gpu_memory_after`, the
    result in :attr:`gpu_memory`); then the old signal handlers come back.

    Attributes: ``servers`` (the launched engines running now, the last one the newest),
    ``starts`` (:class:`pleharness.timeline.EngineStart` of every launch that became ready:
    its start time and the compile cache's state),
    ``signalled`` (the signals received), ``launched`` (whether an engine was launched),
    ``gpu_memory`` (the GPU check's fields, {} when not run).

    ``spares``: engines started ahead (:class:`~pleharness.engine.spares.SpareEngines`, e.g.
    the confirmation replays' engines started while fuzz searched): a launch whose spec equals
    a ready spare's adopts it instead of starting a process (its start record says ``spare``);
    the session then owns and stops it like one it launched.
    """

    def __init__(self, console: Console, log_dir: Path, *, timeouts: Timeouts | None = None,
                 explicit_facts: dict[str, Any] | None = None, signals: bool = True,
                 gpus_before: list[dict] | None = None, gpu_tolerance_mib: float = 1024.0,
                 spares: SpareEngines | None = None):
        self.console = console
        self.spares = spares
        self.log_dir = Path(log_dir)
        self.timeouts = timeouts
        self.explicit_facts = dict(explicit_facts or {})
        self.signals = signals
        self.gpus_before = gpus_before
        self.gpu_tolerance_mib = gpu_tolerance_mib
        self.servers: list[EngineServer] = []
        self.signalled: list[int] = []
        self.launched = False
        self.leftovers: list[dict] | None = None  # engines earlier harnesses left (first launch)
        self.gpu_memory: dict[str, Any] = {}
        self.starts: list[EngineStart] = []  # every launch that became ready, in that order
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "EngineSession":
        if self.signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    self._stack.callback(signal.signal, sig, signal.signal(sig, self._on_signal))
                except ValueError:  # not in the main thread
                    pass
        if self.gpus_before:
            self._stack.callback(self._check_gpus)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _on_signal(self, signum, _frame) -> None:
        self.signalled.append(signum)
        if len(self.signalled) > 1:  # a second Ctrl-C / SIGTERM: kill now, skip the grace
            for srv in self.servers:
                if srv.proc is not None:
                    signal_group(srv.proc.pid, signal.SIGKILL)
            return
        raise Interrupted(signum)

    def _check_gpus(self) -> None:
        if self.launched and self.gpus_before:
            self.gpu_memory = gpu_memory_after(self.gpus_before, self.gpu_tolerance_mib,
                                               self.console)

    def grace_s(self) -> float | None:
        """Stop grace period: none after a second signal, else the server's default."""
        return 0 if len(self.signalled) > 1 else None

    def start(self, target: Target, *, spec: LaunchSpec | None = None,
              log_dir: Path | None = None, log_name: str = "engine", what: str = "engine",
              gather: bool = True, facts_engine_args: list[str] | None = None,
              engine_first: bool = True) -> Engine:
        """Launch ``spec`` (default: the target's own launch) or attach to ``target.url``;
        return the ready :class:`Engine`.

        A launched server logs to ``<log_dir>/<log_name>.log`` (default: the session's folder);
        it is stopped when the session closes, or earlier by :meth:`stop`. With ``gather`` the
        facts are read (:func:`pleharness.engine.facts.gather_facts`, with the session's
        explicit facts) with ``facts_engine_args`` (default: the server's command) as launch
        arguments. Raises EngineError: the engine failed to start (it is stopped first), or
        its ``/health`` does not answer 200; Interrupted on a signal while waiting.
        """
        server = None
        if target.url is None:
            server = self._launch(target, spec or target.launch_spec(), log_dir or self.log_dir,
                                  log_name, what)
        # a server that is up but then fails (facts, /health) stays listed until the session
        # closes or stop_all(): the caller's error report reads its log first
        return self._ready(target, server, gather, facts_engine_args, engine_first)

    def _ready(self, target: Target, server: EngineServer | None, gather: bool,
               facts_engine_args: list[str] | None, engine_first: bool) -> Engine:
        url = server.url if server is not None else target.url
        client = EngineClient(url, target.served_name, target.api_key,
                              self.timeouts or Timeouts())
        if not client.health(timeout=10):
            raise EngineError(f"no engine answers /health with 200 at {redact_url(url)}")
        client.resolve_model()
        card = client.model_card()
        facts = None
        if gather:
            local_model = target.model_path if server is not None else (card.get("root") or None)
            facts = gather_facts(
                explicit=self.explicit_facts,
                engine_args=facts_engine_args if facts_engine_args is not None else
                (server.command if server else None),
                launched=server is not None, tp=target.tp, model_card=card,
                model_path=local_model, client=client,
                engine_log=server.log_path if server else None, engine_first=engine_first)
        return Engine(client, server, facts, card, client.version())

    def _launch(self, target: Target, spec: LaunchSpec, log_dir: Path, log_name: str,
                what: str) -> EngineServer:
        self.launched = True
        spare = self.spares.take(spec) if self.spares is not None else None
        if spare is not None:
            return self._adopt(*spare, what)
        server = EngineServer(spec, log_dir, target.start_timeout_s, api_key=target.api_key,
                              log_name=log_name)
        if self.leftovers is None:  # once per job: name what a killed run left running
            self.leftovers = leftover_engines()
            for rec in self.leftovers:
                self.console.print(f"[yellow]warning:[/] {escape(leftover_text(rec))}")

        main = threading.current_thread() is threading.main_thread()
        # one live display at a time: a side-by-side worker thread starts without a spinner
        with (self.console.status(f"starting the {what} (see {escape(server.log_path.name)}) ...")
              if main else contextlib.nullcontext()):
            try:
                server.start()  # stops the server itself when it fails to become ready
            except EngineError as exc:
                if self.leftovers:  # they hold ports and (GPU) memory: say so with the failure
                    exc.args = (f"{exc.args[0]} ({len(self.leftovers)} engine(s) left by an "
                                "earlier harness still running: see the warning above)",
                                *exc.args[1:])
                raise
        self._own(server, what)
        start = EngineStart.measured(what, server.ready_s, **server.compile_cache)
        self.starts.append(start)
        self.console.print(f"{what} ready after {server.ready_s:.0f} s at {server.url}"
                           f"{start.cache_text()}", highlight=False)
        return server

    def _own(self, server: EngineServer, what: str) -> None:
        """List ``server`` as this session's, stopped when the session closes."""
        def stop() -> None:
            if server in self.servers:  # still listed while it stops: a 2nd signal kills it
                with (self.console.status(f"stopping the {what} ...")
                      if threading.current_thread() is threading.main_thread()
                      else contextlib.nullcontext()):
                    self._stop(server)
        self.servers.append(server)
        self._stack.callback(stop)

    def _adopt(self, server: EngineServer, start: EngineStart, what: str) -> EngineServer:
        """A spare started ahead, taken over as this session's ``what``: its start record
        (when it became ready, from the command's start) with ``spare`` set."""
        self._own(server, what)
        self.starts.append(start.model_copy(update={"what": what, "spare": True}))
        self.console.print(f"{what}: a fresh engine started ahead (ready after "
                           f"{server.ready_s:.0f} s, at {start.at_s} s of the command) at "
                           f"{server.url}{start.cache_text()}", highlight=False)
        return server

    def _stop(self, server: EngineServer) -> None:
        try:
            server.stop(grace_s=self.grace_s())
        finally:
            self.servers.remove(server)

    def stop_all(self) -> None:
        """Stop every engine running now, last started first."""
        for srv in reversed(list(self.servers)):
            self._stop(srv)

    def stop(self, eng: Engine) -> None:
        """Stop ``eng``'s server now (a no-op when attached or stopped already): one engine at a
        time on one GPU. A stopped server's client is closed with it (its connection pool and
        event loop: left to the garbage collector, aiohttp printed "Unclosed client session" in
        the middle of explain's console)."""
        if eng.server is not None and eng.server in self.servers:
            try:
                self._stop(eng.server)
            finally:
                eng.client.close()


__all__ = ["EMBEDDED_ENGINE_ARGS", "EMBEDDED_ENV", "Engine", "EngineSession", "Interrupted",
           "Target", "Variant", "control_args", "defaults_not_overridden", "flag_name",
           "gpu_memory_after", "launch_record", "resolve_target"]
