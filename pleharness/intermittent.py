"""Intermittent failures: their measured rate and how often a replay must repeat a request to
show one (issue 47 item 5). A defect that fires on one run in three passes a single replay two
times in three; the boundary kind names the rate of a length whose solo runs disagree, and
explain repeats a reproducer's level that many times (:mod:`pleharness.explain.suspects`)."""
from __future__ import annotations

import math
from collections.abc import Sequence
REPLAY_CONFIDENCE = 0.95


def intermittent_rate(outputs: Sequence[str]) -> float:
    """The measured rate of an intermittent failure from the output hashes of every run of one
    request that ran alike: the share of runs that did not give the most common output (0 when
    they all agree; 1/3 for a defect that fires on one run in three, whatever its wrong outputs
    are)."""
    if not outputs:
        return 0.0
    most = max(outputs.count(h) for h in set(outputs))
    return 1 - most / len(outputs)


def replay_repeats(rate: float, confidence: float = REPLAY_CONFIDENCE, cap: int = 64) -> int:
    """How many times one replay must run a request so that a failure at ``rate`` (per run,
    :func:`intermittent_rate`) shows at least once with probability ``confidence``: the
    smallest N with 1 - (1 - rate)^N >= confidence, i.e. N = ceil(ln(1 - confidence) /
    ln(1 - rate)) (rate 1/3: 8 runs, 95.6 %); 1 for a failure every run has (rate 0 means the
    runs agreed: a constant failure), at most ``cap``."""

    if rate <= 0 or rate >= 1:
        return 1
    return max(1, min(cap, math.ceil(math.log(1 - confidence) / math.log(1 - rate) - 1e-12)))
