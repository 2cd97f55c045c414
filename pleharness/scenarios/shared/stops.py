"""Stops taken from an engine's own output, shared by the ``mixed_params`` and ``stop_strings``
kinds and by the ``fuzz`` kind's drawn features (:mod:`pleharness.scenarios.fuzz_features`):
:func:`stop_id`, the stop token ID for an output position, and :func:`stop_for`, the stop string
that completes exactly at one (:func:`stop_span`: and how many tokens it spans).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...checks.stop_string import UNMATCHABLE, eos_ids

if TYPE_CHECKING:  # pragma: no cover
    from ...run.scenario_context import ScenarioContext


def stop_id(ids, at: int) -> int:
    """The stop ID for ``stop_token_at`` = ``at`` in the default output ``ids``: the first ID at
    position ``at`` or later that the output does not emit before (the variant then stops
    exactly there, not on an earlier occurrence); ``ids[at]`` when there is none."""
    for j in range(at, len(ids)):
        if ids[j] not in ids[:j]:
            return int(ids[j])
    return int(ids[at])


def stop_for(ctx: "ScenarioContext", ids: list[int], j: int) -> str | None:
    """A stop string whose first occurrence in the text of ``ids`` ends exactly at token j: the
    text of tokens j, then j-1..j, ... (up to 4 tokens back), the first that qualifies; None when
    none does (e.g. token j's text is empty, or holds U+FFFD: /detokenize's text for an incomplete
    UTF-8 sequence, which the engine's incremental detokenizer never emits, so no engine matches
    it: :data:`pleharness.checks.stop_string.UNMATCHABLE`)."""
    got = stop_span(ctx, ids, j)
    return None if got is None else got[0]


def stop_span(ctx: "ScenarioContext", ids: list[int], j: int,
              min_back: int = 1) -> tuple[str, int] | None:
    """(stop string, tokens it spans) of :func:`stop_for`, starting at ``min_back`` tokens
    (2: a string of at least tokens j-1..j, which straddles two stream deltas where token j
    starts one; issue 52); None when none qualifies."""
    if ids[j] in eos_ids(ctx):  # EOS: no text in a completion (skip_special_tokens)
        return None
    upto = ctx.detokenize(ids[:j + 1])
    for back in range(max(1, min_back), min(4, j + 1) + 1):
        s = upto[len(ctx.detokenize(ids[:j + 1 - back])):]
        if s.strip() and UNMATCHABLE not in s and upto.find(s) == len(upto) - len(s):
            return s, back
    return None
