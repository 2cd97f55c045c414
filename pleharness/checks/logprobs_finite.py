"""Check ``logprobs_finite``: when logprobs were requested, every returned logprob is finite.

A NaN or infinite logprob means a NaN/inf logit row (e.g. a corrupted hidden state). Skipped when
the request asked for no logprobs.
"""
import math

from ..manifest import CheckResult
from . import register


@register("logprobs_finite")
def check(ctx, spec, c, params) -> CheckResult:
    if c.logprobs is None:
        return CheckResult(name="logprobs_finite", status="skip", detail="no logprobs requested")
    for pos, top in enumerate(c.logprobs):
        for tok, lp in top.items():
            if lp is None or not math.isfinite(float(lp)):
                return CheckResult(name="logprobs_finite", status="fail",
                                   detail=f"logprob {lp} for token {tok} at position {pos}")
    return CheckResult(name="logprobs_finite", status="pass")
