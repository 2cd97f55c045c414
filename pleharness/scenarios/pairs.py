"""Scenario kind ``pairs``: two boundary-length requests in flight together.

Pairs derived from the facts (q = 1 + k, C = max_num_batched_tokens, B = block size, M =
max_model_len; the chunk unit falls back to B when C is unknown):

- q-tail + q-tail: (C + q, 2C + q): both last prefill chunks are q tokens, in one step;
- q-tail + 2C-scale: (C + q, 2C): a q-token tail next to a full two-chunk prefill;
- q + long: (q, 2C + q): a verify-shaped fresh prompt beside a long prefill;
- long + long: (M - max_tokens - 1, M - max_tokens - 2).

Each output must equal its single-request (solo) reference and pass its checks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from typing import Annotated

from pydantic import Field

from ..engine.facts import as_facts, query_len
from .base import register
from .shared.chat import ChatParams, ChatScenario, boundary_spec, max_prompt_len, note_no_chat

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class PairsParams(ChatParams):
    """Parameters of ``pairs`` (with :class:`ChatParams`)."""

    max_tokens: int = Field(16, ge=1)
    extra_pairs: list[tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]]] = Field(
        default_factory=list, description="more [L1, L2] pairs to run")


def derive_pairs(facts: dict, max_len: int | None, extra: list[list[int]] | None = None,
                 left: list[tuple[str, str, str]] | None = None
                 ) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(label, L1, L2) pairs and notes on what was left out (see the module docstring).
    ``left``: when given, gets (phase name part, label, why) for every planned pair not kept (a
    fact unknown, a length over ``max_len`` or below 1), so that the kind leaves out its
    phase."""
    facts = as_facts(facts)
    q = query_len(facts) or 1
    unit = facts.max_num_batched_tokens or facts.block_size
    notes, out = [], []
    cand = []
    left = [] if left is None else left
    if unit:
        u = "C" if facts.max_num_batched_tokens else "B"
        cand += [(f"q-tail + q-tail ({u}+q, 2{u}+q)", unit + q, 2 * unit + q),
                 (f"q-tail + 2{u}-scale ({u}+q, 2{u})", unit + q, 2 * unit),
                 (f"q + long (q, 2{u}+q)", q, 2 * unit + q)]
    else:
        notes.append("q-tail pairs skipped: neither chunk size nor block size known")
        left += [(part, lab, "neither chunk size nor block size known") for part, lab in
                 (("q-tail-pair", "q-tail + q-tail"), ("q-tail-2c", "q-tail + 2C-scale"),
                  ("q-long", "q + long"))]
    if max_len:
        cand.append(("long + long (M-max_tokens-1, M-max_tokens-2)", max_len - 1, max_len - 2))
    else:
        notes.append("long + long skipped: max_model_len unknown")
        left.append(("long-pair", "long + long", "max_model_len unknown"))
    for a, b in extra or []:
        cand.append((f"requested ({a}, {b})", a, b))
    for label, a, b in cand:
        if max_len is not None and max(a, b) > max_len:
            notes.append(f"{label} dropped: longer than {max_len}")
            left.append((f"{a}+{b}", label, f"a {max(a, b)}-token prompt + max_tokens exceeds "
                         f"max_model_len (prompts up to {max_len} tokens fit)"))
        elif min(a, b) < 1:
            notes.append(f"{label} dropped: non-positive length")
            left.append((f"{a}+{b}", label, "a non-positive length"))
        else:
            out.append((label, a, b))
    return out, notes


@register
class Pairs(ChatScenario):
    """Kind ``pairs``: see the module docstring."""

    kind = "pairs"
    summary = "two boundary-length prompts in flight together (q-tail + q-tail, + 2C, long + long)"
    Params = PairsParams

    def planned_phases(self) -> int:
        return 4 + len(self.params.extra_pairs)

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        room = self.no_room(ctx.facts)
        if room:
            self.leave_out_phases(ctx, [(f"pair{i}", 2) for i in
                                        range(1, self.planned_phases() + 1)], room)
            return
        left: list[tuple[str, str, str]] = []
        pairs, notes = derive_pairs(ctx.facts, max_prompt_len(ctx, p.max_tokens),
                                    p.extra_pairs, left)
        ctx.note("pairs_notes", notes)
        note_no_chat(ctx, p, "pairs_notes")
        all_specs = [[boundary_spec(ctx, p, a, label), boundary_spec(ctx, p, b, label)]
                     for label, a, b in pairs]
        ctx.take_references([s for pair in all_specs for s in pair], phase_name="pairs-references")
        for i, ((label, a, b), specs) in enumerate(zip(pairs, all_specs), 1):
            ctx.run_phase(f"pair{i}-{a}+{b}", 2, specs)
        for j, (part, label, why) in enumerate(left, len(pairs) + 1):
            ctx.leave_out(f"pair{j}-{part}", f"pair {label}: {why}", 2)
