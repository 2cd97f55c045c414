"""``ple-harness scenarios``: list the shipped scenarios, or check scenario and suite files."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..errors import ExitCode, UsageError
from ..scenarios import REGISTRY, scenario_dirs
from ..scenarios.base import load_scenario_file
from ..suites import load_suite
from ..tomlfile import read_toml
from . import Command, app, console, err_console


@app.command(cls=Command)
def scenarios(check: Annotated[Optional[list[Path]], typer.Option(
        help="Check this scenario or suite file (a path or a shipped name; repeatable) with the "
             "same validation stress runs before any engine starts: every problem listed, "
             "exit 2 when there is one.")] = None):
    """List the shipped scenarios with a one-line description each (or check files: --check)."""

    if check:
        raise typer.Exit(_check(check))
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


def _check(files: list[Path]) -> int:
    """Each file as stress would load it before an engine starts (a suite: every entry with its
    params); one line per file; 0 when all are valid, else 2."""
    bad = 0
    for f in files:
        try:
            data = read_toml(Path(f), "file") if Path(f).is_file() else {}
            is_suite = "scenario" in data and "kind" not in data
            if is_suite or (not Path(f).exists() and _is_suite_name(str(f))):
                s = load_suite(str(f))
                console.print(f"{escape(str(f))}: ok (suite of {len(s.scenario)} scenarios)")
            else:
                sc = load_scenario_file(str(f))
                console.print(f"{escape(str(f))}: ok ({sc.kind})")
        except (UsageError, ValueError) as exc:
            bad += 1
            err_console.print(f"[red]{escape(str(f))}[/red]: {escape(str(exc))}")
    return ExitCode.USAGE if bad else ExitCode.OK


def _is_suite_name(name: str) -> bool:
    return any((d / "suites" / f"{name}.toml").is_file() for d in scenario_dirs()) and not any(
        (d / f"{name}.toml").is_file() for d in scenario_dirs())
