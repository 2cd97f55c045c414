"""Scenario kind ``boundary``: prompts at lengths derived from the engine's configuration, run cold
then warm, plus max_model_len edges.

1. Lengths (see :mod:`.lengths`): q, n*B + q and n*C + q for n = 1..depth, each with controls at
   -1 and +1, kept at most M - max_tokens, duplicates merged; the manifest records why each length
   was chosen.
2. Cold: every length once, alone (its first run; shared chat/filler prefixes of earlier lengths may
   be cached, whole prompts are not). These outputs are the prompts' single-request references.
3. Warm: every length again, alone. The output must equal the cold one (a mismatch is a failure).
   /metrics prefix-cache hit counters are scraped around each warm request and the hit tokens
   recorded (with prefix caching, the warm run recomputes only the uncached tail, e.g. q tokens at
   L = n*B + q: the case that exposes tail bugs). Without counters the cache-hit record is skipped
   with the reason.
4. Repeat: every length once more, alone, compared with its reference (the warm run where warm
   references are kept): two solo runs of one prompt over the same computation must agree on an
   engine that repeats itself alone (solo repeatability, docs/references.md); a length whose solo
   runs disagree while its -1 / +1 controls agree is named in ``boundary_notes``.
5. Edges: prompt + max_tokens = M - 1, M, M + 1, and a prompt of exactly M tokens. The engine must
   answer 200 (finish_reason "length") or a clean 4xx, and /health must stay 200.

A table (``tables.boundary`` in the manifest): length, formula, the facts it used with their
sources, L mod C, L mod B, cold result, warm result, cache-hit tokens, failed checks. A length family
whose fact is unknown (n*B + q without B, n*C + q without C) is a row with length None and
"skipped: <reason>". Sliding-window (W - 1, W, W + 1, a generation crossing W) and hybrid
alignment (n*A + q) lengths are added when the facts give W or A (see :mod:`.lengths`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..intermittent import REPLAY_CONFIDENCE, intermittent_rate, replay_repeats
from ..engine import metrics
from ..evidence import mark_vacuous
from ..manifest import CheckResult, Manifest
from ..manifest.tables import NoteRow
from ..request import Outcome, RequestSpec
from .base import TableRow, register
from .shared.chat import ChatParams, ChatScenario, boundary_spec, max_prompt_len, note_no_chat
from .shared.lengths import boundary_lengths, skipped_families

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


#: solo runs of the L = q length and its -1 / +1 controls (issue 47 item 5): a defect that
#: fires on one run in three shows as two different outputs among N runs unless all N agree,
#: which happens with probability (2/3)^N + (1/3)^N: 0.77 % for N = 12 (11 gives 1.16 %), so
#: 12 runs catch it with >= 99 %. On a GPU such a defect gave up to five distinct outputs in 13
#: runs of a 3-token prompt on one engine life: three runs decide little.
Q_SOLO_RUNS = 12


class BoundaryParams(ChatParams):
    """Parameters of ``boundary`` (with :class:`ChatParams`): ``cold_warm`` runs every length
    a second time warm; ``solo_repeat`` (with ``cold_warm``) runs it a third time alone, and
    the L = q length and its controls until ``q_solo_runs`` solo runs in all
    (:data:`Q_SOLO_RUNS`); ``edges`` adds the max_model_len edge requests."""

    cold_warm: bool = True
    solo_repeat: bool = True
    q_solo_runs: int = Field(Q_SOLO_RUNS, ge=3, le=1000)
    edges: bool = True


class BoundaryRow(TableRow):
    """One boundary length (``tables.boundary``); lengths in tokens."""

    length: int | None  # None: a family whose fact is unknown (see formula, cold)
    formula: str  # why this length, e.g. "n*C + q = 1*256 + 4"
    control: bool  # a -1 / +1 control of a derived length
    mod_C: int | None  # length mod max_num_batched_tokens (None: C unknown)
    mod_B: int | None  # length mod block size (None: B unknown)
    cold: str  # ok | checks failed | error: ... | not run | skipped: <reason>
    warm: str  # = cold | DIFFERS from cold at P (class) | error: ... | not run | skipped
    repeat: str = "not run"  # the third solo run: = reference | DIFFERS ... (class) | not run
    prefix_cache_hit_tokens: int | float | None  # on the warm run, from /metrics
    checks_failed: list[str]  # names of checks that failed on the cold or warm run
    # fact -> "value (source)" that the formula used; absent from the schema-1 manifests written
    # before it was recorded (docs/gpu-runs/2026-11-29-*), read as {} (issue 25)
    facts: dict[str, str] = Field(default_factory=dict)
    # the request IDs of the warm and repeat runs: the table is drawn again from their final
    # verdicts after the run's judgement (refresh_tables)
    warm_run: str | None = None
    repeat_run: str | None = None
    repeat_runs: list[str] = Field(default_factory=list)  # every repeat run (q lengths: many)


class EdgeRow(TableRow):
    """One max_model_len edge case (``tables.max_model_len_edges``): its prompt and max_tokens
    (tokens), the HTTP status, finish reason and output length the engine answered, the start
    of its error answer, the check's status."""

    case: str | None
    prompt_len: int
    max_tokens: int
    http_status: int | None
    finish_reason: str | None
    output_len: int
    answer: str
    check: str | None


@register
class Boundary(ChatScenario):
    """Kind ``boundary``: see the module docstring (phases: cold, warm, edges)."""

    kind = "boundary"
    summary = "prompts at q, n*B+q, n*C+q (+-1), cold then warm (prefix cache), and max_model_len edges"
    Params = BoundaryParams
    tables = {"boundary": BoundaryRow, "max_model_len_edges": EdgeRow}

    @classmethod
    def markdown(cls, m: Manifest) -> list[str]:
        """The "Boundary lengths" section of summary.md."""
        return cls.markdown_table(m, "boundary", "Boundary lengths", [
            ("length:", "length"), ("formula", "formula"), ("L mod C:", "mod_C"),
            ("L mod B:", "mod_B"), ("cold", "cold"), ("warm", "warm"), ("repeat", "repeat"),
            ("cache-hit tokens:", "prefix_cache_hit_tokens"),
            ("checks failed", lambda r: ", ".join(r.checks_failed) or "-")])

    def planned_phases(self) -> int:
        p = self.params
        return 1 + int(p.cold_warm) + int(p.cold_warm and p.solo_repeat) + int(p.edges)

    @classmethod
    def refresh_tables(cls, m: Manifest) -> None:
        """The warm and repeat columns from the runs' final divergences (after the golden
        floor, the control run and the sides were judged), and the lengths whose solo runs
        disagree while their -1 / +1 controls agree, named in ``boundary_notes``."""
        rows = cls.table(m, "boundary")
        if not rows:
            return
        recs = {r.id: r for r in m.requests}
        ref_name = "cold" if (m.run_options.reference or "solo") == "solo" else "reference"
        for row in rows:
            if row.warm_run in recs:
                row.warm = _vs(recs[row.warm_run], ref_name)
            if len(row.repeat_runs) > 1:
                row.repeat = _vs_many([recs[i] for i in row.repeat_runs if i in recs])
            elif row.repeat_run in recs:
                row.repeat = _vs(recs[row.repeat_run], "reference")
        m.tables["boundary"] = [r.model_dump() for r in rows]
        by_len = {r.length: r for r in rows if r.length is not None}
        split = [r for r in rows if r.length is not None and not r.control and _differs(r)
                 and all(not _differs(by_len[x]) for x in (r.length - 1, r.length + 1)
                         if x in by_len)]
        notes = [n for n in NoteRow.rows(m, "boundary_notes")
                 if "solo runs disagree" not in n.note]
        notes += [NoteRow(note=f"solo runs disagree at length {r.length} ({r.formula}) while "
                               f"its -1 / +1 controls agree: warm {r.warm}; repeat {r.repeat}"
                               + _rate_note(r, recs))
                  for r in split]
        m.tables["boundary_notes"] = [n.model_dump() for n in notes]

    def phase_names(self) -> list[str]:
        """The load phases, in order (as :meth:`planned_phases` counts them)."""
        p = self.params
        return (["boundary-cold"] + (["boundary-warm"] if p.cold_warm else [])
                + (["boundary-repeat"] if p.cold_warm and p.solo_repeat else [])
                + (["max-model-len-edges"] if p.edges else []))

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        room = self.no_room(ctx.facts)
        if room:
            self.leave_out_phases(ctx, self.phase_names(), room)
            return
        dropped: list = []
        lengths, notes = boundary_lengths(ctx.facts, p.depth, p.controls,
                                          max_prompt_len(ctx, p.max_tokens), p.extra_lengths,
                                          max_tokens=p.max_tokens, dropped=dropped)
        specs = [boundary_spec(ctx, p, bl.length, bl.why) for bl in lengths]
        ctx.note("boundary_notes", notes)
        note_no_chat(ctx, p, "boundary_notes")
        cold = ctx.take_references(specs, phase_name="boundary-cold", cache_state="cold")
        took = cold is not None
        if took:
            # the cold runs are the references; give them a load role for the headline count
            cold.phase.role, cold.phase.counts_for_throughput = "load", False
        else:
            # references exist already (a repeat, or --reference manifest/engine): the cold run
            # is compared with them like any other run
            cold = ctx.run_phase("boundary-cold", 1, specs, counts_for_throughput=False)
        lost = lost_families(lengths, dropped, max_prompt_len(ctx, p.max_tokens))
        if cold and cold.phase is not None and lost:
            mark_vacuous(ctx, cold.phase, "; ".join(lost))
        hits: dict[str, float | None] = {}
        if p.cold_warm:
            def warm_issue(spec: RequestSpec):
                before = metrics.scrape(ctx.client)
                c = ctx.issue(spec)
                hits[spec.prompt.key] = metrics.delta(before, metrics.scrape(ctx.client),
                                                      metrics.PREFIX_HITS)
                return c
            def hit_check(o: Outcome) -> None:
                h = hits.get(o.spec.prompt.key)
                o.record.checks.append(
                    CheckResult(name="prefix_cache_hit", status="skip",
                                detail="no prefix-cache counters at /metrics") if h is None else
                    CheckResult(name="prefix_cache_hit", status="pass" if h > 0 else "warn",
                                detail=f"{h:.0f} prefix-cache hit tokens on the warm run"))

            warm = ctx.run_phase("boundary-warm", 1, specs, issue=warm_issue,
                                 counts_for_throughput=False, on_outcome=hit_check)
            if warm:
                self._judge_warm(ctx, warm.phase, warm, hits)
            if took:  # later scenarios compare warm runs: give them warm references
                ctx.keep_warm_references(warm)
        else:
            warm = []
        repeat = []
        if p.cold_warm and p.solo_repeat:
            # the q lengths run until q_solo_runs solo runs in all (cold, warm and these)
            again = [s for bl, s in zip(lengths, specs)
                     for _ in range(p.q_solo_runs - 2 if _q_family(bl) else 1)]
            repeat = ctx.run_phase("boundary-repeat", 1, again, counts_for_throughput=False)
        self._table(ctx, lengths, specs, hits, dropped, cold, warm, repeat)
        if p.edges:
            self._edges(ctx)

    @staticmethod
    def _judge_warm(ctx, ph, warm, hits) -> None:
        """Record how many warm runs hit the prefix cache (``engaged.warm_runs_hit``); when none
        did although the counters were read, the warm half tested nothing: vacuous (with the
        engine's own prefix_caching fact as the reason when it says the cache is off)."""
        known = [hits.get(o.spec.prompt.key) for o in warm if o.completion.error is None]
        known = [h for h in known if h is not None]
        hit = sum(1 for h in known if h > 0)
        ph.engaged = {**(ph.engaged or {}), "warm_runs": len(warm), "warm_runs_hit": hit,
                      "warm_runs_with_counters": len(known),
                      "warm_hit_tokens": sum(known) if known else None}
        fact = ctx.facts.prefix_caching
        off = fact is False or str(fact).lower() == "false"
        if hit or not (known or off):
            return  # a hit, or no counters and no fact that says the cache is off: unknown
        why = ("prefix caching is off in this engine" if off else
               "the engine's prefix-cache counters show no hit tokens")
        mark_vacuous(ctx, ph, f"warm runs: 0 of {len(known) if known else len(warm)} hit the "
                              f"prefix cache: {why}" + ("" if known else
                                                        " (no prefix-cache counters either)"))

    def _table(self, ctx, lengths, specs, hits, dropped, cold_outs, warm_outs,
               repeat_outs=()) -> None:
        b = ctx.facts.block_size
        c = ctx.facts.max_num_batched_tokens
        by_key: dict[str, dict] = {}
        repeats: dict[str, list] = {}
        for phase, outs in (("boundary-cold", cold_outs), ("boundary-warm", warm_outs),
                            ("boundary-repeat", repeat_outs)):
            for o in outs:
                by_key.setdefault(o.record.prompt_key, {}).setdefault(phase, o.record)
                if phase == "boundary-repeat":
                    repeats.setdefault(o.record.prompt_key, []).append(o.record)
        rows = []
        for bl, spec in zip(lengths, specs):
            rs = by_key.get(spec.prompt.key, {})
            cold, warm = rs.get("boundary-cold"), rs.get("boundary-warm")
            again = rs.get("boundary-repeat")
            failed = sorted({ch.name for r in (cold, warm, again) if r for ch in r.checks
                             if ch.status == "fail"})

            def res(r):
                if r is None:
                    return "not run"
                if r.error:
                    return f"error: {r.error}"
                return "ok" if not any(ch.status == "fail" for ch in r.checks) else "checks failed"
            ref_name = "cold" if ctx.reference_mode == "solo" else "reference"
            many = repeats.get(spec.prompt.key, [])
            rows.append(BoundaryRow(
                length=bl.length, formula=bl.why, control=bl.control,
                mod_C=None if not c else bl.length % c, mod_B=None if not b else bl.length % b,
                cold=res(cold), warm=_vs(warm, ref_name),
                repeat=_vs_many(many) if len(many) > 1 else _vs(again, "reference"),
                prefix_cache_hit_tokens=hits.get(spec.prompt.key), checks_failed=failed,
                facts=_fact_sources(ctx, bl.facts), warm_run=warm.id if warm else None,
                repeat_run=again.id if again else None,
                repeat_runs=[r.id for r in many] if len(many) > 1 else []))
        # a derived length longer than M - max_tokens, and a family no fact gives, are rows of
        # their own, not only notes
        limit = max_prompt_len(ctx, self.params.max_tokens)
        for bl in dropped:
            rows.append(BoundaryRow(
                length=bl.length, formula=bl.why, control=False,
                mod_C=None if not c else bl.length % c, mod_B=None if not b else bl.length % b,
                cold=f"skipped: longer than M - max_tokens = {limit}", warm="skipped",
                prefix_cache_hit_tokens=None, checks_failed=[],
                facts=_fact_sources(ctx, bl.facts)))
        for fam in skipped_families(ctx.facts):
            rows.append(BoundaryRow(
                length=None, formula=fam["formula"], control=False, mod_C=None, mod_B=None,
                cold=f"skipped: {fam['reason']}", warm="skipped", prefix_cache_hit_tokens=None,
                checks_failed=[], facts=_fact_sources(ctx, fam["needs"])))
        self.put_table(ctx, "boundary", rows)

    def _edges(self, ctx) -> None:
        """prompt + max_tokens at M - 1, M, M + 1 and a prompt of exactly M (M: max_model_len)."""

        p = self.params
        m = ctx.facts.max_model_len
        if not m:
            ctx.note("boundary_notes", "max_model_len edges skipped: max_model_len unknown")
            ctx.leave_out("max-model-len-edges", "max_model_len unknown: no edge to probe")
            return
        m = int(m)
        cases = [(m - p.max_tokens - 1, p.max_tokens, "prompt + max_tokens = M - 1"),
                 (m - p.max_tokens, p.max_tokens, "prompt + max_tokens = M"),
                 (m - p.max_tokens + 1, p.max_tokens, "prompt + max_tokens = M + 1"),
                 (m, p.max_tokens, "prompt of exactly M tokens")]
        cases = [c for c in cases if c[0] >= 1]
        specs = []
        for length, mt, why in cases:
            s = boundary_spec(ctx, p, length, why, max_tokens=mt)
            s.compare = False
            s.accept_4xx = True
            s.checks = {"max_model_len_edge": {"total": length + mt, "max_model_len": m}}
            specs.append(s)
        outs = ctx.run_phase("max-model-len-edges", 1, specs, counts_for_throughput=False)
        if not outs:
            return
        self.put_table(ctx, "max_model_len_edges", [
            EdgeRow(case=s.note, prompt_len=len(s.prompt), max_tokens=s.max_tokens,
                    http_status=o.record.http_status, finish_reason=o.record.finish_reason,
                    output_len=o.record.output_len, answer=(o.record.error_detail or "")[:160],
                    check=o.record.checks[0].status if o.record.checks else None)
            for s, o in zip(specs, outs)])


def lost_families(lengths, dropped, limit: int | None) -> list[str]:
    """For each length family (``q``, ``n*B + q``, ``n*C + q``, ``n*A + q``, windows ...) whose
    fact is known but none of whose lengths fits (all in ``dropped``: longer than ``limit`` =
    M - max_tokens), why it was not tested: e.g. a chunk budget C above max_model_len, vLLM's
    default for a short context, where no prompt is chunked. [] when every family kept a
    length."""
    def family(why: str) -> str:
        return why.split(" = ")[0].split(" (")[0]
    kept = {family(r) for bl in lengths for r in bl.reasons}
    lost: dict[str, int] = {}
    for bl in dropped:
        fam = family(bl.why)
        if fam not in kept:
            lost[fam] = min(bl.length, lost.get(fam, bl.length))
    return [f"{fam} lengths not tested: the shortest, {n}, is longer than M - max_tokens = "
            f"{limit}" for fam, n in lost.items()]


def _vs(r, ref_name: str) -> str:
    """One run against its reference, with the divergence's current class: '= cold', 'DIFFERS
    from cold at 3 (hard, by solo repeatability)', 'error: ...' or 'not run'."""
    if r is None:
        return "not run"
    if r.error:
        return f"error: {r.error}"
    if r.match:
        return f"= {ref_name}"
    d = r.divergence
    why = ""
    if d is not None:
        why = f" ({d.cls}{', by ' + d.decided_by if d.decided_by else ''}" + (
            ", warning" if not d.fails else "") + ")"
    return f"DIFFERS from {ref_name} at {r.first_divergence}{why}"


def _vs_many(rs) -> str:
    """Many solo repeats of one length against its reference: '= reference (10 runs)' or
    'DIFFERS in 3 of 10 runs (first at 5, hard, by solo repeatability)'."""
    if not rs:
        return "not run"
    bad = [r for r in rs if r.error is None and r.match is False]
    errs = [r for r in rs if r.error]
    if not bad and not errs:
        return f"= reference ({len(rs)} runs)"
    out = []
    if bad:
        first = _vs(bad[0], "reference").replace("DIFFERS from reference at ", "first at ")
        out.append(f"DIFFERS in {len(bad)} of {len(rs)} runs, {first}")
    if errs:
        out.append(f"error in {len(errs)} of {len(rs)} runs: {errs[0].error}")
    return "; ".join(out)


def _rate_note(row: BoundaryRow, recs: dict) -> str:
    """'; measured rate 3/12 (25 %): a replay needs 11 solo runs to show it with 95 %' for a
    length whose solo runs disagree (:func:`pleharness.intermittent.replay_repeats`)."""
    ids = [i for i in (row.warm_run, *(row.repeat_runs or [row.repeat_run])) if i]
    rs = [recs[i] for i in ids if i in recs and recs[i].error is None]
    ref = next((recs[i].reference_hash for i in ids if i in recs), None)
    outs = [r.output_hash for r in rs] + ([ref] if ref else [])
    rate = intermittent_rate(outs)
    if not rate:
        return ""
    n = replay_repeats(rate)
    odd = round(rate * len(outs))
    return (f"; measured rate {odd}/{len(outs)} ({100 * rate:.0f} %): a replay needs {n} solo "
            f"run{'s' if n != 1 else ''} to show it with {100 * REPLAY_CONFIDENCE:.0f} %")


def _q_family(bl) -> bool:
    """Whether a boundary length is L = q or one of its -1 / +1 controls."""
    return any(r.startswith("q = 1 + k") for r in bl.reasons)


def _differs(row: BoundaryRow) -> bool:
    return row.warm.startswith("DIFFERS") or row.repeat.startswith("DIFFERS")


def _fact_sources(ctx, names: list[str]) -> dict[str, str]:
    """{fact: "value (source)"} for the facts a length's formula used (manifest provenance)."""
    return {n: f"{ctx.facts.get(n)} ({ctx.facts.sources.get(n, 'unknown')})" for n in names}
