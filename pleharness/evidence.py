"""Feature-engaged evidence: what each phase actually exercised, from the engine's own counters.

A green run is only worth what it exercised (shared/DESIGN.md, "A green run must say what it
exercised"; issue 27). Around every phase the run context scrapes ``/metrics``
(:func:`pleharness.engine.metrics.snapshot`) and stores, in ``PhaseRecord.engaged``:

- ``counters``: the deltas of the engine counters below over the phase (names without
  ``_total``; per-position accepted tokens as ``..._per_pos[<i>]``); absent without /metrics;
- ``prefix_cache``: ``queried_tokens`` and ``hit_tokens`` (``vllm:prefix_cache_queries`` /
  ``_hits``, tokens);
- ``spec_decode``: ``drafts`` (verify steps with a draft), ``draft_tokens``, ``accepted_tokens``,
  ``acceptance_rate`` = accepted_tokens / draft_tokens and ``mean_accepted_length`` = 1 +
  accepted_tokens / drafts (tokens per verify step, the bonus token included), and
  ``accepted_per_position`` (acceptance rate of draft position i = accepted at i / drafts): vLLM's
  own definitions (``vllm/v1/spec_decode/metrics.py``, SpecDecodingLogging);
- ``preemptions`` (``vllm:num_preemptions``: requests whose KV blocks were freed and recomputed);
- ``chunked_prefills``: prompts longer than the chunked-prefill budget C (their prefill is split
  over steps; None when C is unknown);
- ``in_flight_peak``: the most requests of the phase that were in flight at once, from the client's
  own send / end times (concurrency actually reached).

A scenario whose purpose was not exercised marks its phase ``vacuous`` with the reason
(:func:`mark_vacuous`): a warning check ``engaged``, a failure with ``--strict``. Run-level
evidence (speculative decoding that never drafted in any load phase) is judged by
:func:`run_evidence` when the run is summarized.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .engine import metrics
from .engine.facts import as_facts
from .manifest import CheckResult, Manifest, PhaseRecord

COUNTERS = (metrics.PREFIX_QUERIES, metrics.PREFIX_HITS, metrics.PREEMPTIONS,
            metrics.SPEC_DRAFTS, metrics.SPEC_DRAFT_TOKENS, metrics.SPEC_ACCEPTED)


def counter_deltas(before: dict[str, float] | None, after: dict[str, float] | None
                   ) -> dict[str, float] | None:
    """Deltas of :data:`COUNTERS` and of the per-position accepted counters between two
    :func:`~pleharness.engine.metrics.snapshot` results; None when either is None."""
    if before is None or after is None:
        return None
    names = [n for n in COUNTERS if n in after]
    names += sorted(n for n in after if n.startswith(metrics.SPEC_ACCEPTED_PER_POS + "["))
    return {n: after[n] - before.get(n, 0.0) for n in names}


def spec_health(drafts: float, draft_tokens: float, accepted: float,
                per_pos: list[float] | None = None) -> dict[str, Any]:
    """Acceptance rate (accepted / draft tokens, 0..1), mean accepted length (1 + accepted /
    drafts, tokens per verify step) and per-position acceptance (accepted at i / drafts), None
    where the denominator is 0."""
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "mean_accepted_length": 1 + accepted / drafts if drafts else None,
            "accepted_per_position": [a / drafts for a in per_pos] if drafts and per_pos
            else None}


def _per_pos(c: dict[str, float]) -> list[float]:
    pre = metrics.SPEC_ACCEPTED_PER_POS + "["
    pos = sorted((int(k[len(pre):-1]), v) for k, v in c.items() if k.startswith(pre))
    return [v for _, v in pos]


def in_flight_peak(completions) -> int | None:
    """The most of ``completions`` in flight at once (send time to end time, the client's
    clock); None when a completion lacks timings."""
    events = []
    for c in completions:
        if c.started_at is None or c.latency_s is None:
            return None
        events += [(c.started_at, 1), (c.started_at + c.latency_s, -1)]
    peak = cur = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at a tie
        cur += d
        peak = max(peak, cur)
    return peak


def phase_evidence(before, after, completions, prompt_lens: list[int],
                   chunk_budget: int | None) -> dict[str, Any]:
    """The ``engaged`` evidence of one phase (see the module docstring) from the snapshots taken
    before and after it, its completions and its prompts' lengths (tokens)."""
    out: dict[str, Any] = {
        "in_flight_peak": in_flight_peak(completions),
        "chunked_prefills": None if not chunk_budget else
        sum(1 for n in prompt_lens if n > int(chunk_budget))}
    c = counter_deltas(before, after)
    if c is None:
        out["counters"] = None
        return out
    out["counters"] = c
    if metrics.PREFIX_QUERIES in c or metrics.PREFIX_HITS in c:
        out["prefix_cache"] = {"queried_tokens": c.get(metrics.PREFIX_QUERIES, 0.0),
                               "hit_tokens": c.get(metrics.PREFIX_HITS, 0.0)}
    if metrics.PREEMPTIONS in c:
        out["preemptions"] = c[metrics.PREEMPTIONS]
    if metrics.SPEC_DRAFTS in c:
        out["spec_decode"] = spec_health(c.get(metrics.SPEC_DRAFTS, 0.0),
                                         c.get(metrics.SPEC_DRAFT_TOKENS, 0.0),
                                         c.get(metrics.SPEC_ACCEPTED, 0.0), _per_pos(c))
    return out


def mark_vacuous(ctx, ph: PhaseRecord, reason: str) -> None:
    """Phase ``ph`` did not exercise what it is for: set ``ph.vacuous`` and add the check
    ``engaged`` (warn; fail, failing the phase, when the run is ``--strict``)."""
    ph.vacuous = reason
    ctx.add_phase_check(ph, CheckResult(name="engaged", status="fail" if ctx.strict else "warn",
                                        detail=f"vacuous: {reason}"),
                        reason=f"vacuous (--strict): {reason}")


def spec_by_concurrency(m: Manifest) -> dict[str, Any]:
    """Speculative-decoding health of the load phases, overall and per concurrency
    (``{"overall": {...}, "by_concurrency": {"C4": {...}}}``, each as :func:`spec_health`);
    {} when no load phase has spec-decode counters."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    pos: dict[str, list[float]] = defaultdict(list)
    for p in m.phases:
        sd = (p.engaged or {}).get("spec_decode")
        if p.role != "load" or not sd:
            continue
        for key in ("overall", f"C{p.concurrency}"):
            s = sums[key]
            s[0] += sd["drafts"]
            s[1] += sd["draft_tokens"]
            s[2] += sd["accepted_tokens"]
            per = _per_pos((p.engaged or {}).get("counters") or {})
            acc = pos[key]
            acc += [0.0] * (len(per) - len(acc))
            for i, v in enumerate(per):
                acc[i] += v
    if not sums:
        return {}
    return {"overall": spec_health(*sums["overall"], pos["overall"]),
            "by_concurrency": {k: spec_health(*v, pos[k]) for k, v in
                               sorted(sums.items(), key=lambda kv: kv[0]) if k != "overall"}}


def run_evidence(m: Manifest) -> tuple[dict[str, Any], list[str]]:
    """(``summary.engaged``, vacuous reasons of the whole run): totals of the load phases'
    evidence, and the run-level vacuous findings (speculative decoding configured, k > 0, yet
    no load phase drafted), phase-level ones first (``phase NAME: reason``)."""
    load = [p for p in m.phases if p.role == "load" and p.engaged is not None]
    tot: dict[str, Any] = {"phases_with_counters": sum(1 for p in load
                                                       if (p.engaged or {}).get("counters")),
                           "load_phases": len(load)}
    for key in ("preemptions", "chunked_prefills"):
        vals = [p.engaged.get(key) for p in load if p.engaged.get(key) is not None]
        tot[key] = sum(vals) if vals else None
    pc = [p.engaged["prefix_cache"] for p in load if p.engaged.get("prefix_cache")]
    tot["prefix_cache"] = {"queried_tokens": sum(x["queried_tokens"] for x in pc),
                           "hit_tokens": sum(x["hit_tokens"] for x in pc)} if pc else None
    peaks = [p.engaged.get("in_flight_peak") for p in load
             if p.engaged.get("in_flight_peak") is not None]
    tot["in_flight_peak"] = max(peaks) if peaks else None
    tot["spec_decode"] = spec_by_concurrency(m) or None
    reasons = [f"phase {p.name}: {p.vacuous}" for p in m.phases if p.vacuous]
    k = as_facts(m.fact_values()).num_speculative_tokens
    sd = tot["spec_decode"]
    if k and tot["phases_with_counters"] and sd is not None and not sd["overall"]["drafts"]:
        reasons.append(f"speculative decoding: 0 drafts in {tot['phases_with_counters']} load "
                       f"phase(s) although k = {k}: the proposer never proposed, so no "
                       "verify step was tested")
    return tot, reasons
