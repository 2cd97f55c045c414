"""Scenario kind ``prefix_isolation``: near-duplicate prompts run after the original is cached must
not be served from the original's cached KV blocks.

A seeded original prompt of ``prompt_len`` tokens (default blocks * B + max(4, B/4): ``blocks``
whole blocks to vary and a short tail) and its near duplicates: the same prompt
with one token changed at position i*B + ``offset`` inside each of its first ``blocks`` blocks
(i = 0 .. blocks - 1), and (``last_position``) at the last position of each, i*B + B - 1. A near
duplicate changed in block i shares i whole blocks with the original: with prefix caching it hits
them (i*B tokens) and must compute the rest itself.

1. References, each on a fresh cache: with ``POST /reset_prefix_cache`` (launched engines run with
   ``VLLM_SERVER_DEV_MODE=1``) the cache is reset before each prompt's reference run (phases
   ``isolation-ref-<key>``, the first run of each prompt). Attached to an engine without it, the
   near duplicates' references are taken first, before the original has ever run in this
   scenario (phase ``isolation-refs``), then the original's; the table and the phase check
   ``fresh_cache`` (skipped, with the reason) record that the references were not taken on a
   fresh cache (an engine that served this seed's prompts before may hold them still).
2. Phase ``isolation-original`` (after a reset where possible): the original alone, so its
   blocks are cached; compared with its reference.
3. Phase ``isolation-near-duplicates``: every near duplicate alone, one after another. Each must
   equal its own reference (parity), and check ``prefix_isolation`` fails a near duplicate that
   answered with the original's output (token IDs and every position's top-1/top-2 logprob
   margin, to the 6 decimals the harness keeps) while its reference differs from it (served from
   the original's cache); a near duplicate whose reference equals the original's output cannot
   tell isolation from a collision (skipped, with that reason). Phase check
   ``prefix_isolation_tested``: the phase's prefix-cache hit tokens from /metrics
   (``vllm:prefix_cache_hits``) against the whole blocks the near duplicates share with the
   original; 0 hits where hits were expected, or no near duplicate whose reference differs from
   the original's output, is a warning (vacuous), never a pass.

Block size B is an engine fact (``ctx.facts``; a hybrid model's prefix-cache alignment unit
where it differs, :meth:`PrefixIsolation.layout`); both phases are left out (vacuous, with the
reason) when it is unknown, when prefix caching is off, or when no block fits max_model_len. Table ``tables.prefix_isolation``: one row
per near duplicate.
"""
from __future__ import annotations

from ..engine.facts import as_facts

import random
from typing import TYPE_CHECKING

from pydantic import Field

from ..divergence import margins
from ..evidence import mark_vacuous
from ..manifest import CheckResult, Manifest
from ..prompts import Prompt
from ..request import Outcome, RequestSpec
from .base import Params, Scenario, TableRow, register
from .shared.lengths import alignment_unit

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class PrefixIsolationParams(Params):
    """Parameters of ``prefix_isolation`` (lengths and positions in tokens): ``blocks``: how many
    of the first blocks get a near duplicate; ``offset``: the changed position inside a block
    (-1: B/2); ``last_position``: also change each block's last position (B - 1);
    ``prompt_len``: 0 for blocks * B + max(4, B/4) (the changes close to the end, so that the
    continuation depends on them)."""

    blocks: int = Field(2, ge=1, le=1024)
    offset: int = Field(-1, ge=-1, le=1_000_000)
    last_position: bool = True
    prompt_len: int = Field(0, ge=0, le=1_000_000)
    max_tokens: int = Field(24, ge=1, le=1_000_000)
    seed: int = 2605


class IsolationRow(TableRow):
    """One near duplicate (``tables.prefix_isolation``)."""

    prompt_key: str
    changed_position: int  # the one token that differs from the original
    block: int  # changed_position // B
    offset: int  # changed_position % B
    shared_whole_blocks: int  # blocks it shares with the original (it may hit them)
    reference_cache: str  # fresh (reset) | not fresh: <why>
    reference_differs_from_original: bool | None  # False: cannot tell isolation from a collision
    result: str  # = reference | DIFFERS from reference at P | original's output | error: ...
    request_id: str | None


@register
class PrefixIsolation(Scenario):
    """Kind ``prefix_isolation``: see the module docstring (two load phases)."""

    kind = "prefix_isolation"
    summary = ("near-duplicate prompts (one token changed in each first block) after the original "
               "is cached, each vs its own fresh-cache reference")
    Params = PrefixIsolationParams
    phases = 2
    tables = {"prefix_isolation": IsolationRow}

    @classmethod
    def markdown(cls, m: Manifest) -> list[str]:
        """The "Prefix-cache isolation" section of summary.md."""
        return cls.markdown_table(m, "prefix_isolation", "Prefix-cache isolation", [
            ("near duplicate", "prompt_key"), ("changed position:", "changed_position"),
            ("block:", "block"), ("offset:", "offset"), ("shared blocks:", "shared_whole_blocks"),
            ("reference", "reference_cache"),
            ("differs from original", "reference_differs_from_original"), ("result", "result")])

    def layout(self, facts) -> tuple[int, int, list[int], list[str]] | str:
        """(U, prompt length, changed positions, notes) on an engine with ``facts`` (EngineFacts
        or a dict of values), or why the scenario is left out there (a str). U is the unit a
        prefix-cache hit covers: the block size B, or a hybrid model's alignment unit where it
        differs (:func:`pleharness.scenarios.shared.lengths.alignment_unit`). The prompt is
        ``prompt_len`` or blocks * U + max(4, U/4) tokens; ``offset`` at or past U becomes U/2,
        and blocks are dropped from the end until the prompt + max_tokens fits max_model_len
        and every changed position lies inside the prompt (each change said in the notes).
        Left out: U unknown, prefix caching off, or no block fits."""
        f = as_facts(facts)
        p = self.params
        if f.prefix_caching is False:
            return ("prefix caching is off in this engine: a near duplicate cannot be served "
                    "from the original's cached blocks, so isolation is not tested")
        a, a_name = alignment_unit(f)
        u = a or f.block_size
        if not u:
            return "block size B unknown (attach with --block-size)"
        u = int(u)
        notes = [f"unit U = {u} ({a_name}, the prefix-cache hit alignment)"] if a else []
        off = u // 2 if p.offset < 0 else p.offset
        if off >= u:
            notes.append(f"params.offset {off} is not below U = {u}: offset U/2 = {u // 2} used")
            off = u // 2
        offs = sorted({off, u - 1} if p.last_position else {off})
        m = f.max_model_len
        limit = None if m is None else int(m) - p.max_tokens
        for blocks in range(p.blocks, 0, -1):
            n = p.prompt_len or blocks * u + max(4, u // 4)
            if limit is not None:
                n = min(n, limit)
            pos = [i * u + o for i in range(blocks) for o in offs if i * u + o < n]
            if pos and (blocks == 1 or max(pos) // u == blocks - 1):
                if blocks < p.blocks:
                    notes.append(f"{blocks} of params.blocks {p.blocks} block(s) varied: a "
                                 f"prompt of {n} tokens + max_tokens {p.max_tokens} within "
                                 f"max_model_len {m}")
                return u, n, pos, notes
        return (f"no near duplicate fits: a prompt longer than one U = {u}-token unit + "
                f"max_tokens {p.max_tokens} exceeds max_model_len {m}" if limit is not None else
                f"params.prompt_len {p.prompt_len} leaves no position inside the first block")

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        lay = self.layout(ctx.facts)
        if isinstance(lay, str):
            self.leave_out_phases(ctx, ["isolation-original", "isolation-near-duplicates"], lay)
            return
        b, n, positions, notes = lay
        ctx.note("prefix_isolation_notes", notes, echo=True)
        original, dups = self._prompts(ctx, n, positions, b)
        orig_spec = RequestSpec(original, p.max_tokens)
        dup_specs = [RequestSpec(d, p.max_tokens) for d, _ in dups]
        fresh, ref_cache = _take_references(ctx, orig_spec, dup_specs)

        orig_out = ctx.run_phase("isolation-original", 1, [orig_spec])
        if not orig_out:
            return  # references only (a reference engine)
        ph0 = orig_out.phase
        ctx.add_phase_check(ph0, fresh)
        oc = orig_out[0].completion
        orig_sig = _signature(oc.token_ids, margins(oc.logprobs)) if oc.error is None else None
        telling: dict[str, bool | None] = {}
        outs = ctx.run_phase("isolation-near-duplicates", 1, dup_specs,
                             on_outcome=lambda o: _isolation_check(ctx, o, orig_sig, telling))
        ph = outs.phase
        ctx.add_phase_check(ph, _tested_check(ctx, ph, dups, b, telling, len(outs)))
        rows = []
        for (d, pos), o in zip(dups, outs):
            r = o.record
            iso = next((ch for ch in r.checks if ch.name == "prefix_isolation"), None)
            res = (f"error: {r.error}" if r.error else "original's output"
                   if iso is not None and iso.status == "fail" else
                   "= reference" if r.match else f"DIFFERS from reference at {r.first_divergence}")
            rows.append(IsolationRow(
                prompt_key=d.key, changed_position=pos, block=pos // b, offset=pos % b,
                shared_whole_blocks=pos // b, reference_cache=ref_cache,
                reference_differs_from_original=telling.get(d.key), result=res,
                request_id=r.id))
        self.put_table(ctx, "prefix_isolation", rows)

    def _prompts(self, ctx: "ScenarioContext", n: int, positions: list[int], b: int
                 ) -> tuple[Prompt, list[tuple[Prompt, int]]]:
        """(original, near duplicates): the original's ``n`` random token IDs from ``seed``;
        each near duplicate (prompt, changed position) is the original with one token changed
        at one of ``positions`` (:meth:`layout`; ``b``: the unit U)."""
        p = self.params
        vocab = ctx.facts.vocab_or()
        rng = random.Random(p.seed)
        orig_ids = [rng.randrange(16, vocab) for _ in range(n)]
        original = Prompt(key=f"iso-original-len{n}", ids=tuple(orig_ids))
        dups: list[tuple[Prompt, int]] = []
        for pos in positions:
            ids = list(orig_ids)
            ids[pos] = 16 + (ids[pos] - 16 + 1 + rng.randrange(vocab - 17)) % (vocab - 16)
            dups.append((Prompt(key=f"iso-b{pos // b}o{pos % b}-len{n}", ids=tuple(ids)), pos))
        return original, dups


def _take_references(ctx: "ScenarioContext", orig_spec: RequestSpec,
                     dup_specs: list[RequestSpec]) -> tuple[CheckResult, str]:
    """Every prompt's reference, each on a fresh prefix cache (reset before each, and once more
    after) where the engine allows a reset, else the near duplicates' before the original's.
    Returns (the ``fresh_cache`` check, the reference cache state for the table)."""
    why_not = ctx.reset_prefix_cache()
    if why_not is None:
        for s in [orig_spec] + dup_specs:
            if s is not orig_spec:
                ctx.reset_prefix_cache()
            ctx.take_references([s], phase_name=f"isolation-ref-{s.prompt.key}",
                                cache_state="cold")
        ctx.reset_prefix_cache()
        ref_cache = "fresh (reset)"
    else:
        # no reset: the near duplicates' references before the original has run here
        ctx.take_references(dup_specs, phase_name="isolation-refs", cache_state="cold")
        ctx.take_references([orig_spec], phase_name="isolation-ref-original",
                            cache_state="cold")
        ref_cache = f"not fresh: {why_not}"
    fresh = CheckResult(
        name="fresh_cache", status="pass" if why_not is None else "skip",
        detail="every reference taken on a fresh cache (reset before each)" if why_not is None
        else f"references not on a fresh cache ({why_not}; attached without "
             "VLLM_SERVER_DEV_MODE=1?): the near duplicates' references were taken before the "
             "original ran in this scenario")
    return fresh, ref_cache


def _isolation_check(ctx: "ScenarioContext", o: Outcome, orig_sig: tuple | None,
                     telling: dict[str, bool | None]) -> None:
    """``prefix_isolation`` on a near duplicate's record: fail when it was answered with the
    original's output (``orig_sig``, :func:`_signature`) although its own reference differs;
    whether its reference differs is kept in ``telling`` (by prompt key)."""
    c, ref = o.completion, ctx.reference(o.spec)
    if c.error is not None or orig_sig is None or ref is None:
        o.record.checks.append(CheckResult(name="prefix_isolation", status="skip",
                                           detail="no output, original or reference"))
        return
    differs = _signature(ref.output_ids, ref.margins) != orig_sig
    telling[o.spec.prompt.key] = differs
    if _signature(c.token_ids, margins(c.logprobs)) == orig_sig and differs:
        st, d = "fail", ("answered with the original prompt's output (token IDs and "
                         "top-1/top-2 logprob margins, exactly) although its own "
                         "reference differs: served from the original's cached blocks")
    elif not differs:
        st, d = "skip", ("its reference equals the original's output (IDs and "
                         "margins): this near duplicate cannot tell isolation from a "
                         "collision")
    else:
        st, d = "pass", ("its output is not the original's, whose differs from its "
                         "reference (parity judges it against its reference)")
    o.record.checks.append(CheckResult(name="prefix_isolation", status=st, detail=d))


def _tested_check(ctx: "ScenarioContext", ph, dups: list[tuple[Prompt, int]], b: int,
                  telling: dict[str, bool | None], n_outs: int) -> CheckResult:
    """``prefix_isolation_tested`` of the near-duplicates phase ``ph``: warn (and the phase
    marked vacuous) with 0 prefix-cache hit tokens where shared whole blocks allow some, or
    when no near duplicate's reference differs from the original's output; skip without
    counters."""
    expected = sum((pos // b) * b for _, pos in dups)
    hits = ((ph.engaged or {}).get("prefix_cache") or {}).get("hit_tokens")
    n_tell = sum(1 for v in telling.values() if v)
    what = (f"{n_tell} of {n_outs} near duplicates have a reference that differs from the "
            "original's output (IDs or logprob margins)")
    if hits is None:
        return CheckResult(name="prefix_isolation_tested", status="skip",
                           detail="no prefix-cache counters at /metrics; " + what)
    if (expected and hits <= 0) or not n_tell:
        why = (f"0 prefix-cache hit tokens where the shared whole blocks allow {expected}"
               if expected and hits <= 0 else what)
        mark_vacuous(ctx, ph, f"isolation-near-duplicates: {why}")
        return CheckResult(name="prefix_isolation_tested", status="warn",
                           detail=f"isolation not tested: {why}")
    return CheckResult(name="prefix_isolation_tested", status="pass",
                       detail=f"{hits:.0f} prefix-cache hit tokens (the shared whole "
                              f"blocks allow {expected}); " + what)


def _signature(ids, margins_) -> tuple:
    """What must differ between two prompts' outputs: the token IDs and, where logprobs were
    asked, every position's top-1/top-2 margin (rounded to 6 decimals by
    :func:`pleharness.divergence.margins`: the same cached KV gives the same logits)."""
    return (tuple(ids), tuple(margins_) if margins_ is not None else None)
