"""Console rendering of a run: phase table, failing requests, headline line."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .manifest import Manifest


def headline(m: Manifest) -> str:
    """E.g. '16/16 phases completed; 80/80 token hashes matched their single-request references'."""
    s = m.summary
    line = (f"{s.get('phases_completed', 0)}/{s.get('phases_planned', 0)} phases completed; "
            f"{s.get('hashes_matched', 0)}/{s.get('hashes_compared', 0)} token hashes matched "
            "their single-request references")
    if s.get("near_ties"):
        line += f"; {s['near_ties']} near-tie divergence(s) (warnings)"
    if s.get("hard_divergences"):
        line += f"; {s['hard_divergences']} hard divergence(s)"
    if s.get("also_in_control") or s.get("only_under_test"):
        line += (f"; control run: {s.get('also_in_control', 0)} divergence(s) also in the control "
                 f"(engine numerics, warnings), {s.get('only_under_test', 0)} only under test")
    if s.get("model_behaviour_notes"):
        line += f"; {s['model_behaviour_notes']} model-behaviour note(s) (not failures)"
    return line


def render(m: Manifest, console: Console, max_failures: int = 20) -> None:
    t = Table(title=escape(f"run {m.run_id}"), show_lines=False)
    for col, just in (("phase", "left"), ("scenario", "left"), ("C", "right"),
                      ("requests", "right"), ("matched", "right"), ("errors", "right"),
                      ("decode tok/s", "right"), ("TTFT p50 s", "right"), ("status", "left")):
        t.add_column(col, justify=just)
    for ph in m.phases:
        compared = ph.matched + ph.mismatched
        style = {"fail": "red", "pass": "", "not_run": "yellow", "interrupted": "yellow"}.get(ph.status, "")
        t.add_row(ph.name, ph.scenario, str(ph.concurrency), str(ph.requests),
                  f"{ph.matched}/{compared}" if ph.role == "load" or compared else "-",
                  str(ph.errors),
                  f"{ph.decode_tok_per_s:.1f}" if ph.decode_tok_per_s is not None else "-",
                  f"{ph.ttft_s_median:.3f}" if ph.ttft_s_median is not None else "-",
                  ph.status + (f" ({ph.reason})" if ph.reason else ""), style=style)
    console.print(t)
    bad = [r for r in m.requests if r.match is False or r.divergence or
           (r.error and not r.error_expected) or
           any(c.status == "fail" for c in r.checks)]
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
            cls = "-"
            if r.divergence:
                cls = r.divergence["class"] + ("" if r.divergence["fails"] else " (warn)")
            ft.add_row(r.id, r.phase, str(r.concurrency), r.prompt_key, str(r.prompt_len),
                       "-" if r.first_divergence is None else str(r.first_divergence), cls,
                       "; ".join(probs), style="yellow" if cls.endswith("(warn)") else "")
        console.print(ft)
        if len(bad) > max_failures:
            console.print(f"... and {len(bad) - max_failures} more (see the manifest)")
    console.print(escape(headline(m)))
