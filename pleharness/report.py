"""Console rendering of a run, leading with the why: verdict and its causes, next steps, then the
phase table and the failing requests.

:func:`causes` (why a run did not pass) and :func:`next_steps` (where to look, how to reproduce)
are shared by the console report, ``summary.md`` (:mod:`pleharness.reports`) and ``compare``.
"""
from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .manifest import Manifest, RequestRecord


def headline(m: Manifest) -> str:
    """E.g. '16/16 phases completed; 80/80 token hashes matched their single-request references',
    followed by every other kind of failure the verdict counts (check failures, request errors,
    divergences), so a FAIL never sits next to a line that reads like a pass."""
    s = m.summary
    line = (f"{s.get('phases_completed', 0)}/{s.get('phases_planned', 0)} phases completed; "
            f"{s.get('hashes_matched', 0)}/{s.get('hashes_compared', 0)} token hashes matched "
            "their single-request references")
    if s.get("near_ties"):
        line += f"; {s['near_ties']} near-tie divergence(s) (warnings)"
    if s.get("hard_divergences"):
        line += f"; {s['hard_divergences']} hard divergence(s)"
    if s.get("checks_failed"):
        names = sorted({c.name for r in m.requests for c in r.failed_checks
                        if c.name != "parity"})
        line += f"; {s['checks_failed']} check failure(s)" + (f" ({', '.join(names)})"
                                                             if names else "")
    if s.get("request_errors"):
        line += f"; {s['request_errors']} request error(s)"
    if s.get("also_in_control") or s.get("only_under_test"):
        line += (f"; control run: {s.get('also_in_control', 0)} divergence(s) also in the control "
                 f"(engine numerics, warnings), {s.get('only_under_test', 0)} only under test")
    if s.get("model_behaviour_notes"):
        line += f"; {s['model_behaviour_notes']} model-behaviour note(s) (not failures)"
    return line


def _where(r: RequestRecord) -> str:
    """'request r1-C3-7 (phase r1-s1-C3, C3, prompt chat-len260, length 260: n*C + q = 1*256 + 4)'."""
    why = f": {r.note}" if r.note else ""
    return (f"request {r.id} (phase {r.phase}, C{r.concurrency}, prompt {r.prompt_key}, "
            f"length {r.prompt_len}{why})")


def _failing_divergence(r: RequestRecord) -> str | None:
    d = r.divergence
    if d:
        if not d.fails:
            return None
        mg = d.margin_nats
        margin = "no logprobs" if mg is None else f"reference top-1/top-2 margin {mg:.3f} nats"
        if d.classified_by == "golden":
            gap = d.golden_gap_nats
            if gap is None or d.observed_in_golden_top is False:
                g = "observed token not in its top candidates"
            else:
                g = f"gap {gap:.3f} nats" + (f" (threshold {d.threshold_nats:g})"
                                             if d.threshold_nats is not None else "")
            margin = f"golden model: {g}; {margin}"
        return (f"parity: {_where(r)} differs from its reference at token position "
                f"{d.position} ({d.cls}: {margin}; expected token "
                f"{d.reference_token}, got {d.observed_token})")
    if r.match is False and not r.error:
        pos = "" if r.first_divergence is None else f" at token position {r.first_divergence}"
        return f"parity: {_where(r)} differs from its reference{pos}"
    return None


def causes(m: Manifest, limit: int = 8) -> list[str]:
    """Why the run did not pass, most telling first: how the run ended (engine death with its
    reason and root cause), hard divergences (request, length and why that length, first divergent
    position), request errors, failed checks grouped by check (count and the first request), and
    failed phase checks. Empty for a clean, complete run. At most ``limit`` lines per kind."""
    out: list[str] = []
    if m.status not in ("complete", "running") or m.verdict == "error":
        line = f"run {m.status}"
        if m.reason:
            line += f": {m.reason}"
        out.append(line)
        if m.root_cause:
            out.append(f"root cause (engine log): {m.root_cause}")
    divs = [x for x in (_failing_divergence(r) for r in m.requests) if x]
    out += divs[:limit]
    if len(divs) > limit:
        out.append(f"... and {len(divs) - limit} more token mismatches")
    errs = [r for r in m.requests if r.request_error]
    for r in errs[:limit]:
        out.append(f"request error: {_where(r)}: {r.error}: {r.error_detail or ''}".rstrip(": "))
    if len(errs) > limit:
        out.append(f"... and {len(errs) - limit} more request errors")
    by_check: dict[str, list[tuple[RequestRecord, str]]] = defaultdict(list)
    for r in m.requests:
        for c in r.failed_checks:
            if c.name != "parity":
                by_check[c.name].append((r, c.detail))
    for name, items in sorted(by_check.items(), key=lambda kv: -len(kv[1])):
        r, detail = items[0]
        more = f" ({len(items)} requests; first:" if len(items) > 1 else " (1 request:"
        out.append(f"check {name} failed{more} {_where(r)}): {detail}")
    for p in m.phases:
        for c in p.checks:
            if c.status == "fail":
                out.append(f"phase check {c.name} failed after phase {p.name}: {c.detail}")
    if not out and m.verdict == "fail":
        bad = [p for p in m.phases if p.status == "fail"]
        out += [f"phase {p.name} failed: {p.reason}" for p in bad[:limit]] or [
            "verdict fail (no cause recorded in the manifest)"]
    return out


def next_steps(m: Manifest, run_dir: str | None = None) -> list[tuple[str, str | None]]:
    """Where to look next, as (text, shell command or None): the engine log, how to see the
    tokens, the reproduce command."""
    from .reports import reproduce_command
    d = (run_dir or f"{_results_dir(m)}/{m.run_id}").rstrip("/")
    steps: list[tuple[str, str | None]] = []
    if m.engine.get("engine_log"):
        steps.append((f"engine log: {d}/{m.engine['engine_log']}"
                      + (f" (launcher: {d}/{m.engine['launcher_log']})"
                         if m.engine.get("launcher_log") else ""), None))
    elif m.engine.get("mode") == "attached":
        steps.append((f"engine log: the attached engine's own log ({m.engine.get('url')})", None))
    if any(r.match is False or r.divergence for r in m.requests):
        records = m.requests_file or "requests.jsonl"
        steps.append((f"tokens: {d}/{records} keeps the output_ids of every mismatch (the "
                      "references' are in manifest.json):",
                      "jq -c 'select(.match == false) | {id, first_divergence, "
                      f"divergence, output_ids}}' {d}/{records}"))
    note = (f" (attached run: the engine at {m.engine.get('url')} must be running)"
            if m.engine.get("mode") == "attached" else "")
    steps.append((f"reproduce{note}:", reproduce_command(m)))
    return steps


def _results_dir(m: Manifest) -> str:
    """The --results-dir the run was started with (default results)."""
    inv = list(m.invocation)
    for i, a in enumerate(inv):
        if a == "--results-dir" and i + 1 < len(inv):
            return inv[i + 1]
        if a.startswith("--results-dir="):
            return a.split("=", 1)[1]
    return "results"


def verdict_line(m: Manifest) -> str:
    """'FAIL (status complete, exit 1)'."""
    return f"{(m.verdict or 'none').upper()} (status {m.status}, exit {m.exit_code})"


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
        st = {"fail": "red", "pass": "", "not_run": "yellow", "interrupted": "yellow"}.get(
            ph.status, "")
        t.add_row(escape(ph.name), escape(ph.scenario), str(ph.concurrency), str(ph.requests),
                  f"{ph.matched}/{compared}" if ph.role == "load" or compared else "-",
                  str(ph.errors),
                  f"{ph.decode_tok_per_s:.1f}" if ph.decode_tok_per_s is not None else "-",
                  f"{ph.ttft_s_median:.3f}" if ph.ttft_s_median is not None else "-",
                  escape(ph.status + (f" ({ph.reason})" if ph.reason else "")), style=st)
    if m.phases:
        console.print(t)
    bad = [r for r in m.requests if r.is_problem or r.divergence]  # with the warnings
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
                cls = r.divergence.cls + ("" if r.divergence.fails else " (warn)")
            ft.add_row(escape(r.id), escape(r.phase), str(r.concurrency), escape(r.prompt_key),
                       str(r.prompt_len),
                       "-" if r.first_divergence is None else str(r.first_divergence), cls,
                       escape("; ".join(probs)), style="yellow" if cls.endswith("(warn)") else "")
        console.print(ft)
        if len(bad) > max_failures:
            console.print(f"... and {len(bad) - max_failures} more (see the manifest)")
    console.print(escape(headline(m)))
