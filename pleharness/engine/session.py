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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.markup import escape

from .engine.client import EngineClient, Timeouts
from .engine.facts import EngineFacts, gather_facts, parse_engine_args
from .engine.launch import EngineServer, LaunchSpec, engine_python_check, redact_env
from .errors import EngineError, UsageError
from .redact import redact_argv, redact_url

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
    if url is None:
        problem = engine_python_check(python)
        if problem:
            raise UsageError(problem)
        if model is None:
            from .model import SERVED_NAME, ensure_embedded_model
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
    elif not EngineClient(url, api_key=api_key).health(timeout=10):
        raise UsageError(f"no engine answers GET {redact_url(url.rstrip('/'))}/health with 200 "
                         "(is the server running and the URL right?)")
    return Target(url=url, model_path=model, served_name=served_name, python=python, tp=tp,
                  engine_args=args, engine_env=env, base_args=base, host=host, port=port,
                  api_key=api_key, start_timeout_s=start_timeout_s)


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
    :func:`pleharness.engine.launch.redact_env`), host, profile."""
    return {"model": spec.model, "python": spec.python, "tp": spec.tp,
            "engine_args": redact_argv(spec.engine_args), "env": redact_env(spec.env),
            "host": spec.host, "profile": profile}


def start_or_attach(stack: contextlib.ExitStack, target: Target, console: Console, *,
                    spec: LaunchSpec | None = None, log_dir: Path, log_name: str = "engine",
                    what: str = "engine", timeouts: Timeouts | None = None,
                    explicit_facts: dict[str, Any] | None = None, gather: bool = True,
                    facts_engine_args: list[str] | None = None, engine_first: bool = True,
                    servers: list[EngineServer] | None = None,
                    stop_grace_s: Callable[[], float | None] = lambda: None) -> Engine:
    """Launch ``spec`` (default: the target's own launch) or attach to ``target.url``; return the
    ready :class:`Engine`.

    A launched server logs to ``log_dir/<log_name>.log``; once ready it is appended to ``servers``
    (the engines running now, e.g. for a signal handler to kill) and ``stack`` stops it on close
    (grace period ``stop_grace_s()`` seconds; None: the server's default) unless it has left
    ``servers`` already (stopped early by the caller). With ``gather`` the facts are read (:func:`pleharness.engine.facts.gather_facts`) with
    ``facts_engine_args`` (default: the server's command) as launch arguments.

    Raises EngineError: the engine failed to start, or its ``/health`` does not answer 200.
    """
    server = None
    if target.url is None:
        spec = spec or target.launch_spec()
        server = EngineServer(spec, log_dir, target.start_timeout_s, api_key=target.api_key,
                              log_name=log_name)
        running = servers if servers is not None else []

        def stop(srv: EngineServer = server) -> None:
            if srv in running:  # still listed while it stops: a second Ctrl-C can SIGKILL it
                try:
                    with console.status(f"stopping the {what} ..."):
                        srv.stop(grace_s=stop_grace_s())
                finally:
                    running.remove(srv)
        with console.status(f"starting the {what} (see {escape(server.log_path.name)}) ..."):
            server.start()  # stops the server itself when it fails to become ready
        running.append(server)
        stack.callback(stop)
        console.print(f"{what} ready after {server.ready_s:.0f} s at {server.url}")
    url = server.url if server is not None else target.url
    client = EngineClient(url, target.served_name, target.api_key, timeouts or Timeouts())
    if not client.health(timeout=10):
        raise EngineError(f"no engine answers /health with 200 at {redact_url(url)}")
    client.resolve_model()
    card = client.model_card()
    facts = None
    if gather:
        local_model = target.model_path if server is not None else (card.get("root") or None)
        facts = gather_facts(
            explicit=explicit_facts or {},
            engine_args=facts_engine_args if facts_engine_args is not None else
            (server.command if server else None),
            launched=server is not None, tp=target.tp, model_card=card, model_path=local_model,
            client=client, engine_log=server.log_path if server else None,
            engine_first=engine_first)
    return Engine(client, server, facts, card, client.version())


__all__ = ["EMBEDDED_ENGINE_ARGS", "EMBEDDED_ENV", "Engine", "Target", "defaults_not_overridden",
           "launch_record", "resolve_target", "start_or_attach"]
