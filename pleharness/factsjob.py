"""The ``facts`` job: a quick pre-flight that prints the engine facts with their sources.

``ple-harness facts --url URL`` reads a running engine; ``--model PATH`` / ``--engine-profile FILE``
(or neither: the embedded model) launches one exactly as ``ple-harness stress`` would, reads its
facts once it is ready, and stops it (always, also on errors and Ctrl-C). Sources and ranking:
:mod:`pleharness.engine.facts`. Output: a table (fact, value, source, other sources), the conflicts
as warnings, the facts that stayed unknown with what needs them (drawn by
:func:`pleharness.render.facts.render_facts`), and optionally JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .engine.launch import redact_env
from .engine.session import EngineSession, resolve_target
from .files import private_dir, write_private
from .environment import gpu_inventory
from .errors import UsageError
from .jobrecord import JobFrame, JobRecord
from .redact import redact_argv
from .render.facts import render_facts

@dataclass
class FactsConfig:
    """Options of ``ple-harness facts`` (see its --help): attach to ``url`` or launch ``model``
    (None: the embedded model); ``json_path``: also write the facts there as JSON."""

    url: str | None = None
    model: str | None = None
    engine_python: str = "python3"
    tp: int = 1
    engine_args: list[str] = field(default_factory=list)
    engine_env: dict[str, str] = field(default_factory=dict)
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    api_key: str | None = None
    log_dir: Path = Path("results") / "facts"
    start_timeout_s: float = 900.0
    json_path: Path | None = None
    explicit: dict = field(default_factory=dict)


def run_facts(cfg: FactsConfig, console: Console) -> int:
    """Gather and print the facts; returns 0, or raises UsageError / EngineError (exit 2 / 3).

    The engine is resolved and started exactly as ``stress`` does, in an engine session
    (:mod:`pleharness.engine.session`: stopped on every exit path, SIGINT / SIGTERM raise
    Interrupted, exit 130 / 143), and stopped before the facts are printed. The steps (engine,
    report) run in the job frame (:class:`~pleharness.jobrecord.JobFrame`); with
    ``cfg.json_path``, the JSON holds its record (``job``), also when the job failed (then only
    the record; a file that cannot be written then is left out, the job's own error stands)."""
    out: dict = {}

    def save(rec: JobRecord) -> None:
        if cfg.json_path is None or rec.ended_at is None:  # written once the job ended
            return
        try:
            private_dir(cfg.json_path.parent)
            write_private(cfg.json_path, json.dumps({**out, "job": rec.model_dump()}, indent=2,
                                                    default=str) + "\n")
        except OSError as exc:
            if rec.status == "complete":
                raise UsageError(f"--json {str(cfg.json_path)!r}: cannot write: "
                                 f"{exc.strerror or exc}") from None

    with JobFrame("facts", save) as frame:
        with frame.step("engine"):
            target = resolve_target(url=cfg.url, model=cfg.model, python=cfg.engine_python,
                                    tp=cfg.tp, engine_args=cfg.engine_args,
                                    engine_env=cfg.engine_env, served_name=cfg.served_model_name,
                                    host=cfg.host, api_key=cfg.api_key,
                                    start_timeout_s=cfg.start_timeout_s, log=console.print)
            with EngineSession(console, cfg.log_dir, explicit_facts=cfg.explicit,
                               gpus_before=gpu_inventory() if cfg.url is None else None
                               ) as session:
                eng = session.start(target)
        with frame.step("report"):
            server, facts, version = eng.server, eng.facts, eng.version
            url = server.url if server is not None else cfg.url
            render_facts(facts, console, title=f"engine facts: vLLM {version} at {url}")
            out.update({"url": url, "version": version,
                        "mode": "launched" if server else "attached",
                        "command": redact_argv(server.command) if server else None,
                        "launch_env": redact_env(server.spec.env) if server else None,
                        "facts": facts.to_dict(), "conflicts": facts.conflicts,
                        "sources_read": facts.notes})
            if session.gpu_memory:  # launched on GPUs: did their memory come back?
                out["gpu_memory"] = session.gpu_memory
        frame.complete(0)
    if cfg.json_path:
        console.print(f"facts written to {escape(str(cfg.json_path))}")
    return 0
