"""Why a run did not pass, as text: the one-line :func:`headline` and the :func:`causes` (most
telling first). Below both the renderers (:mod:`pleharness.render`) and the comparison of two
runs (:mod:`pleharness.compare`), which quote them; data only (no drawing)."""
from __future__ import annotations

from collections import defaultdict

from .differential import threshold_text
from .manifest import Manifest, RequestRecord
from .run.judge import side_sentence


def headline(m: Manifest) -> str:
    """E.g. '16/16 phases completed; 80/80 token hashes matched their single-request references',
    followed by every other kind of failure the verdict counts (check failures, request errors,
    divergences), so a FAIL never sits next to a line that reads like a pass."""
    s = m.summary
    lead = ""
    for c in (s.corrupt_references or [])[:3]:  # the corrupt request first
        lead += f"corrupt reference: {c.get('evidence')}; "
    left = (f" ({s.phases_left_out} left out on this engine, vacuous)" if s.phases_left_out
            else "")
    line = lead + (f"{s.phases_completed or 0}/{s.phases_planned or 0} phases completed{left}; "
            f"{s.hashes_matched or 0}/{s.hashes_compared or 0} token hashes matched "
            "their single-request references")
    if s.corrupt_references:
        line += (f"; {len(s.corrupt_references)} corrupt reference(s) (later runs judged "
                 "against " + ", ".join(sorted({c['method'] == 'golden' and 'the golden '
                                                'continuation' or 'the majority output'
                                                for c in s.corrupt_references})) + ")")
    api = _api_clause(m)
    if api:
        line += f"; {api}"
    if s.near_ties:
        line += f"; {s.near_ties} near-tie divergence(s) (warnings)"
    if s.hard_divergences:
        line += f"; {s.hard_divergences} hard divergence(s)"
    if s.checks_failed:
        names = sorted({c.name for r in m.requests for c in r.failed_checks
                        if c.name != "parity"})
        line += f"; {s.checks_failed} check failure(s)" + (f" ({', '.join(names)})"
                                                             if names else "")
    if s.request_errors:
        line += f"; {s.request_errors} request error(s)"
    diff = s.differential or {}
    if diff.get("differ"):
        line += (f"; control answers: {diff['differ']} solo answer(s) under test differ from "
                 f"the control's ({diff.get('hard', 0)} hard) of {diff['compared']} request(s) "
                 "both ran alone" + threshold_text(diff))
    elif diff.get("compared"):
        line += (f"; control answers: all {diff['compared']} solo greedy request(s) both ran "
                 "answered alike")
    if s.also_in_control or s.only_under_test:
        line += (f"; control run: {s.also_in_control or 0} divergence(s) also in the control "
                 f"(engine numerics, warnings), {s.only_under_test or 0} only under test")
    if s.model_behaviour_notes:
        line += f"; {s.model_behaviour_notes} model-behaviour note(s) (not failures)"
    gt = m.run_options.golden_tolerance or {}
    if gt.get("informative") is False:
        q = gt.get("quantile_gap_nats")
        line += ("; golden model uninformative on this engine: "
                 + (f"{100 * gt.get('quantile', 0.95):g} % of its gaps on clean solo runs are "
                    f"below {q:g} nats (bound {gt.get('informative_bound_nats'):g})"
                    if q is not None else gt.get("source", "not measured"))
                 + ", so it decided nothing")
    ctl = m.engine.control_engine or {}
    if ctl.get("error"):
        line += f"; CONTROL ENGINE FAILED ({ctl['error']}): divergences unattributed"
    if m.run_options.numerics_envelope is not None and not m.run_options.independent_reference:
        line += ("; no independent reference: a defect that corrupts every run alike passes "
                 "(add a control run, e.g. --control-engine-python BASE)")
    if s.vacuous:
        strict = " (--strict: failures)" if m.run_options.strict else " (warnings)"
        line += f"; VACUOUS{strict}: " + "; ".join(s.vacuous)
    return line


def _api_clause(m: Manifest) -> str | None:
    """The summary line's ``--api`` clause (:mod:`pleharness.run.api`), e.g. ``api both: 6 chat
    request(s) (6 twins), 150 token-ID prompt(s) completions only``, or ``api both ->
    completions (no chat template)``; None for ``--api completions``, for ``both`` when no request
    had a message form, or a manifest without it."""
    mode, used = m.run_options.api, m.run_options.api_used
    if mode in (None, "completions"):
        return None
    if used is not None and used != mode:
        return f"api {mode} -> {used} (no chat template)"
    paths = (m.summary.api_paths or {}).values()
    tot = {k: sum(int(r.get(k, 0)) for r in paths) for k in ("chat", "chat_twins",
                                                              "no_chat_form")}
    if mode == "both" and not tot["chat"]:
        return None  # no prompt of this run has a message form: nothing to say on every line
    twins = f" ({tot['chat_twins']} twins)" if mode == "both" else ""
    return (f"api {mode}: {tot['chat']} chat request(s){twins}, {tot['no_chat_form']} "
            "token-ID prompt(s) completions only")


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
    for r in m.requests:  # an answer the control gives differently: the defect's own request
        d = r.differential
        if d is not None and d.fails:
            check = next((c for c in r.checks if c.name == "control_answer"), None)
            out.append(f"control answer: {_where(r)}: {check.detail if check else d.cls}")
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
            if c.name not in ("parity", "corrupt_reference", "control_answer"):
                by_check[c.name].append((r, c.detail))
    for name, items in sorted(by_check.items(), key=lambda kv: -len(kv[1])):
        r, detail = items[0]
        more = f" ({len(items)} requests; first:" if len(items) > 1 else " (1 request:"
        out.append(f"check {name} failed{more} {_where(r)}): {detail}")
    for p in m.phases:
        for c in p.checks:
            if c.status == "fail":
                out.append(f"phase check {c.name} failed after phase {p.name}: {c.detail}")
    if m.run_options.strict:
        out += [f"vacuous (--strict): {v}" for v in m.summary.vacuous_run_level or []]
    if not out and m.verdict == "fail":
        bad = [p for p in m.phases if p.status == "fail"]
        out += [f"phase {p.name} failed: {p.reason}" for p in bad[:limit]] or [
            "verdict fail (no cause recorded in the manifest)"]
    return out
