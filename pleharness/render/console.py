"""Console rendering of a run (rich), leading with the why: verdict and its causes, next steps,
then the phase table and the failing requests, and the headline last."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..manifest import Manifest
from ..causes import causes, headline
from .text import engaged_lines, next_steps, verdict_line


def render(m: Manifest, console: Console, max_failures: int = 20,
           run_dir: str | None = None) -> None:
    """Print the run: verdict and causes, next steps, then the phase table and failing requests,
    and the headline last (where a terminal leaves the eye)."""
    style = {"pass": "green", "fail": "red", "error": "red"}.get(m.verdict or "", "yellow")
    console.print(f"[bold {style}]verdict: {escape(verdict_line(m))}[/bold {style}] "
                  f"run {escape(m.run_id)}")
    why = causes(m)
    if why:
        console.print("[bold]why:[/bold]")
        for line in why:
            console.print(f"  - {escape(line)}")
    if m.verdict != "pass":
        console.print("[bold]next steps:[/bold]")
        for text, cmd in next_steps(m, run_dir):
            console.print(f"  - {escape(text)}" + (f" {escape(cmd)}" if cmd else ""))
    t = Table(title=escape(f"run {m.run_id}"), show_lines=False)
    for col, just in (("phase", "left"), ("scenario", "left"), ("C", "right"),
                      ("requests", "right"), ("matched", "right"), ("errors", "right"),
                      ("decode tok/s", "right"), ("TTFT p50 s", "right"), ("status", "left")):
        t.add_column(col, justify=just)
    for ph in m.phases:
        compared = ph.matched + ph.mismatched
        st = {"fail": "red", "pass": "", "not_run": "yellow", "interrupted": "yellow",
              "skip": "yellow"}.get(ph.status, "")
        t.add_row(escape(ph.name), escape(ph.scenario), str(ph.concurrency), str(ph.requests),
                  f"{ph.matched}/{compared}" if ph.role == "load" or compared else "-",
                  str(ph.errors),
                  f"{ph.decode_tok_per_s:.1f}" if ph.decode_tok_per_s is not None else "-",
                  f"{ph.ttft_s_median:.3f}" if ph.ttft_s_median is not None else "-",
                  escape(ph.status + (f" ({ph.reason})" if ph.reason else "")), style=st)
    if m.phases:
        console.print(t)
    bad = [r for r in m.requests if r.is_problem or r.divergence or r.differential]  # warnings
    if bad:
        ft = Table(title="failing requests and divergences")
        for col in ("request", "phase", "C", "prompt", "len", "first divergent pos", "class",
                    "problem"):
            ft.add_column(col)
        for r in bad[:max_failures]:
            probs = []
            if r.error:
                probs.append(f"{r.error}: {r.error_detail or ''}"[:120])
            elif r.match is False:
                probs.append(f"hash {(r.output_hash or '')[:12]} != reference "
                             f"{(r.reference_hash or '')[:12]}")
            probs += [f"{c.name}: {c.detail}"[:160] for c in r.checks
                      if c.status == "fail" or (c.name == "parity" and c.status == "warn")]
            cls, pos = "-", r.first_divergence
            d = r.divergence or r.differential
            if d:
                cls = d.cls + ("" if d.fails else " (warn)")
                pos = d.position if pos is None else pos
            ft.add_row(escape(r.id), escape(r.phase), str(r.concurrency), escape(r.prompt_key),
                       str(r.prompt_len), "-" if pos is None else str(pos), cls,
                       escape("; ".join(probs)), style="yellow" if cls.endswith("(warn)") else "")
        console.print(ft)
        if len(bad) > max_failures:
            console.print(f"... and {len(bad) - max_failures} more (see the manifest)")
    eng = engaged_lines(m)
    if eng:
        console.print("[bold]exercised:[/bold]")
        for line in eng:
            console.print(f"  {escape(line)}")
    when = m.timeline.line()
    if when:
        console.print(f"[bold]time line:[/bold] {escape(when)}", highlight=False)
    console.print(escape(headline(m)))
