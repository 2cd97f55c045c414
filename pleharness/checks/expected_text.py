"""Check ``expected_text``: the output text matches a regex (``regex``) or equals ``exact``.

Params: ``regex`` (searched with re.match from the start, e.g. ``^\\s*OK`` for "Reply with OK.") or
``exact`` (compared with the stripped text). Text is decoded by the engine (display and this check
only; parity always uses token IDs).

Kind: **relative** (model behaviour, :mod:`pleharness.checks.relative`): a load request fails only
when its reference passes the same check; a reference or warm-up run only when the golden model's
output passes it; otherwise the miss is a model-behaviour ``note``. Example: a random-weight model
answers "Reply with OK." with ``' checkmberFd 290hunk'`` in its solo reference and under load
alike: a note, not a failure; the same model answering OK alone and ``' #'`` under load: a failure.
"""
import re

from ..manifest import CheckResult
from . import register


@register("expected_text", kind="relative")
def check(ctx, spec, c, params) -> CheckResult:
    """The output text matches ``params["regex"]`` (re.match from the start) or, stripped,
    equals ``params["exact"]``. Returns pass, fail (the text, shortened) or skip (the request
    failed, or neither param given). Never raises."""
    if c.error is not None:
        return CheckResult(name="expected_text", status="skip", detail="request failed")
    if "exact" in params:
        ok = c.text.strip() == params["exact"]
        want = f"exactly {params['exact']!r}"
    elif "regex" in params:
        ok = re.match(params["regex"], c.text) is not None
        want = f"/{params['regex']}/"
    else:
        return CheckResult(name="expected_text", status="skip", detail="no regex or exact given")
    if ok:
        return CheckResult(name="expected_text", status="pass")
    return CheckResult(name="expected_text", status="fail",
                       detail=f"text {c.text[:60]!r} does not match {want}")
