"""Check ``prompt_logprobs``: the prompt's scores a request asked for (vLLM's ``prompt_logprobs``
or ``echo`` with ``logprobs``; ``RequestSpec.prompt_logprobs`` / ``echo``) are the prompt's, in
place, complete and consistent (issue 35 item 4). :func:`parity` compares them with the same
request alone (the scenario kind ``prompt_logprobs`` applies it).

Reference-free rules, on vLLM's contract (:mod:`pleharness.engine.prompt_logprobs` says what it
returns and where in vLLM that is), for a prompt of P tokens and k candidates asked:

- ``entries``: P entries; entry 0 none (the first prompt token has no context), every entry
  t >= 1 present (a prefix-cached or chunked part of the prompt returning no scores fails here);
- ``holds prompt token``: entry t lists prompt token t (the public bug: prompt logprobs shifted
  by one position, entry t scoring token t-1 or t+1);
- ``finite``: every listed logprob finite, <= ``tol`` and above the -9999.0 sentinel (vLLM's
  -inf): a softmax over real logits gives no other;
- ``top-k``: at most k + 1 candidates (the prompt token and the top k); the prompt token's
  rank (``prompt_logprobs`` only; echo carries none) is consistent with them: listed among the
  top k (k candidates in all), it ranks 1 + the candidates strictly above it (up to those at
  least as likely, for ties); listed beside them (k + 1), its rank is above k and every other
  candidate is at least as likely (within ``tol``);
- ``echo``: the echoed IDs (``tokens``) are the prompt's, in order, and entry t's
  ``token_logprobs`` value equals its candidate entry (within ``tol``; checked by
  ``logprob_sanity``'s rule 3 for the output part).

Kind: **absolute** (the engine's contract, whatever the model). Params: ``tol`` (nats, default
1e-4). Skipped when the request asked for neither or failed.
"""
from __future__ import annotations

import math

from ..manifest import CheckResult, ScoreDiffs
from ..manifest.records import OVER_CAP
from . import register
from .logprob_sanity import real_logprob

NAME, PARITY = "prompt_logprobs", "prompt_logprobs_parity"


def asked_k(spec) -> int | None:
    """The candidates per prompt position ``spec`` asked for: ``prompt_logprobs``, else
    ``logprobs`` with ``echo``; None when it asked for no prompt scores."""
    if getattr(spec, "prompt_logprobs", None) is not None:
        return int(spec.prompt_logprobs)
    if getattr(spec, "echo", False) and spec.logprobs is not None:
        return int(spec.logprobs)
    return None


def rank_problem(t: int, tok: int, entry: dict[int, float], ranks: dict[int, int], k: int,
                 tol: float) -> str | None:
    """The ``top-k`` rule at entry ``t`` (prompt token ``tok``), or None when it holds."""
    mine = float(entry[tok])
    others = [float(v) for i, v in entry.items() if i != tok]
    if len(entry) > k + 1:
        return f"entry {t}: {len(entry)} candidates for k = {k}"
    rank = ranks.get(tok)
    if rank is None:
        return None  # echo: no ranks
    if len(entry) <= k:  # the prompt token is one of the top k
        lo = 1 + sum(1 for v in others if v > mine + tol)
        hi = 1 + sum(1 for v in others if v >= mine - tol)
        if not lo <= rank <= hi:
            return (f"entry {t}: prompt token {tok} ({mine:.4f}) listed among the top {k} with "
                    f"rank {rank}, expected {lo}" + (f"..{hi}" if hi != lo else ""))
    else:
        if rank <= k:
            return (f"entry {t}: prompt token {tok} has rank {rank} but is listed beside the "
                    f"top {k}, not among them")
        if any(v < mine - tol for v in others):
            return (f"entry {t}: prompt token {tok} ({mine:.4f}, rank {rank}) is more likely "
                    f"than a top-{k} candidate ({min(others):.4f})")
    return None


def problems(c, prompt: list[int], k: int, tol: float = 1e-4) -> list[str]:
    """Every broken rule of the module docstring for completion ``c`` of ``prompt`` (IDs) with
    ``k`` candidates asked, as ``"rule: detail"`` strings (the first few per rule)."""
    found: dict[str, list[str]] = {}

    def bad(rule: str, text: str) -> None:
        found.setdefault(rule, []).append(text)
    entries = c.prompt_logprobs
    if entries is None:
        return ["entries: the answer carries no prompt logprobs"]
    ranks = c.prompt_ranks or [None] * len(entries)
    if len(entries) != len(prompt):
        bad("entries", f"{len(entries)} entries for a {len(prompt)}-token prompt")
    if entries and entries[0]:
        bad("entries", "entry 0 (the first prompt token, which has no context) is scored")
    for t in range(1, min(len(entries), len(prompt))):
        e, tok = entries[t], int(prompt[t])
        if not e:
            bad("entries", f"entry {t} missing")
            continue
        fin = [(i, v) for i, v in e.items() if not real_logprob(v) or float(v) > tol]
        if fin:
            bad("finite", f"entry {t}: " + ", ".join(f"{i}: {v}" for i, v in fin[:3]))
            continue
        if tok not in e:
            where = [d for d in (-1, 1) if 0 <= t + d < len(prompt) and prompt[t + d] in e]
            bad("holds prompt token", f"entry {t} lacks prompt token {tok}" + (
                f" (lists prompt token {t + where[0]}'s ID {prompt[t + where[0]]})"
                if where else ""))
            continue
        why = rank_problem(t, tok, e, (ranks[t] if t < len(ranks) else None) or {}, k, tol)
        if why:
            bad("top-k", why)
    if c.echo_ids is not None:
        if list(c.echo_ids) != list(prompt):
            at = next((i for i, (a, b) in enumerate(zip(c.echo_ids, prompt)) if a != b),
                      min(len(c.echo_ids), len(prompt)))
            bad("echo", f"the echoed IDs differ from the prompt at position {at} "
                        f"({len(c.echo_ids)} echoed for {len(prompt)})")
    out = []
    for rule, texts in found.items():
        more = f" (+{len(texts) - 2} more)" if len(texts) > 2 else ""
        out.append(f"{rule}: " + "; ".join(texts[:2]) + more)
    return out


@register(NAME)
def check(ctx, spec, c, params) -> CheckResult:
    """The rules of the module docstring for completion ``c`` of ``spec``. Returns pass, fail
    (each broken rule, named, with its first positions) or skip (no prompt scores asked, or the
    request failed). Never raises."""
    k = asked_k(spec)
    if k is None:
        return CheckResult(name=NAME, status="skip", detail="no prompt logprobs asked")
    if c.error is not None:
        return CheckResult(name=NAME, status="skip", detail=f"request failed: {c.error}")
    prompt = [int(t) for t in spec.prompt.ids]
    found = problems(c, prompt, k, float(params.get("tol", 1e-4)))
    how = "echo" if c.echo_ids is not None else "prompt_logprobs"
    if found:
        return CheckResult(name=NAME, status="fail", detail=f"{how} (k = {k}): "
                           + " | ".join(found))
    return CheckResult(name=NAME, status="pass",
                       detail=f"{how} (k = {k}): {len(prompt) - 1} entries, each listing its "
                              "prompt token" + (", ranks consistent" if c.prompt_ranks else ""))


def token_scores(c, prompt: list[int]) -> list[float | None]:
    """Per prompt position t >= 1, the logprob ``c`` gives prompt token t (nats; None where
    its entry is missing or lacks the token); position 0 is None."""
    entries = c.prompt_logprobs or []
    out: list[float | None] = [None]
    for t in range(1, len(prompt)):
        e = entries[t] if t < len(entries) else None
        v = e.get(int(prompt[t])) if e else None
        out.append(float(v) if real_logprob(v) else None)
    return out


def carries_probability(c, t: int, tok: int, k: int | None) -> bool:
    """Whether prompt token ``tok``'s score at entry ``t`` of ``c`` is among its top candidates
    (rank <= ``k`` where ranks came back, else no other listed candidate below it), so that a
    difference there is evidence: at a far-tail position (-40 nats, a probability below 1e-16)
    bfloat16 rounding of the large logits moves the value by nats and means nothing (vLLM's
    ``check_logprobs_close``: each side's token among the other's top-N, not equal logprobs).
    ``k`` None: every scored position counts."""
    if k is None:
        return True
    ranks = c.prompt_ranks or []
    rank = (ranks[t] or {}).get(tok) if t < len(ranks) and ranks[t] else None
    if rank is not None:
        return int(rank) <= k
    e = (c.prompt_logprobs or [])[t] if t < len(c.prompt_logprobs or []) else None
    if not e or tok not in e:
        return False
    return len(e) <= k or any(float(v) < float(e[tok]) for i, v in e.items() if i != tok)


def measure_parity(c, ref, prompt: list[int], bound: float, k: int | None = None
                   ) -> ScoreDiffs | None:
    """The prompt-token logprob differences of ``c`` from ``ref`` (the same request alone) at
    every position both score where the token carries probability on either side
    (:func:`carries_probability`: a far-tail position on both sides is counted as ``tail``
    and not compared; where one side ranks the token among its top candidates the other must
    agree, as vLLM's ``check_logprobs_close`` has it), positions over ``bound``
    nats listed; positions the reference scores and ``c`` does not are ``missing``. None when
    either lacks prompt scores or the request failed. Never raises."""
    if c.error is not None or ref is None or ref.prompt_logprobs is None \
            or c.prompt_logprobs is None:
        return None
    got, want = token_scores(c, prompt), token_scores(ref, prompt)
    out = ScoreDiffs(bound_nats=bound)
    for t in range(1, len(prompt)):
        a, b = got[t], want[t]
        if b is None:
            continue
        if a is None:
            out.missing += 1
            out.first_missing = t if out.first_missing is None else out.first_missing
            continue
        tok = int(prompt[t])
        if not (carries_probability(c, t, tok, k) or carries_probability(ref, t, tok, k)):
            out.tail += 1
            continue
        out.compared += 1
        d = abs(a - b)
        if math.isnan(d) or d > bound:
            if len(out.over) < OVER_CAP:
                out.over.append((t, a, b))
            d = math.inf if math.isnan(d) else d
        out.max_nats = max(out.max_nats, d)
    return out


def judge_parity(diffs: ScoreDiffs, positions: int, tolerance: float, why: str) -> CheckResult:
    """``prompt_logprobs_parity`` of measured ``diffs`` (over a prompt of ``positions`` + 1
    tokens) at ``tolerance`` nats (``why``: where it came from): fails naming the positions
    over it and the missing ones."""
    over = diffs.over_tolerance(tolerance)
    tail = (f"; {diffs.tail} far-tail position(s) not compared (the token outside a side's "
            "top candidates)") if diffs.tail else ""
    if over or diffs.missing:
        parts = []
        if over:
            t, a, b = over[0]
            many = f"{len(over)}" + ("+" if len(diffs.over) >= OVER_CAP else "")
            parts.append(f"{many} of {diffs.compared} prompt positions differ from "
                         f"the solo request's by more than {tolerance:g} nats ({why}); first at "
                         f"position {t}: {a:.4f} vs {b:.4f}")
        if diffs.missing:
            parts.append(f"{diffs.missing} prompt position(s) lack the prompt token's score "
                         f"that the solo request gives (first at position {diffs.first_missing})")
        return CheckResult(name=PARITY, status="fail", detail="; ".join(parts) + tail)
    return CheckResult(name=PARITY, status="pass",
                       detail=f"{diffs.compared} prompt positions within {tolerance:g} nats "
                              f"of the solo request's ({why}); largest difference "
                              f"{diffs.max_nats:.3g} nats{tail}")


def parity(c, ref, prompt: list[int], threshold: float, why: str, k: int | None = None
           ) -> CheckResult:
    """``prompt_logprobs_parity``: each prompt token's logprob in ``c`` equals the one in
    ``ref`` (the same request alone) within ``threshold`` nats (``why`` says where it came
    from) wherever it carries probability (``k``: the candidates asked,
    :func:`carries_probability`). Fails naming the positions over it (a shifted, missing or
    corrupt score under load); skip when either lacks prompt scores. Never raises."""
    return parity_measured(c, ref, prompt, threshold, why, k)[0]


def parity_measured(c, ref, prompt: list[int], threshold: float, why: str,
                    k: int | None = None) -> tuple[CheckResult, ScoreDiffs | None]:
    """(:func:`parity`'s result, the measured differences it was judged on, or None where
    nothing was measured), so that a caller keeps the differences without measuring twice."""
    if c.error is not None or ref is None or ref.prompt_logprobs is None:
        return CheckResult(name=PARITY, status="skip",
                           detail="no solo reference with prompt logprobs" if c.error is None
                           else f"request failed: {c.error}"), None
    if c.prompt_logprobs is None:
        return CheckResult(name=PARITY, status="fail",
                           detail="the answer carries no prompt logprobs; the solo one does"), None
    diffs = measure_parity(c, ref, prompt, threshold, k)
    return judge_parity(diffs, len(prompt) - 1, threshold, why), diffs
