"""Check ``sampled_degeneration``: a sampled output (temperature > 0) with a run of one token or a
run of one punctuation character, judged by how often the prompt's samples show one under load
against alone.

The seeds' 804-token bug under production sampling with speculative decoding answered
``duct!!!!!!!!!!!!!!!!!!!!!!!``; the maintainers' acceptance test was "no invalid token IDs or
repeated punctuation" (issue 26). A sampled request has no single-request reference to compare
its IDs with, and a model repeats itself by its own nature: on a clean bf16 mixture-of-experts
engine with sharp logits (GPU run v, H200, vLLM 0.26) 3 of the 4 load samples of one chat prompt
repeated one token 9-15 times where its 2 solo samples did not, and the same prompt's load
samples did not in the run beside it. A single sample decides nothing; a rate does.

**The pattern** (:func:`pattern`) of one output: a run of one token of length >= ``max_run``
(default 8), EOS excluded (``eos_token_id`` fact: with ``ignore_eos`` a model repeats EOS
itself), or a run of one punctuation character in the text (Unicode category P*, e.g.
``!!!!!!!!``, merged tokens included) of length >= ``max_punct_run`` (default 8).

**Per request**: pass without the pattern; with it, a ``note`` on a solo sample (model
behaviour) and a ``warn`` on a load sample, which the rate judges. **The rate**: the ``sampled``
kind's phase check ``sampled_degeneration`` (:func:`pleharness.scenarios.sampled_stats.degeneration_row`)
fails when the load samples show the pattern more often than the solo samples of the same
prompts, by the exact stratified test :func:`pleharness.twosample.stratified_more` at the
kind's family-wise ``alpha``: a corruption that fires under load on many samples (the seeds'
bug) is red; a prompt the model loops on alone and under load alike is not. A load-only pattern
on one sample of one prompt is not significant by itself (it stays a warning on that request).
Token ID 0 runs (a NaN row's signature) are the ``degeneration`` check's rule and always fail;
out-of-range IDs are ``vocab_range``'s.

Kind: **relative** with its own rules (the judge is the solo samples, not a single reference).
"""
from __future__ import annotations

import unicodedata

from ..manifest import CheckResult
from . import register
from .degeneration import longest_run

NAME = "sampled_degeneration"


def longest_punct_run(text: str) -> tuple[int, str, int]:
    """(length, character, start offset) of the longest run of one punctuation character
    (Unicode general category P*) in ``text``; (0, "", 0) when there is none."""
    best = (0, "", 0)
    i = 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        if j - i > best[0] and unicodedata.category(text[i]).startswith("P"):
            best = (j - i, text[i], i)
        i = j
    return best


def eos_ids(ctx) -> frozenset:
    """The EOS token IDs of ``ctx``'s engine facts (a list or one ID), as a frozenset."""
    eos = ctx.facts.eos_token_id if ctx is not None else None
    return frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def pattern(token_ids: list[int], text: str, eos: frozenset, max_run: int = 8,
            max_punct_run: int = 8) -> list[str]:
    """The degeneration patterns of one output (module docstring), each as a phrase ("run of 9 x
    token 331 at position 7", "run of 14 x '!' in the text at offset 2"); [] when none."""
    run, tok, start = longest_run(list(token_ids), eos)
    prun, pch, pat = longest_punct_run(text or "")
    found = []
    if run >= max_run:
        found.append(f"run of {run} x token {tok} at position {start}")
    if prun >= max_punct_run:
        found.append(f"run of {prun} x {pch!r} in the text at offset {pat}")
    return found


@register(NAME, kind="relative", own_rules=True)
def check(ctx, spec, c, params) -> CheckResult:
    """Pass, note (a solo sample) or warn (a load sample) for one sampled output (module
    docstring: the rate over the prompt's samples decides). ``params``: ``max_run``,
    ``max_punct_run`` (ints). Skipped for a failed request. Never raises."""
    if c.error is not None:
        return CheckResult(name=NAME, status="skip", detail="request failed")
    found = pattern(c.token_ids, c.text or "", eos_ids(ctx), int(params.get("max_run", 8)),
                    int(params.get("max_punct_run", 8)))
    if not found:
        return CheckResult(name=NAME, status="pass")
    role = getattr(ctx, "phase_role", "load") if ctx is not None else "load"
    if role != "load":
        return CheckResult(name=NAME, status="note", detail="; ".join(found) + (
            f" (model behaviour in a {role} sample; it counts in its prompt's solo rate)"))
    return CheckResult(name=NAME, status="warn", detail="; ".join(found) + (
        " (a sample: judged by rate against its prompt's solo samples, phase check "
        f"{NAME})"))
