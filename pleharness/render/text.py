"""Text shared by every renderer of a run (console, Markdown, compare): the headline, why a run
did not pass (:func:`causes`), where to look next (:func:`next_steps`), the verdict line and the
reproduce command."""
from __future__ import annotations

import shlex
from collections import defaultdict

from ..manifest import Manifest, RequestRecord


def headline(m: Manifest) -> str:
    """E.g. '16/16 phases completed; 80/80 token hashes matched their single-request references',
    followed by every other kind of failure the verdict counts (check failures, request errors,
    divergences), so a FAIL never sits next to a line that reads like a pass."""
    s = m.summary
    lead = ""
    for c in (s.get("corrupt_references") or [])[:3]:  # the corrupt request first
        lead += f"corrupt reference: {c.get('evidence')}; "
    line = lead + (f"{s.get('phases_completed', 0)}/{s.get('phases_planned', 0)} phases completed; "
            f"{s.get('hashes_matched', 0)}/{s.get('hashes_compared', 0)} token hashes matched "
            "their single-request references")
    if s.get("corrupt_references"):
        line += (f"; {len(s['corrupt_references'])} corrupt reference(s) (later runs judged "
                 "against " + ", ".join(sorted({c['method'] == 'golden' and 'the golden '
                                                'continuation' or 'the majority output'
                                                for c in s['corrupt_references']})) + ")")
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
    if s.get("vacuous"):
        strict = " (--strict: failures)" if m.run_options.get("strict") else " (warnings)"
        line += f"; VACUOUS{strict}: " + "; ".join(s["vacuous"])
    return line


def _spec(v: dict) -> str:
    a, L = v.get("acceptance_rate"), v.get("mean_accepted_length")
    return (f"acceptance {'-' if a is None else f'{a:.3f}'} ({v['accepted_tokens']:.0f}/"
            f"{v['draft_tokens']:.0f} draft tokens), mean accepted length "
            f"{'-' if L is None else f'{L:.3f}'} over {v['drafts']:.0f} drafts")


def engaged_lines(m: Manifest) -> list[str]:
    """What the run exercised, from the engine's counters (``summary.engaged``,
    :mod:`pleharness.evidence`): speculative-decoding acceptance overall and per concurrency,
    prefix-cache hit tokens, preemptions, chunked prefills, peak in flight; then every vacuous
    finding. [] for a manifest without that evidence."""
    e = m.summary.get("engaged")
    if not e:
        return []
    out = []
    sd = e.get("spec_decode")
    if sd:
        out.append("speculative decoding (load phases): " + _spec(sd["overall"]))
        for c, v in sd["by_concurrency"].items():
            out.append(f"  {c}: " + _spec(v))
    pc = e.get("prefix_cache")
    if pc:
        out.append(f"prefix cache (load phases): {pc['hit_tokens']:.0f} of "
                   f"{pc['queried_tokens']:.0f} queried tokens hit")
    if not e.get("phases_with_counters"):
        out.append("no engine counters at /metrics: what the phases exercised is unknown")
    bits = [f"{k.replace('_', ' ')} {e[k]:.0f}" for k in ("preemptions", "chunked_prefills",
                                                          "in_flight_peak")
            if e.get(k) is not None]
    if bits:
        out.append("; ".join(bits))
    out += [f"VACUOUS: {v}" for v in m.summary.get("vacuous") or []]
    return out


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
        side = ""
        if d.corrupt_side == "load":
            from ..run.judge import side_sentence
            side = side_sentence(d, r.prompt_key) + "; "
        elif d.corrupt_side == "undecided" and d.side_evidence is not None:
            side = f"undecided which side is wrong ({d.side_evidence.detail}); "
        return (f"parity: {side}{_where(r)} differs from its reference at token position "
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
    for r in m.requests:  # a corrupt reference: the corrupt request first
        for c in r.failed_checks:
            if c.name == "corrupt_reference":
                out.append(f"corrupt reference: {c.detail} ({_where(r)})")
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
            if c.name not in ("parity", "corrupt_reference"):
                by_check[c.name].append((r, c.detail))
    for name, items in sorted(by_check.items(), key=lambda kv: -len(kv[1])):
        r, detail = items[0]
        more = f" ({len(items)} requests; first:" if len(items) > 1 else " (1 request:"
        out.append(f"check {name} failed{more} {_where(r)}): {detail}")
    for p in m.phases:
        for c in p.checks:
            if c.status == "fail":
                out.append(f"phase check {c.name} failed after phase {p.name}: {c.detail}")
    if m.run_options.get("strict"):
        out += [f"vacuous (--strict): {v}" for v in m.summary.get("vacuous_run_level") or []]
    if not out and m.verdict == "fail":
        bad = [p for p in m.phases if p.status == "fail"]
        out += [f"phase {p.name} failed: {p.reason}" for p in bad[:limit]] or [
            "verdict fail (no cause recorded in the manifest)"]
    return out


def next_steps(m: Manifest, run_dir: str | None = None) -> list[tuple[str, str | None]]:
    """Where to look next, as (text, shell command or None): the engine log, how to see the
    tokens, the reproduce command."""
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


def reproduce_command(m: Manifest) -> str:
    """The recorded invocation as a shell command that starts a new run: ``--run-id`` is dropped
    (the old folder exists, and a new run may not reuse it). For an attached run (``--url``) the
    engine at that URL must be running again; :func:`next_steps` says so."""
    if not m.invocation:
        return "(not recorded)"
    out: list[str] = []
    skip = False
    for a in m.invocation:
        if skip:
            skip = False
        elif a == "--run-id":
            skip = True
        elif not a.startswith("--run-id="):
            out.append(a)
    return shlex.join(out)
