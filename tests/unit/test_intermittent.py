"""pleharness.intermittent: an intermittent failure's measured rate and the replays it needs,
against their formulas (by hypothesis)."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pleharness import intermittent as dv


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=12))
def test_intermittent_rate_is_the_share_outside_the_commonest_output(outs):
    rate = dv.intermittent_rate(outs)
    most = max(outs.count(h) for h in set(outs))
    assert rate == pytest.approx(1 - most / len(outs))
    assert 0 <= rate < 1


@given(st.floats(0.01, 0.99), st.floats(0.5, 0.99))
def test_replay_repeats_is_the_smallest_n_reaching_the_confidence(rate, conf):
    n = dv.replay_repeats(rate, conf, cap=10_000)
    assert 1 - (1 - rate) ** n >= conf - 1e-9
    assert n == 1 or 1 - (1 - rate) ** (n - 1) < conf + 1e-9
    assert dv.replay_repeats(1 / 3) == 8 and dv.replay_repeats(0.0) == 1
    assert dv.replay_repeats(0.001, cap=64) == 64
    assert math.isfinite(n)
