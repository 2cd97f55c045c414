"""``ple-harness compare``: parse, then :func:`pleharness.compare.compare` and
:func:`pleharness.render.compare.render_comparison`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..compare import check_thresholds, check_thresholds_against, compare, load
from ..errors import ExitCode
from ..render.compare import render_comparison
from ..suites import load_suite
from . import Command, app, console


def _run_path(p: Path) -> Path:
    """A run argument as the resolved manifest file (folder or manifest.json)."""
    p = p.resolve()
    return p / "manifest.json" if p.is_dir() else p


@app.command("compare", cls=Command, epilog=(
    "Example: ple-harness compare results/BASE results/HEAD --min-throughput-ratio 0.95\n\n"
    "ple-harness compare --suite premerge results/head/control-manifest.json results/head "
    "(the pre-merge gate of docs/ci.md)"))
def compare_cmd(
    base: Annotated[Path, typer.Argument(help="BASE run folder or manifest.")],
    head: Annotated[Path, typer.Argument(help="HEAD run folder or manifest.")],
    min_throughput_ratio: Annotated[Optional[float], typer.Option(min=0.0,
        help="Gate: every per-concurrency median HEAD/BASE decode throughput ratio >= R.")] = None,
    min_phase_ratio: Annotated[Optional[float], typer.Option(min=0.0,
        help="Gate: every per-phase HEAD/BASE ratio >= R (noisy for short phases).")] = None,
    threshold: Annotated[Optional[list[str]], typer.Option(
        help="Gate on HEAD's median decode tok/s, e.g. 'C4>=62.985', or on speculative-"
             "decoding health against BASE, e.g. 'acceptance>=0.95*base', "
             "'accepted_length@C4>=0.95*base'; repeatable.")] = None,
    suite: Annotated[Optional[str], typer.Option(
        help="Take the gates from this suite's \\[gates] (flags given here win).")] = None,
):
    """Gate HEAD against BASE: HEAD's own verdict, token parity between them, throughput and acceptance gates.

    Fails when HEAD failed on its own (and says whether BASE failed too: "broken before" vs
    "broken by this change"), when either run did not complete, when they serve different
    models, on a token difference that is not a near tie (judged as the runs judge their own:
    outputs a run tolerated, near ties or also_in_control, are warnings), and on a missed
    throughput gate. The same run twice passes with a warning. The last line agrees with the
    exit code. Exit 0 pass, 1 fail, 2 usage error (a run cannot be read, bad gate), 3 no
    verdict: BASE or HEAD did not complete (killed, interrupted, its engine died).
    """
    check_thresholds(threshold)
    if suite is not None:
        g = load_suite(suite).gates
        min_throughput_ratio = min_throughput_ratio if min_throughput_ratio is not None \
            else g.min_throughput_ratio
        min_phase_ratio = min_phase_ratio if min_phase_ratio is not None else g.min_phase_ratio
        threshold = threshold or g.thresholds
    b, h = load(base), load(head)
    check_thresholds_against(b, h, threshold)
    res = compare(b, h, min_throughput_ratio, min_phase_ratio, threshold,
                  same_run=_run_path(base) == _run_path(head))
    render_comparison(res, console)
    raise typer.Exit(ExitCode.ENGINE if res.incomplete else
                     ExitCode.OK if res.passed else ExitCode.FAIL)
