"""Scenario kind ``capture_edges``: concurrency levels derived from the engine's CUDA-graph capture
sizes, max_num_seqs and the speculative query length; every output vs its solo reference.

Derivation (:func:`concurrency_levels`; q = 1 + k, S = ``cudagraph_capture_sizes`` in tokens per
decode step, largest S_max):

- without speculative decoding a decode step of c requests has c tokens: c = s (a batch of exactly
  a capture size, replayed without padding) and c = s + 1 (padded up to the next size) for each s in
  S; c = S_max + 1 falls out of the graphs (eager / piecewise);
- with speculative decoding a decode step has c * q tokens: c = floor(s / q) (c * q still fits s)
  and c = floor(s / q) + 1 (c * q crosses s); above S_max / q decode leaves the graphs;
- c = max_num_seqs (every request scheduled) and max_num_seqs + 1 (one waits: admission into a
  full batch).

Capture sizes that are unknown, empty (CPU engine, ``--enforce-eager``) or with ``cudagraph_mode``
NONE make the capture family a table row "skipped: <reason>"; the same for an unknown
max_num_seqs. Levels above ``max_concurrency`` are dropped with a note; more than ``max_levels``
levels are thinned (the edges of S_max and max_num_seqs are always kept).

Each level is one phase: ``c * requests_per_slot`` requests with exactly c in flight, short seeded
prompts (round-robin), greedy. Table ``capture_edges``: concurrency, why (formula), facts used with
their sources, decode tokens per step (c * q), phase result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..engine.facts import as_facts, query_len
from ..prompts import seeded_prompts
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register
from .transitions import MAX_CONCURRENCY, PromptSet

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


@dataclass
class Level:
    """One concurrency level to run: ``c`` requests in flight and why (the facts it comes from)."""

    concurrency: int
    reasons: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)
    keep: bool = False  # an edge that is never thinned away

    @property
    def why(self) -> str:
        """The reasons, joined with '; '."""
        return "; ".join(self.reasons)


def graphs_off_reason(facts: dict) -> str | None:
    """Why capture-size edges cannot be derived (None when they can)."""
    facts = as_facts(facts)
    if facts.enforce_eager is True:
        return "enforce_eager: no CUDA graphs"
    mode = facts.cudagraph_mode
    sizes = facts.cudagraph_capture_sizes
    if isinstance(mode, str) and mode.upper() == "NONE":
        return "cudagraph_mode NONE: no CUDA graphs"
    if sizes is None:
        return "cudagraph_capture_sizes unknown (no engine log or /server_info)"
    if not sizes:
        return "cudagraph_capture_sizes empty: the engine captures no CUDA graphs (e.g. CPU)"
    return None


def concurrency_levels(facts: dict, max_concurrency: int = 1025, max_levels: int = 16
                       ) -> tuple[list[Level], list[str], list[dict]]:
    """(levels ascending, notes, skipped families). See the module docstring for the formulas.

    Skipped families are dicts with ``formula``, ``needs`` (fact names) and ``reason``."""
    facts = as_facts(facts)
    q = query_len(facts) or 1
    found: dict[int, Level] = {}
    notes: list[str] = []
    skipped: list[dict] = []

    def add(c: int, why: str, used: list[str], keep: bool = False) -> None:
        if c < 1:
            return
        if c > max_concurrency:
            notes.append(f"C={c} ({why}) dropped: above max_concurrency {max_concurrency}")
            return
        lv = found.setdefault(c, Level(c))
        lv.reasons.append(why)
        lv.facts.extend(u for u in used if u not in lv.facts)
        lv.keep = lv.keep or keep

    off = graphs_off_reason(facts)
    if off:
        skipped.append({"formula": "capture-size edges (c = s, s + 1, S_max + 1)",
                        "needs": ["cudagraph_capture_sizes", "cudagraph_mode"], "reason": off})
    else:
        sizes = sorted(int(s) for s in facts.cudagraph_capture_sizes)
        smax = sizes[-1]
        used = ["cudagraph_capture_sizes"]
        if q == 1:
            for s in sizes:
                add(s, f"c = s = {s} (a batch of exactly a capture size)", used, s == smax)
                if s != smax:
                    add(s + 1, f"c = s + 1 = {s + 1} (padded up from capture size {s})", used)
            add(smax + 1, f"c = S_max + 1 = {smax + 1} (decode falls out of the graphs)", used,
                True)
        else:
            used = used + ["num_speculative_tokens"]
            for s in sizes:
                lo = s // q
                if lo >= 1:
                    add(lo, f"c = floor(s/q) = floor({s}/{q}) = {lo} (c*q = {lo * q} <= {s})",
                        used, s == smax)
                add(lo + 1, f"c = floor(s/q) + 1 = {lo + 1} (c*q = {(lo + 1) * q} crosses {s}"
                    + (", decode falls out of the graphs)" if s == smax else ")"), used,
                    s == smax)
    mns = facts.max_num_seqs
    if mns:
        add(int(mns), f"c = max_num_seqs = {mns} (every request scheduled)", ["max_num_seqs"],
            True)
        add(int(mns) + 1, f"c = max_num_seqs + 1 = {int(mns) + 1} (one request waits)",
            ["max_num_seqs"], True)
    else:
        skipped.append({"formula": "c = max_num_seqs, max_num_seqs + 1", "needs": ["max_num_seqs"],
                        "reason": "max_num_seqs unknown (no /server_info, no --max-num-seqs)"})
    levels = [found[c] for c in sorted(found)]
    if len(levels) > max_levels:
        keep = [lv for lv in levels if lv.keep]
        rest = [lv for lv in levels if not lv.keep]
        room = max(0, max_levels - len(keep))
        if room and rest:
            step = len(rest) / room
            chosen = [rest[int(i * step)] for i in range(min(room, len(rest)))]
        else:
            chosen = []
        dropped = sorted({lv.concurrency for lv in rest} - {lv.concurrency for lv in chosen})
        notes.append(f"{len(dropped)} level(s) thinned out (max_levels {max_levels}): "
                     f"{dropped}")
        levels = sorted(keep + chosen, key=lambda lv: lv.concurrency)
    return levels, notes, skipped


class CaptureEdgesParams(Params):
    """Parameters of ``capture_edges`` (prompts, max_tokens, requests per slot, the level cap)."""

    max_tokens: int = Field(16, ge=1, le=1_000_000)
    requests_per_slot: int = Field(1, ge=1, le=1000)
    # one more than the transitions cap: vLLM's GPU default max_num_seqs is 1024 and its edge
    # (1024 + 1) is a level of its own
    max_concurrency: int = Field(MAX_CONCURRENCY + 1, ge=1, le=4 * MAX_CONCURRENCY)
    max_levels: int = Field(16, ge=1, le=256)
    prompts: PromptSet = Field(default_factory=lambda: PromptSet(count=8, min_len=8, max_len=64,
                                                                 seed=20261130))


class CaptureEdgeRow(TableRow):
    """One concurrency level (``tables.capture_edges``), or a level skipped (``concurrency``
    None, ``requests`` 0): why it was chosen, the facts it used (value and source), the decode
    tokens per engine step, the phase's result."""

    concurrency: int | None
    why: Any
    facts: dict[str, str]
    decode_tokens_per_step: int | None
    requests: int
    result: str | None


@register
class CaptureEdges(Scenario):
    """Kind ``capture_edges``: see the module docstring (one phase per derived level)."""

    kind = "capture_edges"
    summary = ("concurrency at CUDA-graph capture-size edges (s, s+1, S_max+1; c*q crossing s "
               "with speculative decoding) and max_num_seqs, +1; every output vs its solo reference")
    Params = CaptureEdgesParams
    tables = {"capture_edges": CaptureEdgeRow}

    phases = 0  # derived from the engine's facts at run time, added to the summary by run()

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        facts = ctx.facts
        levels, notes, skipped = concurrency_levels(facts, p.max_concurrency, p.max_levels)
        q = ctx.facts.q
        fit, fit_notes = p.prompts.fitted(facts, p.max_tokens)
        notes += fit_notes
        rows: list[dict] = []
        ctx.add_planned_phases(len(levels))  # known only now (derived from the facts)
        if fit is None:
            self.leave_out_phases(ctx, [(f"capture-C{lv.concurrency}", lv.concurrency)
                                        for lv in levels], fit_notes[-1])
            ctx.note("capture_edges_notes", notes)
            return
        prompts = seeded_prompts(p.prompts.seed, p.prompts.count, *fit)
        if levels:
            ctx.take_references([RequestSpec(pr, p.max_tokens) for pr in prompts])
        nxt = 0
        for lv in levels:
            c = lv.concurrency
            specs = []
            for _ in range(c * p.requests_per_slot):
                specs.append(RequestSpec(prompts[nxt % len(prompts)], p.max_tokens,
                                         note=lv.why))
                nxt += 1
            ph = ctx.run_phase(f"capture-C{c}", c, specs, counts_for_throughput=False).phase
            rows.append(CaptureEdgeRow(
                concurrency=c, why=lv.why, facts=_sources(ctx, lv.facts),
                decode_tokens_per_step=c * q, requests=len(specs),
                result=None if ph is None else f"{ph.status}: {ph.matched}/{ph.requests} matched"
                + (f" ({ph.reason})" if ph.reason else "")))
        for s in skipped:
            rows.append(CaptureEdgeRow(concurrency=None, why=s["formula"],
                                       facts=_sources(ctx, s["needs"]),
                                       decode_tokens_per_step=None, requests=0,
                                       result=f"skipped: {s['reason']}"))
        self.put_table(ctx, "capture_edges", rows)
        ctx.note("capture_edges_notes", notes)


def _sources(ctx, names: list[str]) -> dict[str, str]:
    return {n: f"{ctx.facts.get(n)} ({ctx.facts.sources.get(n, 'unknown')})" for n in names}
