"""pleharness.compare, the rule of a comparison (issue 50 item 3): a hash seen in one run only is
judged by the runs' own rule, rebuilt from their manifests (divergence.Rule.of_run)."""
from pleharness.compare import comparison_rule
from pleharness.divergence import DEFAULT_NEAR_TIE_NATS, Rule
from pleharness.manifest import Manifest, RunOptionsRecord


def run(**ro) -> Manifest:
    m = Manifest(run_id="x")
    m.run_options = RunOptionsRecord(**ro)
    return m


def test_heads_threshold_else_bases_and_strict_when_either_was():
    assert comparison_rule(run(near_tie_nats=0.3), run(near_tie_nats=0.7)) == Rule(0.7, False)
    assert comparison_rule(run(near_tie_nats=0.3, strict=True), run()) == Rule(0.3, True)
    assert comparison_rule(run(), run(strict=True, serving_dtype="float32")) == \
        Rule(DEFAULT_NEAR_TIE_NATS, True, "float32")
