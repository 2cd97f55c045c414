"""Check ``counting``: the output starts with the exact ordered sequence 1, 2, ..., N.

For a prompt "Count from 1 to N.": the whitespace-separated words of the output text must begin
with "1" ... "N" (``n`` param; default: as many numbers as fit in the output, at least 1). Words
after N are ignored (the embedded model keeps counting when ``ignore_eos`` is on). On failure the
first wrong position and word are reported.

Kind: **relative** (model behaviour, :mod:`pleharness.checks.relative`): a load request fails only
when its reference passes the same check; a reference or warm-up run only when the golden model's
output passes it; otherwise the miss is a model-behaviour ``note`` (a model that does not count).
"""
from ..manifest import CheckResult
from . import register


@register("counting", kind="relative")
def check(ctx, spec, c, params) -> CheckResult:
    """The output text's first N words are "1" .. "N" (``params["n"]``; default: as many as the
    output holds). Returns pass, fail (an empty output, or the first wrong or missing word) or
    skip (the request failed). Never raises."""
    if c.error is not None:
        return CheckResult(name="counting", status="skip", detail="request failed")
    words = c.text.split()
    n = int(params.get("n") or len(words))
    if n < 1:
        return CheckResult(name="counting", status="fail", detail="empty output")
    for i in range(n):
        if i >= len(words):
            return CheckResult(name="counting", status="fail",
                               detail=f"output ends after {len(words)} of {n} numbers")
        if words[i] != str(i + 1):
            return CheckResult(name="counting", status="fail",
                               detail=f"word {i + 1} is {words[i]!r}, expected '{i + 1}'")
    return CheckResult(name="counting", status="pass", detail=f"1..{n} in order")
