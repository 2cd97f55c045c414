"""Issue 35 item 6: the logprob reported for each emitted token equals the solo run's within the
dtype's near-tie threshold (check ``logprob_parity``, applied by the judge to every compared
greedy request with logprobs). Unit tests of the rule, then on the real CPU engine (session
engine: ngram speculative decoding k = 3) a double that lowers the logprobs of answers under
load by 1 nat, self-consistently, fails exactly those requests by this rule."""
from types import SimpleNamespace

import pytest

from conftest import load_json, run_cli
from doubles import FaultProxy
from pleharness.checks.logprob_parity import logprob_parity
from pleharness.engine.completion import Completion
from pleharness.faults.scores import LogprobsOffUnderLoad

GREEDY = SimpleNamespace(temperature=0.0)


def ref(ids, lps, source="solo"):
    return SimpleNamespace(output_ids=ids, token_logprobs=lps, source=source)


def comp(ids, lps):
    return Completion(token_ids=ids, token_logprobs=lps)


def test_logprobs_within_the_threshold_pass_and_beyond_it_fail():
    r = ref([5, 6, 7], [-0.1, -0.2, -0.3])
    ok = logprob_parity(GREEDY, comp([5, 6, 7], [-0.1, -0.205, -0.3]), r, 0.01)
    assert ok.status == "pass" and "3 emitted-token logprobs within 0.01 nats" in ok.detail
    bad = logprob_parity(GREEDY, comp([5, 6, 7], [-0.1, -1.2, -1.3]), r, 0.5)
    assert bad.status == "fail"
    assert "2 of 3 emitted-token logprobs differ" in bad.detail
    assert "first at output position 1 (token 6): -1.2000 vs -0.2000" in bad.detail


def test_only_positions_before_the_first_divergence_count():
    r = ref([5, 6, 7], [-0.1, -0.2, -0.3])
    res = logprob_parity(GREEDY, comp([5, 9, 7], [-0.1, -3.0, -3.0]), r, 0.01)
    assert res.status == "pass" and res.detail.startswith("1 emitted-token logprobs")


def test_not_applied_where_the_rule_does_not_hold():
    r = ref([5], [-0.1])
    sampled = SimpleNamespace(temperature=1.0, seed=None)  # unseeded: no reference to equal
    assert logprob_parity(sampled, comp([5], [-3.0]), r, 0.01) is None
    assert logprob_parity(GREEDY, comp([5], None), r, 0.01) is None
    assert logprob_parity(GREEDY, comp([5], [-3.0]), ref([5], None), 0.01) is None
    assert logprob_parity(GREEDY, comp([5], [-3.0]), ref([5], [-0.1], "golden"), 0.01) is None
    failed = comp([5], [-3.0])
    failed.error = "http"
    assert logprob_parity(GREEDY, failed, r, 0.01) is None


@pytest.mark.engine
def test_logprobs_off_under_load_fail_by_logprob_parity(cpu_engine, tmp_path):
    fault = LogprobsOffUnderLoad()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r = run_cli("stress", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id",
                    "lp", "--no-engine-probe", "--block-size", "32", "--chunk-size", "256",
                    "--num-speculative-tokens", "3", "--scenario", "transitions",
                    "--ladder", "4,1", "--repeats", "1")  # a C4 phase: greedy beside others
    m = load_json(tmp_path / "lp" / "manifest.json")
    assert fault.hits, "no greedy request with logprobs arrived beside another"
    assert r.returncode == 1 and m["verdict"] == "fail", (r.stdout + r.stderr)[-3000:]
    bad = [q for q in m["requests"] if any(c["status"] == "fail" for c in q["checks"])]
    assert bad and all(q["match"] is not False for q in bad)  # the tokens are right
    for q in bad:
        (lp,) = [c for c in q["checks"] if c["name"] == "logprob_parity"]
        assert lp["status"] == "fail" and "by more than 0.01 nats" in lp["detail"]
        assert [c["name"] for c in q["checks"] if c["status"] == "fail"] == ["logprob_parity"]
    judged = [c for q in m["requests"] for c in q["checks"] if c["name"] == "logprob_parity"]
    assert any(c["status"] == "pass" for c in judged)  # the requests alone are untouched


def test_a_seeded_sample_reports_its_solo_runs_logprobs():
    """Issue 52: a seeded sample (a choice of a seeded request for n choices, against the n = 1
    request of its derived seed) is judged where its IDs equal the reference's."""
    seeded = SimpleNamespace(temperature=1.0, seed=7)
    r = ref([5, 6], [-0.7, -1.2])
    assert logprob_parity(seeded, comp([5, 6], [-0.7, -1.2]), r, 0.01).status == "pass"
    bad = logprob_parity(seeded, comp([5, 6], [-0.7, -2.5]), r, 0.01)
    assert bad.status == "fail" and "first at output position 1" in bad.detail
    assert logprob_parity(seeded, comp([5, 8], [-0.7, -2.5]), r, 0.01).status == "pass"
