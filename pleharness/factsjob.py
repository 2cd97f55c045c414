"""The ``facts`` job: a quick pre-flight that prints the engine facts with their sources.

``ple-harness facts --url URL`` reads a running engine; ``--model PATH`` / ``--engine-profile FILE``
(or neither: the embedded model) launches one exactly as ``ple-harness stress`` would, reads its
facts once it is ready, and stops it (always, also on errors and Ctrl-C). Sources and ranking:
:mod:`pleharness.engine.facts`. Output: a table (fact, value, source, other sources), the conflicts
as warnings, the facts that stayed unknown with what needs them, and optionally JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .engine.client import EngineClient
from .errors import EngineError, UsageError
from .engine.facts import EngineFacts, gather_facts
from .engine.launch import EngineServer, LaunchSpec, engine_python_check, redact_env

# which derived schedules need which fact (printed for facts that stayed unknown)
NEEDED_BY = {
    "block_size": "boundary n*B + q",
    "max_num_batched_tokens": "boundary n*C + q, pairs",
    "num_speculative_tokens": "q in every boundary length; c*q capture edges",
    "max_num_seqs": "capture_edges c = max_num_seqs, +1; kv_pressure N limit",
    "max_model_len": "boundary M edges; every prompt length bound",
    "vocab_size": "random prompts; vocab_range check",
    "cudagraph_capture_sizes": "capture_edges c = s, s + 1, S_max + 1",
    "cudagraph_mode": "capture_edges",
    "kv_cache_size_tokens": "kv_pressure",
    "dtype": "dtype-derived near-tie threshold",
}


@dataclass
class FactsConfig:
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
    """Gather and print the facts; returns 0, or raises UsageError / EngineError (exit 2 / 3)."""
    server = None
    model_path, served, args, env = cfg.model, cfg.served_model_name, list(cfg.engine_args), \
        dict(cfg.engine_env)
    if cfg.url is not None and not EngineClient(cfg.url, api_key=cfg.api_key).health(timeout=10):
        raise UsageError(f"no engine answers GET {cfg.url.rstrip('/')}/health with 200 "
                         "(is the server running and the URL right?)")
    if cfg.url is None:
        problem = engine_python_check(cfg.engine_python)
        if problem:
            raise UsageError(problem)
        if model_path is None:
            from .model import SERVED_NAME, ensure_embedded_model
            from .stress import EMBEDDED_ENGINE_ARGS, EMBEDDED_ENV
            from .engine.facts import parse_engine_args
            model_path = str(ensure_embedded_model(cfg.engine_python, log=console.print))
            served = served or SERVED_NAME
            given = set(parse_engine_args(args))
            defaults = [EMBEDDED_ENGINE_ARGS[i: i + 2] for i in range(0, len(EMBEDDED_ENGINE_ARGS), 2)
                        if EMBEDDED_ENGINE_ARGS[i] not in given]
            args = [a for pair in defaults for a in pair] + args
            env = {**EMBEDDED_ENV, **env}
        elif not Path(model_path).exists():
            raise UsageError(f"model path {model_path} does not exist")
    try:
        if cfg.url is None:
            spec = LaunchSpec(model=model_path, python=cfg.engine_python, tp=cfg.tp,
                              engine_args=args, env=env, host=cfg.host, served_model_name=served)
            server = EngineServer(spec, cfg.log_dir, cfg.start_timeout_s, api_key=cfg.api_key)
            with console.status(f"starting the engine (log: {escape(str(server.log_path))}) ..."):
                server.start()
            console.print(f"engine ready after {server.ready_s:.0f} s at {server.url}")
            url = server.url
        else:
            url = cfg.url
        client = EngineClient(url, served, cfg.api_key)
        if not client.health(timeout=10):
            raise EngineError(f"no engine answers /health with 200 at {url}")
        client.resolve_model()
        card = client.model_card()
        facts = gather_facts(explicit=cfg.explicit, engine_args=server.command if server else None,
                             launched=server is not None, tp=cfg.tp, model_card=card,
                             model_path=model_path if server else (card.get("root") or None),
                             client=client, engine_log=server.log_path if server else None)
        version = client.version()
    finally:
        if server is not None:
            with console.status("stopping the engine ..."):
                server.stop()
    render_facts(facts, console, title=f"engine facts: vLLM {version} at {url}")
    if cfg.json_path:
        out = {"url": url, "version": version, "mode": "launched" if server else "attached",
               "command": server.command if server else None,
               "launch_env": redact_env(server.spec.env) if server else None,
               "facts": facts.to_dict(), "conflicts": facts.conflicts,
               "sources_read": facts.notes}
        cfg.json_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.json_path.write_text(json.dumps(out, indent=2, default=str) + "\n")
        console.print(f"facts written to {escape(str(cfg.json_path))}")
    return 0


def render_facts(facts: EngineFacts, console: Console, title: str = "engine facts") -> None:
    t = Table(title=escape(title))
    for col in ("fact", "value", "source", "other sources"):
        t.add_column(col)
    conflicted = {c["fact"] for c in facts.conflicts}
    for name, d in facts.to_dict().items():
        others = "; ".join(f"{o['value']!r} ({o['source']})" for o in d.get("observed", [])[1:])
        val = "unknown" if d["value"] is None else repr(d["value"])
        t.add_row(escape(name) + (" [red](conflict)[/red]" if name in conflicted else ""),
                  escape(val), escape(d["source"]), escape(others))
    console.print(t)
    for n in facts.notes:
        console.print(f"source: {escape(n)}")
    for w in facts.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    for name, needs in NEEDED_BY.items():
        if facts.get(name) is None:
            console.print(f"[yellow]unknown:[/yellow] {name} (needed by {needs}): those "
                          "schedules are skipped with this reason")
