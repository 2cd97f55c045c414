"""Check ``degeneration``: no run of >= R identical tokens and no repeated n-gram loop.

Params: ``max_run`` R (default 16), ``ngram`` n (default 4), ``max_repeats`` (default 8: an n-gram
repeated back to back more than this many times is a loop). A pattern that the single-request
reference shows too is not reported (the model itself may repeat). Runs and loops made only of EOS
(``eos_token_id`` fact, from config.json) are not reported: with ``ignore_eos`` a model often
repeats EOS itself. Runs of token ID 0 are named
specially: token 0 decodes to "!" in byte-level vocabularies and a NaN logit row argmaxes to 0
(shared/DESIGN.md).
"""
from ..manifest import CheckResult
from . import register


def longest_run(ids: list[int], ignore: frozenset = frozenset()) -> tuple[int, int, int]:
    """(length, token, start) of the longest run of one repeated token not in ``ignore``;
    (0, -1, 0) when there is none."""
    best = (0, -1, 0)
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        if j - i > best[0] and ids[i] not in ignore:
            best = (j - i, ids[i], i)
        i = j
    return best


def longest_loop(ids: list[int], n: int, ignore: frozenset = frozenset()) -> tuple[int, int]:
    """(back-to-back repeats, start) of the most repeated n-gram loop (period n), skipping
    n-grams made only of tokens in ``ignore``."""
    best = (0, 0)
    for start in range(0, max(0, len(ids) - n + 1)):
        if all(t in ignore for t in ids[start: start + n]):
            continue
        reps = 1
        while ids[start + reps * n: start + (reps + 1) * n] == ids[start: start + n]:
            reps += 1
        if reps > best[0]:
            best = (reps, start)
    return best


@register("degeneration")
def check(ctx, spec, c, params) -> CheckResult:
    if c.error is not None:
        return CheckResult(name="degeneration", status="skip", detail="request failed")
    max_run = int(params.get("max_run", 16))
    n = int(params.get("ngram", 4))
    max_rep = int(params.get("max_repeats", 8))
    ref = ctx.references.get(spec.ref_key) if ctx is not None else None
    eos = ctx.facts.get("eos_token_id") if ctx is not None else None
    eos = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids = c.token_ids
    ref_ids = ref.output_ids if ref is not None else None
    problems = []
    run, tok, start = longest_run(ids, eos)
    if run >= max_run and not (ref_ids and longest_run(ref_ids, eos)[0] >= run):
        what = "token ID 0 (decodes to '!'; NaN rows argmax to 0)" if tok == 0 else f"token {tok}"
        problems.append(f"run of {run} x {what} at position {start}")
    reps, at = longest_loop(ids, n, eos)
    if reps > max_rep and not (ref_ids and longest_loop(ref_ids, n, eos)[0] >= reps):
        problems.append(f"{n}-gram repeated {reps} times back to back at position {at}")
    if problems:
        return CheckResult(name="degeneration", status="fail", detail="; ".join(problems))
    return CheckResult(name="degeneration", status="pass")
