"""pleharness.divergence, function by function (issue 50's test mirror): where two outputs part,
how one divergence is settled from the evidence on it (the order of docs/references.md), one
comparison under a run's rule, and how often a replay must repeat an intermittent failure."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pleharness import divergence as dv
from pleharness.manifest import Divergence

ids = st.lists(st.integers(0, 50), max_size=20)


@given(ids, ids)
def test_first_divergence_is_where_the_lists_part(a, b):
    pos = dv.first_divergence(a, b)
    if a == b:
        assert pos is None
        return
    assert pos is not None and a[:pos] == b[:pos]
    assert pos == min(len(a), len(b)) or a[pos] != b[pos]


def test_reconverges_needs_the_same_length_and_the_same_tail():
    ref = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert dv.reconverges(ref, [1, 2, 99, 4, 5, 6, 7, 8, 9, 10], 2)
    assert not dv.reconverges(ref, [1, 2, 99, 4, 5, 6, 7, 8, 9, 11], 2)
    assert not dv.reconverges(ref, ref[:9], 2)  # shorter: never reconverged
    assert not dv.reconverges(ref, ref[:9] + [0], 9)  # parted at the last token


def test_margins_skip_sentinels_and_rank_by_value():
    tops = [{"5": -0.1, "7": -2.6}, {"7": -3.0, "5": -0.5}, {"1": -0.2, "2": -9999.0},
            {"1": -0.2, "2": float("-inf")}]
    assert dv.margins(tops) == [2.5, 2.5, None, None]
    assert dv.margins(None) is None


def test_near_tie_threshold_by_dtype_and_override():
    bf16, why = dv.near_tie_threshold("bf16")
    assert why == "serving dtype bfloat16" and bf16 > 0
    assert dv.near_tie_threshold("torch.float32")[0] <= bf16
    assert dv.near_tie_threshold("auto")[1].startswith("serving dtype 'auto' unknown")
    assert dv.near_tie_threshold("bfloat16", 0.25) == (0.25, "--near-tie-nats")


def div(**kw) -> Divergence:
    base = dict(position=3, reference_token=5, observed_token=7, threshold_nats=0.5,
                fails=True, **{"class": "hard"})
    return Divergence.model_validate({**base, **kw})


@pytest.mark.parametrize("kw, cls, fails, by", [
    (dict(margin_nats=0.1), "near_tie", False, "engine margin"),
    (dict(margin_nats=2.0), "hard", True, "engine margin"),
    (dict(margin_nats=0.1, observed_in_reference_top=False), "hard", True, "engine margin"),
    (dict(margin_nats=None), "unknown", True, "none"),
    # an informative golden model (float32: its gap against the threshold, both in its top-k)
    (dict(margin_nats=2.0, golden_gap_nats=0.1, reference_in_golden_top=True,
          observed_in_golden_top=True), "near_tie", False, "golden"),
    # an uninformative one decides nothing: the engine margin stands
    (dict(margin_nats=2.0, golden_gap_nats=0.1, reference_in_golden_top=True,
          observed_in_golden_top=True, golden_informative=False), "hard", True, "engine margin"),
    # the control reproduced it: a warning, whatever the margin
    (dict(margin_nats=2.0, attribution="also_in_control"), "hard", False, "control"),
    # both runs alone on an engine that repeats alone: hard, whatever came before
    (dict(margin_nats=0.1, attribution="also_in_control", solo_repeat="r1 vs r2"), "hard", True,
     "solo repeatability"),
    (dict(margin_nats=0.1, checks_failed=["degeneration"]), "near_tie", True,
     "engine margin; checks degeneration"),
])
def test_settle_follows_the_stated_order(kw, cls, fails, by):
    d = dv.settle(div(**kw))
    assert (d.cls, d.fails) == (cls, fails)
    assert d.decided_by.startswith(by)


def test_settle_strict_and_seeded_fail_a_near_tie():
    for kw in (dict(strict=True), dict(seeded=True)):
        d = dv.settle(div(margin_nats=0.1), **kw)
        assert d.cls == "near_tie" and d.fails and ";" in d.decided_by


def test_settle_control_on_half_precision_turns_a_golden_hard_into_a_near_tie():
    d = dv.settle(div(margin_nats=2.0, golden_gap_nats=3.0, reference_in_golden_top=True,
                      observed_in_golden_top=True, attribution="also_in_control"),
                  half_precision=True)
    assert d.cls == "near_tie" and not d.fails and d.reclassified


@pytest.mark.parametrize("margin, strict, temperature, fails", [
    (0.1, False, 0.0, False), (3.0, False, 0.0, True), (0.1, True, 0.0, True),
    (0.1, False, 0.8, True)])
def test_compare_outputs_under_a_rule(margin, strict, temperature, fails):
    ref, obs = [1, 2, 3, 4], [1, 2, 9, 4]
    rule = dv.Rule(near_tie_nats=0.5, strict=strict, serving_dtype="float32")
    assert dv.compare_outputs(ref, ref, rule, [margin] * 4) is None
    d = dv.compare_outputs(ref, obs, rule, [margin] * 4, temperature=temperature)
    assert d is not None and d.position == 2 and d.fails is fails


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
