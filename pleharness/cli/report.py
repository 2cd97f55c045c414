"""``ple-harness report``: re-render a run (:mod:`pleharness.render`)."""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from .. import files
from ..compare import load
from ..errors import ExitCode
from ..manifest import lines_beyond
from ..plot import plot_run
from ..render import render as render_console
from ..render import to_junit, to_markdown
from . import Command, app, console, err_console


class ReportFormat(str, Enum):
    """``report --format``: console tables, Markdown (summary.md) or JUnit XML."""

    console = "console"
    markdown = "markdown"
    junit = "junit"


@app.command(cls=Command, epilog=(
    "Example: ple-harness report results/RUN --format markdown\n\n"
    "ple-harness report results/RUN --format junit > junit.xml"))
def report(
    run: Annotated[Path, typer.Argument(help="Run folder or manifest.json.")],
    format: Annotated[ReportFormat, typer.Option("--format", "-f",
        help="console (verdict, causes, next steps, tables), markdown (summary.md) or junit "
             "(JUnit XML), on stdout.")] = ReportFormat.console,
    plot: Annotated[Optional[str], typer.Option(metavar="PNG",
        help="Also write a PNG: decode tok/s and TTFT per phase, mismatches marked "
             "(needs matplotlib).")] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero",
        help="Exit 0 whenever the report was written, whatever the run's verdict.")] = False,
):
    """Re-render a run: console, Markdown (summary.md) or JUnit XML; exits with the run's exit code.

    Works on a finished or interrupted run.
    The report goes to stdout, notes to stderr. Exit code: the run's own recorded exit code
    (0 pass, 1 fail, 3 engine failed or died, 4 internal error, 130/143 interrupted; 1 for a run
    that recorded none, e.g. killed), so a CI step that renders the report also gates like the run
    did; with --exit-zero, 0. Exit 2: the run cannot be read, or bad options.
    """
    plot_path = files.check_plot_path(plot) if plot is not None else None
    m = load(run)
    extra = lines_beyond(run)
    if extra:
        err_console.print(f"note: {escape(m.requests_file or 'the request file')} holds {extra} "
                          f"line(s) after the {m.requests_count} record(s) the manifest covers: "
                          "left out of this report (a phase that ended before its manifest was "
                          "written, or lines not written by ple-harness)")
    if plot_path is not None:
        err_console.print(f"plot written to {escape(str(plot_run(m, plot_path)))}")
    if format is ReportFormat.console:
        render_console(m, console, run_dir=str(run.parent if run.suffix == ".json" else run))
    elif format is ReportFormat.markdown:
        sys.stdout.write(to_markdown(m))
    else:
        sys.stdout.write(to_junit(m))
    sys.stdout.flush()
    code = m.exit_code
    if code is None:
        code = ExitCode.FAIL
        why = ("it was stopped before it could write one" if m.status != "complete" else
               "a manifest without a verdict of its own, such as a control run's")
        err_console.print(f"note: run {escape(m.run_id)} recorded no exit code (status "
                          f"{m.status}: {why}); exit "
                          + ("0 (--exit-zero; 1 without it)" if exit_zero else "1"))
    raise typer.Exit(ExitCode.OK if exit_zero else code)
