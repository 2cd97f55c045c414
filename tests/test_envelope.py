"""The run's numerics envelope (pleharness.envelope, issue 47 item 3): measured where the defect
under test is not, and every tolerance judged again at it; unit tests, no engine."""
import pytest

from pleharness.checks.logprob_parity import judge, measure
from pleharness.checks.prompt_logprobs import carries_probability, measure_parity
from pleharness.engine.completion import Completion
from pleharness.envelope import apply, measure as measure_envelope, tolerances
from pleharness.errors import UsageError
from pleharness.manifest import (CheckResult, Divergence, Manifest, PhaseRecord, ReferenceRecord,
                                 RequestRecord, RunOptionsRecord, ScoreDiffs)
from pleharness.request import RequestSpec
from pleharness.prompts import Prompt


def rec(i, phase="C4", conc=4, diffs=None, pdiffs=None, match=True, **kw):
    r = RequestRecord(id=f"r{i}", scenario="s", phase=phase, concurrency=conc, prompt_key="p",
                      prompt_len=8, prompt_hash=f"h{i}", max_tokens=8, output_hash="o",
                      match=match, **kw)
    if diffs is not None:
        r.logprob_diffs = diffs
        r.checks.append(judge(diffs, diffs.bound_nats, "the serving dtype's bound"))
    if pdiffs is not None:
        r.prompt_logprob_diffs = pdiffs
    return r


def sd(max_nats, over=(), bound=0.5, compared=10):
    return ScoreDiffs(compared=compared, max_nats=max_nats, bound_nats=bound, over=list(over))


def manifest(requests, **ro):
    m = Manifest(run_id="m", phases=[PhaseRecord(index=0, name="C4", scenario="s",
                                                 concurrency=4)],
                 run_options=RunOptionsRecord(near_tie_nats=0.5,
                                              near_tie_source="serving dtype bfloat16",
                                              serving_dtype="bfloat16", **ro))
    m.requests = list(requests)
    return m


def test_measure_keeps_the_positions_over_the_bound_and_judges_again():
    spec = RequestSpec(Prompt(key="p", ids=[1, 2, 3]), 4)
    ref = ReferenceRecord(prompt_key="p", prompt_hash="h", prompt_len=3, max_tokens=4,
                          output_hash="x", output_ids=[5, 6, 7, 8],
                          token_logprobs=[-0.1, -0.2, -0.3, -0.4])
    c = Completion(token_ids=[5, 6, 7, 9], token_logprobs=[-0.1, -1.02, -0.35, -5.0])
    d = measure(spec, c, ref, 0.5)
    # position 3 is past the first divergent token: not compared
    assert d.compared == 3 and d.over == [(1, -1.02, -0.2)] and d.max_nats == pytest.approx(0.82)
    assert judge(d, 0.5, "the serving dtype's bound").status == "fail"
    ok = judge(d, 1.64, "2 x the measured logprob envelope 0.82 nats")
    assert ok.status == "pass" and "within 1.64 nats" in ok.detail and "0.82" in ok.detail


def test_a_far_tail_prompt_position_is_no_evidence():
    """-40 vs -37 nats where the prompt token is outside both sides' top candidates (GPU, issue
    47: position 515 of a 549-token prompt) is not compared; inside the top candidates it is."""
    def comp(v):
        return Completion(token_ids=[1], prompt_logprobs=[None, {9: v, 4: -0.1, 5: -0.2},
                                                          {3: -0.3, 4: -1.0}],
                          prompt_ranks=[None, {9: 400, 4: 1, 5: 2}, {3: 1, 4: 2}])
    got, ref = comp(-40.28), comp(-37.11)
    ref.prompt_logprobs[2] = {3: -0.45, 4: -1.0}
    assert not carries_probability(got, 1, 9, 2) and carries_probability(got, 2, 3, 2)
    d = measure_parity(got, ref, [0, 9, 3], 0.5, 2)
    assert d.tail == 1 and d.compared == 1 and d.max_nats == pytest.approx(0.15)
    # a side that ranks it among its top candidates makes it evidence again
    ref.prompt_ranks[1] = {9: 1, 4: 2, 5: 3}
    assert measure_parity(got, ref, [0, 9, 3], 0.5, 2).tail == 0
    # without k every scored position counts (the old rule): the tail fails
    assert measure_parity(got, ref, [0, 9, 3], 0.5, None).over[0][0] == 1


def test_tolerances_take_the_larger_of_the_dtype_bound_and_the_envelope():
    t = tolerances({"logprob_nats": 0.82, "flip_margin_nats": 2.125}, 0.5)
    assert t["logprob_tolerance_nats"] == pytest.approx(1.64)
    assert t["near_tie_nats"] == pytest.approx(2.125) and "control reproduced" in \
        t["near_tie_source"]
    t = tolerances({"logprob_nats": 0.1, "flip_margin_nats": None}, 0.5)
    assert t["logprob_tolerance_nats"] == 0.5 and t["near_tie_nats"] == 0.5
    assert t["logprob_tolerance_source"] == "the serving dtype's bound"


def test_the_envelope_comes_from_the_control_never_from_the_run_under_test():
    """A defect under test that moves logprobs by 3 nats must not widen its own tolerance: the
    envelope is the control run's; without a control (and no --numerics-from) nothing is
    measured and the dtype bound stays."""
    main = manifest([rec(1, diffs=sd(3.0, [(2, -3.1, -0.1)]))])
    control = manifest([rec(1, diffs=sd(0.3)), rec(2, diffs=sd(0.4), pdiffs=sd(0.45))])
    env = apply(main, control)
    assert env["measured"]["logprob_nats"] == pytest.approx(0.45)
    assert env["measured"]["logprob_requests"] == 2 and env["measured"]["logprob_positions"] == 30
    assert env["logprob_tolerance_nats"] == pytest.approx(0.9)
    assert main.requests[0].checks[-1].status == "fail"
    alone = manifest([rec(1, diffs=sd(3.0, [(2, -3.1, -0.1)]))])
    env = apply(alone, None)
    assert env["measured"]["logprob_nats"] is None and "not measured" in \
        env["measured"]["logprob_source"]
    assert env["logprob_tolerance_nats"] == 0.5 and alone.requests[0].checks[-1].status == "fail"


def test_a_noisy_clean_run_passes_at_its_control_envelope():
    """GPU, issue 47 item 2b: one emitted token's logprob under load -0.98 vs -0.16 alone on a
    clean bf16 MoE engine; its control moves logprobs by as much: a pass, and the phase too."""
    main = manifest([rec(1, diffs=sd(0.82, [(4, -0.98, -0.16)]))])
    main.requests[0].checks.append(CheckResult(name="parity", status="pass"))
    from pleharness.run.judge import refinish
    refinish(main, {"C4"})
    assert main.phases[0].status == "fail"
    control = manifest([rec(1, diffs=sd(0.7, [(1, -0.8, -0.1)]))])
    apply(main, control)
    lp = next(c for c in main.requests[0].checks if c.name == "logprob_parity")
    assert lp.status == "pass" and "1.4 nats" in lp.detail
    assert main.phases[0].status == "pass"
    assert main.run_options.numerics_envelope["measured"]["logprob_source"].startswith(
        "the control run")


def flip(i, margin, attribution):
    r = rec(i, match=False)
    r.divergence = Divergence.model_validate({
        "class": "hard" if margin >= 0.5 else "near_tie", "fails": margin >= 0.5,
        "position": 3, "margin_nats": margin, "threshold_nats": 0.5,
        "attribution": attribution, "decided_by": "engine margin"})
    r.checks.append(CheckResult(name="parity", status="fail" if margin >= 0.5 else "warn",
                                detail="x"))
    return r


def test_a_flip_inside_the_flips_the_control_reproduced_is_a_near_tie():
    """GPU, issue 47 item 2a: a C4 flip at 0.875 nats only under test, while the control
    reproduced flips at margins up to 2.125 nats: a near tie, the run passes; a flip beyond the
    envelope stays hard."""
    main = manifest([flip(1, 0.875, "only_under_test"), flip(2, 2.125, "also_in_control")])
    main.requests[1].divergence.fails = False
    control = manifest([])
    env = apply(main, control)
    assert env["near_tie_nats"] == pytest.approx(2.125)
    d = main.requests[0].divergence
    assert d.cls == "near_tie" and not d.fails and d.threshold_nats == pytest.approx(2.125)
    assert main.requests[0].checks[-1].status == "warn"
    assert main.run_options.near_tie_nats == pytest.approx(2.125)
    far = manifest([flip(1, 4.75, "only_under_test"), flip(2, 2.125, "also_in_control")])
    apply(far, manifest([]))
    assert far.requests[0].divergence.fails and far.requests[0].divergence.cls == "hard"


def test_an_explicit_near_tie_threshold_is_kept():
    main = manifest([flip(1, 0.875, "only_under_test"), flip(2, 2.125, "also_in_control")])
    main.run_options.near_tie_source = "--near-tie-nats"
    env = apply(main, manifest([]))
    assert env["near_tie_nats"] == 0.5 and main.requests[0].divergence.fails


def test_numerics_from_a_clean_run_and_self(tmp_path):
    from pleharness.manifest import write_manifest
    clean = manifest([rec(1, diffs=sd(0.6))])
    apply(clean, None, "self")
    assert clean.run_options.numerics_envelope["measured"]["logprob_nats"] == 0.6
    write_manifest(tmp_path / "manifest.json", clean)
    faulty = manifest([rec(1, diffs=sd(3.0, [(2, -3.1, -0.1)]))])
    env = apply(faulty, None, str(tmp_path))
    assert env["logprob_tolerance_nats"] == pytest.approx(1.2)
    assert faulty.requests[0].checks[-1].status == "fail"
    assert "--numerics-from" in env["measured"]["logprob_source"]
    unmeasured = manifest([])
    apply(unmeasured, None)
    write_manifest(tmp_path / "u.json", unmeasured)
    with pytest.raises(UsageError, match="measured no numerics envelope"):
        measure_envelope(faulty, None, str(tmp_path / "u.json"))
