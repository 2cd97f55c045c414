"""The ``facts`` job: a quick pre-flight that prints the engine facts with their sources.

``ple-harness facts --url URL`` reads a running engine; ``--model PATH`` / ``--engine-profile FILE``
(or neither: the embedded model) launches one exactly as ``ple-harness stress`` would, reads its
facts once it is ready, and stops it (always, also on errors and Ctrl-C). Sources and ranking:
:mod:`pleharness.engine.facts`. Output: a table (fact, value, source, other sources), the conflicts
as warnings, the facts that stayed unknown with what needs them, and optionally JSON.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .engine.facts import EngineFacts
from .engine.launch import redact_env
from .engines import resolve_target, start_or_attach
from .redact import redact_argv

# which derived schedules need which fact (printed for facts that stayed unknown)
NEEDED_BY = {
    "block_size": "boundary n*B + q; prefix_isolation near duplicates; disconnects prefix sharers",
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

    The engine is resolved and started exactly as ``stress`` does (:mod:`pleharness.engines`)
    and stopped before the facts are printed."""
    target = resolve_target(url=cfg.url, model=cfg.model, python=cfg.engine_python, tp=cfg.tp,
                            engine_args=cfg.engine_args, engine_env=cfg.engine_env,
                            served_name=cfg.served_model_name, host=cfg.host, api_key=cfg.api_key,
                            start_timeout_s=cfg.start_timeout_s, log=console.print)
    with contextlib.ExitStack() as stack:
        eng = start_or_attach(stack, target, console, log_dir=cfg.log_dir,
                              explicit_facts=cfg.explicit)
    server, facts, version = eng.server, eng.facts, eng.version
    url = server.url if server is not None else cfg.url
    render_facts(facts, console, title=f"engine facts: vLLM {version} at {url}")
    if cfg.json_path:
        out = {"url": url, "version": version, "mode": "launched" if server else "attached",
               "command": redact_argv(server.command) if server else None,
               "launch_env": redact_env(server.spec.env) if server else None,
               "facts": facts.to_dict(), "conflicts": facts.conflicts,
               "sources_read": facts.notes}
        cfg.json_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.json_path.write_text(json.dumps(out, indent=2, default=str) + "\n")
        console.print(f"facts written to {escape(str(cfg.json_path))}")
    return 0


def render_facts(facts: EngineFacts, console: Console, title: str = "engine facts") -> None:
    """Print the facts table (fact, value, source, other sources; conflicts marked), the sources
    read, the warnings, and each unknown fact with the schedules that need it."""
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
