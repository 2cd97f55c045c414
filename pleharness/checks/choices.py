"""Check ``choices``: one choice of a request for ``n`` > 1 choices (``RequestSpec.n``, issue
35 item 2) obeys the rules that bind the choices of one request together.

What vLLM does (``vllm/v1/engine/parallel_sampling.py`` and
``vllm/entrypoints/openai/completion/serving.py``, 0.32.0; :mod:`pleharness.engine.choices`):
the n choices are n child requests, child i seeded with the request's seed + i; the request's
usage counts the prompt once and every choice's IDs. Rules, with ``L`` the prompt's length:

- ``every choice``: the answer has each index 0 .. n - 1 once (a missing choice is already a
  request error of that choice's record: protocol "no choice i of n"); judged here: the
  request's choices all arrived;
- ``usage counts every choice`` (on choice 0's record, once per request): the request's usage
  block has ``prompt_tokens`` == L (the prompt counted once, not n times) and
  ``completion_tokens`` == the sum of every choice's returned IDs;
- ``seeded choices differ`` (a seeded sampled request whose choices are compared with their
  derived seeds' single requests, ``spec.compare``: the scenario measured that seeds
  reproduce): choice i's IDs may equal an earlier choice j's only when the single requests of
  seeds s + i and s + j (their references) are equal too; otherwise choice i is a clone (the
  public bug pattern: every choice repeats choice 0, vllm-project/vllm#11898 on the V0 engine).
  Not luck: two different seeds that sample the same IDs alone are allowed to here too.

A choice's own length, finish_reason and (streamed) usage are the ``usage`` check's; its IDs
against its reference are ``parity``.

Kind: **absolute** (the engine's contract for n > 1; it does not depend on the model).
"""
from __future__ import annotations

from dataclasses import replace

from ..manifest import CheckResult
from . import register

NAME = "choices"


@register(NAME)
def check(ctx, spec, c, params) -> CheckResult:
    """The rules of the module docstring for choice ``spec.choice`` of ``spec.n`` (``c`` a
    :class:`pleharness.engine.choices.ChoiceCompletion`). Returns pass, fail (every broken
    rule, named, with the numbers), or skip (n = 1, the request failed). Never raises."""
    n = int(getattr(spec, "n", 1) or 1)
    if n < 2:
        return CheckResult(name=NAME, status="skip", detail="a request of one choice (n = 1)")
    if c.error is not None:
        return CheckResult(name=NAME, status="skip", detail=f"request failed: {c.error}")
    sibs = list(getattr(c, "siblings", None) or [])
    i = spec.choice
    where = f"choice {i} of n = {n}"
    if len(sibs) != n:
        return CheckResult(name=NAME, status="fail",
                           detail=f"{where}: every choice: the answer was read into {len(sibs)} "
                                  "choices (not one request for n choices)")
    bad, good = [], []
    missing = [k for k, o in enumerate(sibs) if o.error is not None]
    if missing:
        bad.append(f"every choice: choice(s) {missing} of the request missing or failed")
    if i == 0 and not missing:
        L = len(spec.prompt)
        pt, ct = c.request_prompt_tokens, c.request_completion_tokens
        total = sum(len(o.token_ids) for o in sibs)
        if pt is None or ct is None:
            bad.append("usage counts every choice: the request has no usage block")
        else:
            if pt != L:
                bad.append(f"usage counts every choice: usage.prompt_tokens {pt} != the prompt's "
                           f"{L} (counted once" + (f"; {n} x {L} = {n * L}" if pt == n * L
                                                   else "") + ")")
            if ct != total:
                lens = [len(o.token_ids) for o in sibs]
                bad.append(f"usage counts every choice: usage.completion_tokens {ct} != "
                           f"{total}, the sum of the choices' IDs {lens}")
            if pt == L and ct == total:
                good.append(f"request usage {pt} + {ct} (every choice's IDs)")
    if spec.temperature > 0 and spec.seed is not None and spec.compare and spec.top_k != 1:
        base = spec.seed - i
        refs = ctx.references if ctx is not None else {}
        mine = refs.get(spec.ref_key)
        for j in range(i):
            if list(sibs[j].token_ids) != list(c.token_ids):
                continue
            other = refs.get(replace(spec, seed=base + j, choice=j).ref_key)
            if mine is None or other is None:
                good.append(f"same IDs as choice {j}: no references to tell (not judged)")
            elif mine.output_hash != other.output_hash:
                bad.append(f"seeded choices differ: choice {i} repeats choice {j}'s "
                           f"{len(c.token_ids)} IDs, while seeds {base + i} and {base + j} "
                           "give different samples alone (a clone)")
            else:
                good.append(f"same IDs as choice {j}, as seeds {base + j} and {base + i} "
                            "give alone")
        if not any(g.startswith("same IDs") for g in good) and not any(
                b.startswith("seeded") for b in bad):
            good.append(f"differs from choices 0..{i - 1}" if i else "first choice")
    if bad:
        return CheckResult(name=NAME, status="fail", detail=f"{where}: " + "; ".join(bad))
    return CheckResult(name=NAME, status="pass",
                       detail=f"{where}" + (": " + "; ".join(good) if good else ""))
