"""pleharness.compare: the pre-merge diagnosis line, the --threshold grammar, and the rule of a
comparison (issue 50 item 3: a hash seen in one run only is judged by the runs' own rule,
rebuilt from their manifests, divergence.Rule.of_run). End-to-end compares of committed GPU runs
are in tests/test_gates_issue25.py."""
import pytest

from pleharness.compare import Comparison, comparison_rule, parse_threshold
from pleharness.divergence import DEFAULT_NEAR_TIE_NATS, Rule
from pleharness.errors import UsageError
from pleharness.manifest import Manifest, RunOptionsRecord


@pytest.mark.parametrize("base, head, gates, line", [
    ("pass", "pass", [], "HEAD passed and matches BASE"),
    ("fail", "pass", [], "HEAD passed and matches BASE; BASE failed its own run: fixed by this "
                         "change"),
    ("pass", "fail", ["HEAD verdict: fail"], "HEAD failed its own run, BASE passed: broken by "
                                             "this change"),
    ("fail", "fail", ["HEAD verdict: fail"], "HEAD failed its own run and BASE failed too (fail): "
                                             "broken before this change"),
    ("pass", "pass", ["token parity: 2 prompts differ", "--min-throughput-ratio C4: 0.7"],
     "HEAD passed its own run but missed --min-throughput-ratio, token parity against BASE; "
     "BASE passed its own run"),
    ("fail", "pass", ["token parity: 1 prompt differs"],
     "HEAD passed its own run but missed token parity against BASE; BASE failed its own run "
     "(fail), so BASE may be the one that is wrong"),
])
def test_the_diagnosis_names_whose_fault_it_is(base, head, gates, line):
    c = Comparison(base_verdict=base, head_verdict=head, gate_failures=list(gates))
    assert c.passed is (not gates)
    assert c.diagnosis == line


def test_an_incomplete_run_or_another_model_gives_no_verdict_of_its_own():
    c = Comparison(base_verdict="pass", head_verdict="fail", gate_failures=["HEAD verdict: x"],
                   incomplete=["HEAD (r1) did not complete (status 'interrupted')"])
    assert c.diagnosis.startswith("no verdict: HEAD (r1) did not complete")
    c = Comparison(base_verdict="pass", head_verdict="pass", gate_failures=["token parity: x"],
                   models_differ="BASE m1, HEAD m2")
    assert c.diagnosis.startswith("BASE and HEAD serve different models (BASE m1, HEAD m2)")
    # the models differing says nothing when every gate passed
    c.gate_failures = []
    assert c.diagnosis == "HEAD passed and matches BASE"


@pytest.mark.parametrize("text, parsed", [("C4>=62.985", ("C4", ">=", 62.985)),
                                          (" C1 < 10 ", ("C1", "<", 10.0)),
                                          ("C16>.5", ("C16", ">", 0.5))])
def test_thresholds_parse(text, parsed):
    assert parse_threshold(text) == parsed


@pytest.mark.parametrize("text", ["C0>=1", "c4>=1", "C4=>1", "C4>=", "C4>=-1", "4>=1", "C4>=1x"])
def test_a_bad_threshold_is_a_usage_error_naming_it(text):
    with pytest.raises(UsageError, match="--threshold"):
        parse_threshold(text)


def run(**ro) -> Manifest:
    m = Manifest(run_id="x")
    m.run_options = RunOptionsRecord(**ro)
    return m


def test_heads_threshold_else_bases_and_strict_when_either_was():
    assert comparison_rule(run(near_tie_nats=0.3), run(near_tie_nats=0.7)) == Rule(0.7, False)
    assert comparison_rule(run(near_tie_nats=0.3, strict=True), run()) == Rule(0.3, True)
    assert comparison_rule(run(), run(strict=True, serving_dtype="float32")) == \
        Rule(DEFAULT_NEAR_TIE_NATS, True, "float32")
