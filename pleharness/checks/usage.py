"""Check ``usage``: the engine's accounting agrees with what was sent and received.

Asserts: usage.prompt_tokens == the intended prompt length; usage.completion_tokens == the number
of returned token IDs; finish_reason is "length" when exactly max_tokens IDs came back with
ignore_eos, and "stop" or "length" otherwise. A missing usage block is a failure (the harness
always asks for it with ``stream_options.include_usage``).
"""
from ..manifest import CheckResult
from . import register


@register("usage")
def check(ctx, spec, c, params) -> CheckResult:
    if c.error is not None:
        return CheckResult(name="usage", status="skip", detail="request failed")
    problems = []
    want = params.get("prompt_tokens", len(spec.prompt))
    if c.prompt_tokens is None or c.completion_tokens is None:
        problems.append("no usage block in the response")
    else:
        if c.prompt_tokens != want:
            problems.append(f"usage.prompt_tokens {c.prompt_tokens} != intended {want}")
        if c.completion_tokens != len(c.token_ids):
            problems.append(f"usage.completion_tokens {c.completion_tokens} != "
                            f"{len(c.token_ids)} returned IDs")
    n = len(c.token_ids)
    if n == spec.max_tokens and c.finish_reason != "length":
        problems.append(f"finish_reason {c.finish_reason!r} with max_tokens={n} IDs returned")
    if n < spec.max_tokens and c.finish_reason not in ("stop",):
        problems.append(f"finish_reason {c.finish_reason!r} with only {n} of {spec.max_tokens} IDs")
    if problems:
        return CheckResult(name="usage", status="fail", detail="; ".join(problems))
    return CheckResult(name="usage", status="pass")
