"""``logprob_parity`` (issue 35 item 6): the logprob the engine reports for each emitted token
equals the one the same request reported alone, within the run's near-tie threshold.

The rule: for a greedy request with ``logprobs`` compared with its solo reference (a run of the
same request on this engine, one request in flight), at every output position before the first
divergence (the IDs agree there, so both logits rows are the same computation up to batch-order
rounding) ``|logprob - reference logprob| <= T``, with T the near-tie threshold of the serving
dtype (:data:`pleharness.divergence.NEAR_TIE_BY_DTYPE`: bfloat16 0.5, float16 0.0625, float32
0.01 nats; ``--near-tie-nats`` overrides). A draft model's logprob reported for the target's token
under speculative decoding, or a logprob row taken from another batch row, passes
``logprob_sanity`` (finite, top-1, listed) and fails here. The emitted token being the top-1 of
its own greedy logprobs is ``logprob_sanity``'s rule.

Not applied (no result recorded) to sampled requests, failed requests, requests or references
without logprobs, and references that are not this engine's solo runs (a golden model, a
reference engine or a stored manifest compute in another way).
"""
from __future__ import annotations

import math

from ..manifest import CheckResult

NAME = "logprob_parity"


def logprob_parity(spec, c, ref, threshold: float) -> CheckResult | None:
    """The ``logprob_parity`` result of completion ``c`` (of ``spec``) against reference record
    ``ref`` (its ``output_ids`` and ``token_logprobs``), ``threshold`` in nats; None where the
    rule does not apply (module docstring). Fails naming the first position over the threshold
    and how many are. Never raises."""
    lps = getattr(c, "token_logprobs", None)
    want = getattr(ref, "token_logprobs", None) if ref is not None else None
    if (spec.temperature or c.error is not None or not lps or not want
            or getattr(ref, "source", "solo") != "solo"):
        return None
    n = min(len(c.token_ids), len(ref.output_ids), len(lps), len(want))
    upto = next((i for i in range(n) if c.token_ids[i] != ref.output_ids[i]), n)
    over, worst, seen = [], 0.0, 0
    for i in range(upto):
        a, b = lps[i], want[i]
        if a is None or b is None:
            continue
        seen += 1
        d = abs(float(a) - float(b))
        if math.isnan(d) or d > threshold:
            over.append((i, float(a), float(b)))
        elif d > worst:
            worst = d
    if not seen:
        return None
    if over:
        i, a, b = over[0]
        return CheckResult(name=NAME, status="fail", detail=(
            f"{len(over)} of {seen} emitted-token logprobs differ from the solo run's by more "
            f"than {threshold:g} nats; first at output position {i} (token "
            f"{c.token_ids[i]}): {a:.4f} vs {b:.4f}"))
    return CheckResult(name=NAME, status="pass", detail=(
        f"{seen} emitted-token logprobs within {threshold:g} nats of the solo run's; largest "
        f"difference {worst:.3g} nats"))
