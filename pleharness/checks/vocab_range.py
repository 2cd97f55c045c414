"""Check ``vocab_range``: every output token ID is in [0, V), V = the vocabulary size fact.

Corrupted decode steps often emit out-of-range IDs (shared/DESIGN.md, "Checks and what they catch").
Skipped when V is unknown.

Kind: **absolute** (the engine's contract): an ID outside the vocabulary is no model's output; it
always fails, whatever the reference shows.
"""
from ..manifest import CheckResult
from . import register


@register("vocab_range")
def check(ctx, spec, c, params) -> CheckResult:
    """Every ID of ``c.token_ids`` is in [0, V), V = ``params["vocab_size"]`` or else the
    ``vocab_size`` fact. Returns pass, fail (how many IDs are out of range, the first one and its
    position) or skip (V unknown, or the request failed). Never raises."""
    v = params.get("vocab_size") or ctx.facts.vocab_size
    if v is None:
        return CheckResult(name="vocab_range", status="skip", detail="vocabulary size unknown")
    if c.error is not None:
        return CheckResult(name="vocab_range", status="skip", detail="request failed")
    bad = [(i, t) for i, t in enumerate(c.token_ids) if not 0 <= t < v]
    if bad:
        i, t = bad[0]
        return CheckResult(name="vocab_range", status="fail",
                           detail=f"{len(bad)} ID(s) outside [0, {v}); first: {t} at position {i}")
    return CheckResult(name="vocab_range", status="pass")
