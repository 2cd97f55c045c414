"""Console drawing of a comparison of two runs (``ple-harness compare``): the decode throughput
per concurrency, the lowest per-phase ratios, the parity mismatches (at most
:data:`pleharness.compare.MISMATCHES_SHOWN`), warnings, each run's verdict and causes, the gates
and the verdict line (which agrees with the exit code)."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..compare import MISMATCHES_SHOWN, Comparison


def render_comparison(res: Comparison, console: Console) -> None:
    """Print ``res`` (a :class:`pleharness.compare.Comparison`) on ``console``."""
    t = Table(title="decode throughput per concurrency (median over repeats, tok/s)")
    for col in ("C", "BASE", "HEAD", "HEAD/BASE"):
        t.add_column(col, justify="right")
    for c, r in res.concurrency_ratios.items():
        t.add_row(c, f"{res.base_throughput[c]['median_tok_per_s']:.1f}",
                  f"{res.head_throughput[c]['median_tok_per_s']:.1f}", f"{r:.3f}")
    console.print(t)
    if res.phase_ratios:
        worst = sorted(res.phase_ratios.items(), key=lambda kv: kv[1])[:5]
        console.print("lowest per-phase ratios: " + ", ".join(f"{escape(n)} {r:.3f}"
                                                              for n, r in worst))
    for mm in res.parity_mismatches[:MISMATCHES_SHOWN]:
        console.print(f"[red]parity:[/red] {escape(str(mm['prompt']))} (max_tokens "
                      f"{mm['max_tokens']}): {escape(mm['detail'])}; output hashes BASE "
                      f"{', '.join(mm['base'])} vs HEAD {', '.join(mm['head'])}")
    if len(res.parity_mismatches) > MISMATCHES_SHOWN:
        console.print(f"... and {len(res.parity_mismatches) - MISMATCHES_SHOWN} more parity "
                      "mismatches not shown")
    for w in res.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if res.only_in_one:
        console.print(f"{res.only_in_one} prompt(s) issued by only one of the runs (not compared)")
    for label, verdict, why in (("HEAD", res.head_verdict, res.head_causes),
                                ("BASE", res.base_verdict, res.base_causes)):
        console.print(f"{label} run verdict: {verdict}")
        for line in why[:5]:
            console.print(f"  - {escape(line)}")
    for g in res.gates_passed:
        console.print(f"[green]PASS[/green] {escape(g)}")
    for g in res.gate_failures:
        console.print(f"[red]FAIL[/red] {escape(g)}")
    if res.incomplete:  # no verdict at all: never "broken by this change"
        console.print(f"verdict: none ({escape(res.diagnosis)})")
        return
    console.print(f"verdict: {'pass' if res.passed else 'fail'} ({escape(res.diagnosis)})")
