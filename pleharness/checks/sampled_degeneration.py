"""Check ``sampled_degeneration``: a sampled output (temperature > 0) has no run of one token and
no run of one punctuation character longer than every solo sample of the same prompt shows.

The seeds' 804-token bug under production sampling with speculative decoding answered
``duct!!!!!!!!!!!!!!!!!!!!!!!``; the maintainers' acceptance test was "no invalid token IDs or
repeated punctuation" (issue 26). A sampled request has no single-request reference to compare
its IDs with, so the judge is the engine's own solo samples of the same prompt (drawn one at a
time before the load, by the ``sampled`` scenario kind, which passes their longest runs in the
params):

- a **run of one token** of length >= ``max_run`` (default 8), EOS excluded (``eos_token_id``
  fact: with ``ignore_eos`` a model repeats EOS itself), more than twice ``solo_run`` (the
  longest such run among the solo samples of the prompt);
- a **run of one punctuation character** in the text (Unicode category P*, e.g. ``!!!!!!!!``,
  merged tokens included) of length >= ``max_punct_run`` (default 8), more than twice
  ``solo_punct_run``.

Why twice: a few solo samples under-estimate how long the model's own runs get under sampling
(GPU run u, a clean bf16 MoE engine with sharp logits: two solo samples' longest run 7, a load
sample's 11); the corruption this is for repeats to the end of the output.

A load request (``ctx.phase_role`` load) fails on either; a reference (solo) sample is never
judged by itself: the pattern is a ``note`` (model behaviour), as ``degeneration`` does without a
golden reference. ``solo_run`` / ``solo_punct_run`` absent: no solo samples to excuse the
pattern, so a load request fails on it. Token ID 0 runs (a NaN row's signature) are the
``degeneration`` check's rule, out-of-range IDs ``vocab_range``'s.

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


@register(NAME, kind="relative", own_rules=True)
def check(ctx, spec, c, params) -> CheckResult:
    """Pass, note or fail for one sampled output (module docstring). ``params``: ``max_run``,
    ``max_punct_run``, ``solo_run``, ``solo_punct_run`` (ints; the last two from the solo
    samples), ``solo_samples`` (how many, for the detail). Skipped for a failed request.
    Never raises."""
    if c.error is not None:
        return CheckResult(name=NAME, status="skip", detail="request failed")
    max_run = int(params.get("max_run", 8))
    max_punct = int(params.get("max_punct_run", 8))
    solo_run, solo_punct = params.get("solo_run"), params.get("solo_punct_run")
    n_solo = params.get("solo_samples")
    role = getattr(ctx, "phase_role", "load") if ctx is not None else "load"
    run, tok, start = longest_run(list(c.token_ids), eos_ids(ctx))
    prun, pch, pat = longest_punct_run(c.text or "")
    found = []
    if run >= max_run and (solo_run is None or run > 2 * int(solo_run)):
        found.append(f"run of {run} x token {tok} at position {start}")
    if prun >= max_punct and (solo_punct is None or prun > 2 * int(solo_punct)):
        found.append(f"run of {prun} x {pch!r} in the text at offset {pat}")
    if not found:
        return CheckResult(name=NAME, status="pass")
    if role != "load":
        return CheckResult(name=NAME, status="note", detail="; ".join(found) + (
            f" (model behaviour in a {role} sample; it raises the bar for the load samples of "
            "this prompt)"))
    if solo_run is None and solo_punct is None:
        judge = "no solo samples of this prompt to excuse it"
    else:
        judge = (f"longer than in any of the {n_solo or 'solo'} solo samples of this prompt "
                 f"(longest run {solo_run}, longest punctuation run {solo_punct})")
    return CheckResult(name=NAME, status="fail", detail="; ".join(found) + f": {judge}")
