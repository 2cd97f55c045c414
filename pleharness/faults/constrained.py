"""Planted fault class of the constrained-output family (issue 35 item 3), beside
:mod:`.families`: a constrained output that does not parse under load. :data:`CONSTRAINED` by
name."""
from __future__ import annotations

from .families import FamilyFault, shifted
from .rules import set_top, top_first, top_of

CONSTRAINT_FIELDS = ("structured_outputs", "response_format", "guided_json", "guided_regex",
                     "guided_choice", "guided_grammar")


def is_constrained(body: dict) -> bool:
    """Whether a completions request body constrains its output (vLLM's ``structured_outputs``,
    OpenAI's ``response_format``, or an older vLLM's ``guided_*`` fields)."""
    return any(body.get(k) for k in CONSTRAINT_FIELDS)


class ConstrainedBrokenUnderLoad(FamilyFault):
    """A constrained request in flight with another (when it arrives or at its first output
    chunk) gets its first output token changed (:func:`~.families.shifted`, its logprobs made
    consistent with it) and its text's first character replaced by ``#``: the output no longer
    parses or matches (what a grammar's token mask applied to another batch row gives: a token
    the grammar forbids). Requests alone are untouched, so the solo reference conforms."""

    name = "constrained_broken_under_load"
    family = "constrained output"
    scenarios = ("constrained",)
    summary = "a constrained output in flight with another starts with '#' (first token changed)"
    expect = "constrained, parity"

    def chunk(self, ctx, chunk):
        if ctx.state.get("done") or not is_constrained(ctx.body):
            return chunk
        if "selected" not in ctx.state:
            ctx.state["selected"] = ctx.in_flight >= 2 or self.beside(ctx, lambda o: True)
        if not ctx.state["selected"]:
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            if not ids:
                continue
            new = shifted(ids[0])
            top = top_of(ch, 0)
            if top:
                set_top(ch, 0, top_first(top, new), new)
            else:
                ids[0] = new
            ch["text"] = "#" + (ch.get("text") or "")[1:]
            ctx.state["done"] = True
            self.hit(ctx)
            break
        return chunk


CONSTRAINED: dict[str, type[FamilyFault]] = {c.name: c for c in (ConstrainedBrokenUnderLoad,)}
