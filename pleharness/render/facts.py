"""Console drawing of the engine facts (``ple-harness facts``): the table of facts with their
sources, the sources read, warnings, and each unknown fact with the schedules that need it."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..engine.facts import EngineFacts

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
