"""The clean-engine false alarms GPU run u found on a bf16 mixture-of-experts engine (issue 47,
docs/gpu-runs/README.md), each as a unit test on constructed evidence: what the fix accepts, and
that the rule still rejects what it is for."""
from pleharness.checks import REGISTRY
from pleharness.checks.sampled_degeneration import check as sampled_degeneration
from pleharness.differential import _drift, compare_answers
from pleharness.engine.completion import Completion
from pleharness.engine.facts import EngineFacts
from pleharness.manifest import ReferenceRecord
from pleharness.parity import token_hash
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.run.sides import _margins_at
from pleharness.scenarios.sampled_stats import degeneration_row

from test_differential import GOOD, constant_defect

DEGEN = REGISTRY["degeneration"]


class Ctx:
    def __init__(self, ref=None, role="load", key=None):
        self.facts = EngineFacts({"vocab_size": 900, "eos_token_id": 1}, {})
        self.phase_role = role
        self.golden, self.golden_error, self.client = None, None, None
        self.references = {key: ref} if ref is not None else {}


def spec(**kw):
    return RequestSpec(Prompt("p", (16, 17, 18)), 24, **kw)


def test_the_engines_own_cold_output_is_model_behaviour_not_degeneration():
    """The cold solo run and the load runs repeat one token 20 times on the branch a 0.125-nat
    flip sent them down; the warm reference took the other branch: a note, not a failure. The
    same pattern that no solo run of the engine gave still fails."""
    s = spec()
    looped = [663] + [188] * 20 + [5, 6, 7]
    warm = [663, 161] + list(range(200, 222))
    ref = ReferenceRecord(prompt_key="p", prompt_hash=s.prompt.hash, prompt_len=3,
                          max_tokens=24, output_hash=token_hash(warm), output_ids=warm,
                          cold_output_hash=token_hash(looped), cache_state="warm")
    out = DEGEN(Ctx(ref, key=s.ref_key), s, Completion(token_ids=looped), {})
    assert out.status == "note" and "own first solo run" in out.detail
    other = [663] + [189] * 20 + [5, 6, 7]
    assert DEGEN(Ctx(ref, key=s.ref_key), s, Completion(token_ids=other), {}).status == "fail"


def test_an_unseeded_sample_is_left_to_sampled_degeneration_but_a_zero_run_still_fails():
    s = spec(temperature=1.0)
    s.checks["sampled_degeneration"] = {}
    out = DEGEN(Ctx(), s, Completion(token_ids=[331] * 16), {})
    assert out.status == "skip" and "sampled_degeneration" in out.detail
    assert DEGEN(Ctx(), s, Completion(token_ids=[5] + [0] * 10), {}).status == "fail"


def test_sampled_degeneration_judges_a_prompt_the_model_loops_on_by_rate():
    """GPU run v (H200): 3 of the 4 load samples of one chat prompt repeated token 331 9-15
    times where its 2 solo samples did not; the run beside it, same engine, saw none. Each such
    sample is a warning on its request; the rate over the prompt's samples is not significant
    (p = 0.2), so no failure. The same pattern on every load sample of nine prompts is."""
    c = Completion(token_ids=[9] * 4 + [331] * 12, text="")
    out = sampled_degeneration(Ctx(), spec(temperature=1.0), c, {})
    assert out.status == "warn" and "run of 12 x token 331" in out.detail
    assert "judged by rate" in out.detail
    one = {("chat-len20", 16): {"solo": [2, 0], "load": [4, 3], "runs": [
        ("r00243", "run of 9 x token 331 at position 7")]}}
    row = degeneration_row(one, 0.001 / 4)
    assert row.verdict == "pass" and row.p_value == 0.2 and "3/4 samples under load" in row.detail
    many = {(f"len{i}", 16): {"solo": [4, 0], "load": [4, 4], "runs": [(f"r{i}", "run")]}
            for i in range(9)}
    row = degeneration_row(many, 0.001 / 4)
    assert row.verdict == "fail" and row.p_value < 1e-15 and "r0 (run)" in row.detail
    # no prompt with samples on both sides: nothing to judge by
    assert degeneration_row({("x", 16): {"solo": [0, 0], "load": [4, 4], "runs": []}},
                            0.001) is None


def test_the_differential_threshold_follows_the_requests_own_drift():
    """Without CUDA graphs the engine's answer split at a control margin of 5.6 nats after the
    same tokens' logprobs had drifted by 3 nats: the engine's numerics; a split at the same
    margin with no drift before it stays hard."""
    main, ctl = constant_defect()
    ctl.references[0].margins = [3.0, 2.0, 5.6, 1.0, 1.0, 1.0]
    main.references[0].token_logprobs = [-0.1, -3.2, -1.0, -1.0, -1.0, -1.0]
    ctl.references[0].token_logprobs = [-0.1, -0.2, -0.4, -1.0, -1.0, -1.0]
    assert _drift(ctl.references[0], main.references[0], 2) == 3.0
    assert compare_answers(main, ctl)["hard"] == 0
    assert main.requests[0].differential.threshold_nats == 6.0
    main, ctl = constant_defect()
    ctl.references[0].margins = [3.0, 2.0, 5.6, 1.0, 1.0, 1.0]
    main.references[0].token_logprobs = ctl.references[0].token_logprobs = \
        [-0.1, -0.2, -0.4, -1.0, -1.0, -1.0]
    assert compare_answers(main, ctl)["hard"] == 1


def test_a_differential_near_tie_needs_no_top2_membership():
    """A control margin below the threshold is a near tie even where the other side's token is
    third in a two-candidate list (GPU run u: 0.0 and 0.375 nats called hard)."""
    main, ctl = constant_defect()
    ctl.references[0].margins = [3.0, 2.0, 0.375, 1.0, 1.0, 1.0]
    ctl.references[0].top_ids[2] = [12, 13]  # the observed 99 is not among them
    assert compare_answers(main, ctl)["hard"] == 0


def test_a_run_judged_against_the_majority_keeps_the_margin_of_the_same_prefix():
    ref = ReferenceRecord(prompt_key="p", prompt_hash="h", prompt_len=3, max_tokens=6,
                          output_hash="x", output_ids=[10, 11, 12, 99, 1, 1],
                          margins=[3.0, 2.0, 0.25, 0.1, 1.0, 1.0])
    assert _margins_at(ref, [10, 11, 12, 13, 14, 15], 2) == ref.margins
    assert _margins_at(ref, [10, 50, 12, 13, 14, 15], 2) is None  # another prefix
    assert _margins_at(ref, GOOD, None) is None


def test_a_relative_check_on_the_engines_own_cold_output_is_a_note():
    s = spec()
    cold, warm = [5, 6, 7], [1, 2, 3]
    ref = ReferenceRecord(prompt_key="p", prompt_hash=s.prompt.hash, prompt_len=3,
                          max_tokens=24, output_hash=token_hash(warm), output_ids=warm,
                          cold_output_hash=token_hash(cold), cache_state="warm")
    check = REGISTRY["expected_text"]
    out = check(Ctx(ref, key=s.ref_key), s, Completion(token_ids=cold, text=" #"),
                {"regex": r"^\s*OK"})
    assert out.status == "note" and "own first solo run" in out.detail
    # another output, not the engine's own solo one: judged by the warm reference as before
    out = check(Ctx(ref, key=s.ref_key), s, Completion(token_ids=[8, 8, 8], text=" #"),
                {"regex": r"^\s*OK"})
    assert out.status != "note" or "own first solo run" not in out.detail
