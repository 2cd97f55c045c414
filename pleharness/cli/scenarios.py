"""``ple-harness scenarios``: list the shipped scenarios, check scenario and suite files, or
plan them on an engine's facts (``--facts``) without starting one."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..config import DEFAULT_SCENARIOS
from ..errors import ExitCode, UsageError
from ..planning import assumptions, load_plan_facts, plan_lines, plan_suite
from ..scenarios import REGISTRY, load_scenarios, scenario_dirs
from ..scenarios.base import load_scenario_file
from ..suites import load_suite
from ..tomlfile import read_toml
from . import Command, app, console, err_console


@app.command(cls=Command, epilog=(
    "Example: ple-harness scenarios --check premerge --facts gpu-tp4-mtp.example\n\n"
    "ple-harness scenarios --check my-suite.toml (a file of your own, before an engine starts)\n\n"
    "More: docs/gpu-quickstart.md (the plan on an engine's facts)."))
def scenarios(check: Annotated[Optional[list[Path]], typer.Option(
        help="Check this scenario or suite file (a path or a shipped name; repeatable) with the "
             "same validation stress runs before any engine starts: every problem listed, "
             "exit 2 when there is one.")] = None,
        facts: Annotated[Optional[Path], typer.Option(
            help="Also plan the checked files (default: the default suite) on this engine's "
                 "facts, without starting anything: a `ple-harness facts --json` file, a run's "
                 "manifest.json or its run folder, or an engine profile (a path or a shipped "
                 "name: its launch arguments). Prints every load phase (requests, prompt "
                 "lengths, max_tokens) and what will be left out or vacuous, and why; exit 4 "
                 "when a scenario kind would fail on that engine (a ple-harness bug).")] = None,
        no_chat_template: Annotated[bool, typer.Option(
            "--no-chat-template", help="With --facts: plan for a model without a chat template "
                                       "(a manifest says so itself).")] = False,
        no_structured_outputs: Annotated[bool, typer.Option(
            "--no-structured-outputs", help="With --facts: plan for an engine that serves no "
                                            "structured output.")] = False):
    """List the shipped scenarios, check scenario and suite files, or show a suite's plan on an engine's facts.

    No options: each shipped scenario with a one-line description. --check FILE: the
    validation stress runs before an engine starts. --facts: the plan (every load phase, and
    what is left out and why) on an engine's facts, without starting anything."""

    if facts is not None:
        raise typer.Exit(_plan(check or [], facts, no_chat_template, no_structured_outputs))
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
            if _is_suite(f):
                s = load_suite(str(f))
                console.print(f"{escape(str(f))}: ok (suite of {len(s.scenario)} scenarios)")
            else:
                sc = load_scenario_file(str(f))
                console.print(f"{escape(str(f))}: ok ({sc.kind})")
        except (UsageError, ValueError) as exc:
            bad += 1
            err_console.print(f"[red]{escape(str(f))}[/red]: {escape(str(exc))}")
    return ExitCode.USAGE if bad else ExitCode.OK


def _plan(files: list[Path], facts_path: Path, no_chat: bool, no_structured: bool) -> int:
    """``--facts``: each file (a suite or a scenario; none: the default suite) checked as
    :func:`_check` does, then planned on the facts (:mod:`pleharness.planning`). Returns 2 for a
    bad file or facts file (nothing planned), 4 when a plan has a problem, else 0."""
    try:
        facts, assume, source = load_plan_facts(facts_path)
    except UsageError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        return ExitCode.USAGE
    assume = assumptions(assume, chat_template=False if no_chat else None,
                         structured_outputs=False if no_structured else None)
    targets: list[tuple[str, list, int]] = []
    try:
        if not files:
            targets.append(("default suite", list(DEFAULT_SCENARIOS), 1))
        for f in files:
            if _is_suite(f):
                s = load_suite(str(f))
                targets.append((f"suite {f}", s.scenario_refs(), s.repeat))
            else:
                targets.append((f"scenario {f}", [str(f)], 1))
        loaded = [(title, load_scenarios(refs, {}), rep) for title, refs, rep in targets]
    except (UsageError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        return ExitCode.USAGE
    code = ExitCode.OK
    for title, scs, rep in loaded:
        plan = plan_suite(scs, facts, assume, rep, source)
        for line in plan_lines(plan, title):
            console.print(escape(line), highlight=False, soft_wrap=True)
        if plan.problems:
            code = ExitCode.INTERNAL
    return code


def _is_suite(f: Path) -> bool:
    """A suite file (``[[scenario]]`` entries, no ``kind``), or a shipped suite's name."""
    if Path(f).is_file():
        data = read_toml(Path(f), "file")
        return "scenario" in data and "kind" not in data
    return not Path(f).exists() and _is_suite_name(str(f))


def _is_suite_name(name: str) -> bool:
    return any((d / "suites" / f"{name}.toml").is_file() for d in scenario_dirs()) and not any(
        (d / f"{name}.toml").is_file() for d in scenario_dirs())
