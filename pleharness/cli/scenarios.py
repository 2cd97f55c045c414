"""``ple-harness scenarios``: list the shipped scenarios."""
from __future__ import annotations

from rich.markup import escape

from . import Command, app, console


@app.command(cls=Command)
def scenarios():
    """List the shipped scenarios with a one-line description each."""
    from ..scenarios import REGISTRY, scenario_dirs
    from ..scenarios.base import load_scenario_file

    seen = set()
    for d in scenario_dirs():
        for f in sorted(d.glob("*.toml")):
            if f.stem in seen:
                continue
            seen.add(f.stem)
            try:
                sc = load_scenario_file(str(f))
                console.print(f"[bold]{f.stem}[/bold] ({sc.kind}): {escape(sc.description)}")
            except ValueError as exc:
                console.print(f"[red]{f.stem}[/red]: {escape(str(exc))}")
    console.print(f"scenario kinds: {', '.join(sorted(REGISTRY))}")
