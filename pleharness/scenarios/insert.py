"""Scenario kind ``insert``: prefills inserted while a long decode is running.

A long streaming decode ("Count from 1 to N.", max_tokens ``decode_tokens``, by default 3N as far as
max_model_len allows) starts; once it has streamed
``insert_after_tokens`` tokens, or ``insert_after_s`` seconds after it was sent, whichever comes
first, prompts of boundary lengths (q, n*B + q, n*C + q, depth 1 by default) are sent one after
another, each while the decode runs (a prefill sharing a step with a
running decode: shared/DESIGN.md, "Ongoing decode + inserted prefill"). The decode's whole output
must equal its solo reference and count 1..N in order; each inserted request must match its solo
reference and pass its checks. For each insert the decode position seen by the client when it was
sent is recorded, and the insert counts as "during the decode" when it was sent before the decode's
last chunk arrived. The time trigger exists because vLLM merges a request's pending outputs into
one chunk when its API server falls behind the engine (seen on 2-core CPU machines: all 300 tokens
arriving at once), so the streamed position can lag the engine's. An insert sent after the decode
had ended is a warning (the decode was too short for this engine).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..manifest import CheckResult
from ..request import RequestSpec
from .base import TableRow, register
from .shared.inserting import InsertTrigger
from .shared.chat import (ChatParams, ChatScenario, boundary_spec, max_prompt_len, note_no_chat,
                          text_prompt)
from .shared.lengths import boundary_lengths

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class InsertParams(ChatParams):
    """Parameters of ``insert`` (with :class:`ChatParams`): the decode prompt counts to
    ``count_to``; the inserted prefills have the boundary lengths of ``depth``."""

    depth: int = Field(1, ge=1)
    controls: bool = False
    count_to: int = Field(300, ge=1, le=100_000, description="N of the decode prompt 'Count from 1 to N.'")
    decode_tokens: int = Field(0, ge=0, le=1_000_000, description=(
        "max_tokens of the decode; 0: three times count_to, as far as max_model_len allows "
        "(a longer decode gives the inserts time to land while it runs; only the first "
        "count_to numbers are checked, the whole output is compared with its reference)"))
    max_tokens: int = Field(4, ge=1)
    insert_after_tokens: int = Field(16, ge=1)
    insert_after_s: float = Field(0.25, gt=0)
    max_inserts: int = Field(8, ge=1, le=256)


class InsertRow(TableRow):
    """One request of the insert phase (``tables.insert``): its record id, prompt key and
    length (tokens), why that length, its note, whether it matched its reference, the checks
    it failed."""

    request: str
    prompt: str
    prompt_len: int
    why: str | None
    note: str | None
    match: bool | None
    checks_failed: list[str]


@register
class Insert(ChatScenario):
    """Kind ``insert``: see the module docstring (one phase at concurrency 2)."""

    kind = "insert"
    summary = "long streaming decode (count 1..N) with boundary-length prefills inserted mid-decode"
    Params = InsertParams
    tables = {"insert": InsertRow}

    phases = 1

    def decode_spec(self, ctx: "ScenarioContext") -> tuple[RequestSpec | None, str | None]:
        """(the ongoing decode's request, a note or None): "Count from 1 to N." with max_tokens
        ``decode_tokens`` (0: 3 N), as far as max_model_len M allows; where M leaves fewer
        than N tokens after the prompt, N becomes a third of what is left (said in the note).
        (None, why) when no decode of ``insert_after_tokens`` + 1 tokens fits."""
        p = self.params
        m = ctx.facts.max_model_len
        n = p.count_to
        note = None
        while True:
            text = f"Count from 1 to {n}."
            prompt = text_prompt(ctx, p, text, f"count-to-{n}")
            n_decode = p.decode_tokens or 3 * n
            if m is None:
                break
            room = int(m) - len(prompt) - 1
            if room < p.insert_after_tokens + 1:
                return None, (f"no ongoing decode fits: max_model_len {m} leaves {room} "
                              f"tokens after the {len(prompt)}-token decode prompt, fewer than "
                              f"insert_after_tokens {p.insert_after_tokens} + 1")
            if room >= n or n <= 1:
                n_decode = max(min(n, room), min(n_decode, room))
                break
            n = max(1, room // 3)
            note = (f"the decode counts to {n}, not {p.count_to}: max_model_len {m} leaves "
                    f"{room} tokens after the prompt")
        decode = RequestSpec(prompt, n_decode, note="ongoing decode")
        decode.checks["counting"] = {"n": n}
        return decode, note

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        room = self.no_room(ctx.facts)
        decode, note = (None, room) if room else self.decode_spec(ctx)
        if decode is None:
            self.leave_out_phases(ctx, [("insert", 2)], note)
            return
        if note:
            ctx.note("insert_notes", note, echo=True)
        note_no_chat(ctx, p, "insert_notes")
        lengths, notes = boundary_lengths(ctx.facts, p.depth, p.controls,
                                          max_prompt_len(ctx, p.max_tokens), p.extra_lengths)
        inserts = [boundary_spec(ctx, p, bl.length, bl.why) for bl in lengths][: p.max_inserts]
        ctx.note("insert_notes", notes)
        ctx.take_references([decode] + inserts, phase_name="insert-references")

        trig = InsertTrigger(ctx, decode, [(s, p.insert_after_tokens) for s in inserts],
                             after_s=p.insert_after_s, label="decode")
        # one long decode with short prefills sent into it is not a steady C2 load: it is left
        # out of the throughput per concurrency (it would pull C2's figure down)
        outs = ctx.run_phase("insert", 2, [decode] + inserts, issue=trig.issue,
                             counts_for_throughput=False)
        if not outs:
            return
        ph = outs.phase
        late = [s.prompt.key for s in trig.late([o.spec for o in outs[1:]])]
        ctx.add_phase_check(ph, CheckResult(
            name="inserts_during_decode", status="warn" if late else "pass",
            detail=(f"{len(late)} insert(s) sent after the decode ended: {', '.join(late)}"
                    if late else f"{len(outs) - 1} inserts sent while the decode ran")))
        self.put_table(ctx, "insert", [
            InsertRow(request=o.record.id, prompt=o.spec.prompt.key, prompt_len=len(o.spec.prompt),
                      why=o.spec.prompt.why, note=o.spec.note, match=o.record.match,
                      checks_failed=[c.name for c in o.record.checks if c.status == "fail"])
            for o in outs])
