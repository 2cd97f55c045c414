"""Divergence analysis: is a token mismatch a numerical near tie or corruption?

When an output differs from its reference, the first divergent position p is located and the
reference's top-1 minus top-2 logprob margin at p is read (nats; needs ``logprobs >= 2`` on the
reference request). A margin below the threshold means the reference itself was almost undecided
there, so a batch-size dependent reduction order (different kernels, split-K, padding) can flip
the argmax without any bug: ``near_tie``. Otherwise ``hard``: the engine produced a token the
reference ranked clearly lower, which is what corruption looks like.

Default threshold: 0.1 nats. Reasoning: bf16 keeps 8 significant bits, so a logit of magnitude 8-16
is stored with a step of 0.03-0.06; two kernels that sum in a different order differ by one or two
such steps, i.e. up to about 0.1 nats between the top two candidates. Float32 engines flip only
far below this. Use ``--strict`` on batch-invariant engines (VLLM_BATCH_INVARIANT=1), where any
divergence is a bug, and ``--near-tie-nats`` to tune it.

A near tie is still a failure when a reference-free check failed on that output (a near tie
followed by garbage is corruption that happened to start at a close call).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DEFAULT_NEAR_TIE_NATS = 0.1
WINDOW = 4  # tokens shown on each side of the divergence


def margins(top_logprobs: Sequence[dict] | None) -> list[float | None] | None:
    """Per position, top-1 minus top-2 logprob (nats); None where fewer than two candidates."""
    if top_logprobs is None:
        return None
    out: list[float | None] = []
    for top in top_logprobs:
        vals = sorted((float(v) for v in (top or {}).values() if v is not None), reverse=True)
        out.append(round(vals[0] - vals[1], 6) if len(vals) >= 2 else None)
    return out


def reconverges(reference: Sequence[int], observed: Sequence[int], pos: int, tail: int = 8) -> bool:
    """True when, after diverging at ``pos``, the last ``tail`` tokens of both outputs agree again
    (the same length and the same final tokens)."""
    if len(reference) != len(observed) or pos >= len(reference) - 1:
        return False
    n = min(tail, len(reference) - pos - 1)
    return list(reference[-n:]) == list(observed[-n:])


def analyse(reference: Sequence[int], observed: Sequence[int], pos: int,
            ref_margins: Sequence[float | None] | None, threshold: float,
            checks_failed: Sequence[str] = ()) -> dict[str, Any]:
    """Evidence and class of one divergence.

    Returns a dict: position, reference/observed windows (token IDs around ``pos``), the
    reference's margin at ``pos`` (nats or None), ``class`` (near_tie | hard | unknown: no
    reference logprobs), reconverged, checks_failed, and ``fails`` (whether it fails the run under
    the default policy: hard, unknown, or any failed check).
    """
    lo = max(0, pos - WINDOW)
    margin = None
    if ref_margins is not None and pos < len(ref_margins):
        margin = ref_margins[pos]
    if margin is None:
        cls = "unknown"
    else:
        cls = "near_tie" if margin < threshold else "hard"
    return {
        "position": pos,
        "reference_window": list(reference[lo: pos + WINDOW + 1]),
        "observed_window": list(observed[lo: pos + WINDOW + 1]),
        "window_start": lo,
        "reference_token": reference[pos] if pos < len(reference) else None,
        "observed_token": observed[pos] if pos < len(observed) else None,
        "margin_nats": margin,
        "threshold_nats": threshold,
        "class": cls,
        "reconverged": reconverges(reference, observed, pos),
        "checks_failed": list(checks_failed),
        "fails": cls != "near_tie" or bool(checks_failed),
    }
