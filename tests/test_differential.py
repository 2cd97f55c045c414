"""Differential evidence (pleharness.differential, issue 47 item 1): the control's answers to the
same solo greedy requests compared with the run's; unit tests, no engine."""
from pleharness.differential import compare_answers, solo_answers
from pleharness.manifest import (Manifest, PhaseRecord, ReferenceRecord, RequestRecord,
                                 RunOptionsRecord)
from pleharness.parity import token_hash
from pleharness.run.judge import finish_phase

GOOD = [10, 11, 12, 13, 14, 15]
BAD = [10, 11, 99, 13, 14, 15]


def run(rid, phase, conc, ids, prompt="p3", match=True, **kw):
    return RequestRecord(id=rid, scenario="boundary", phase=phase, concurrency=conc,
                         prompt_key=prompt, prompt_len=3, prompt_hash=prompt, max_tokens=6,
                         output_hash=token_hash(ids), output_ids=list(ids), match=match, **kw)


def ref(ids, rid, prompt="p3", margins=(3.0, 2.0, 4.75, 1.0, 1.0, 1.0)):
    return ReferenceRecord(prompt_key=prompt, prompt_hash=prompt, prompt_len=3, max_tokens=6,
                           output_hash=token_hash(ids), output_ids=list(ids),
                           margins=list(margins), top_ids=[[t, t + 1] for t in ids],
                           request_id=rid, cache_state="warm")


def manifest(rid, requests, references, strict=False):
    phases = [PhaseRecord(index=i, name=n, scenario="boundary", concurrency=1,
                          role="reference" if n == "references" else "load")
              for i, n in enumerate(sorted({r.phase for r in requests}))]
    m = Manifest(run_id=rid, phases=phases,
                 run_options=RunOptionsRecord(near_tie_nats=0.5, strict=strict))
    m.requests, m.references = list(requests), list(references)
    return m


def constant_defect(under=BAD):
    """Every solo run of the 3-token prompt gives one output under test, another in the
    control (GPU, issue 47 item 1: parity held, the run passed)."""
    main = manifest("m", [run("r1", "references", 1, under, match=None),
                          run("r2", "references", 1, under),
                          run("r3", "boundary-repeat", 1, under),
                          run("r4", "boundary-repeat", 1, GOOD, prompt="p4")],
                    [ref(under, "r2"), ref(GOOD, "r4", prompt="p4")])
    ctl = manifest("c", [run("c1", "references", 1, GOOD, match=None),
                         run("c2", "references", 1, GOOD),
                         run("c3", "boundary-repeat", 1, GOOD),
                         run("c4", "boundary-repeat", 1, GOOD, prompt="p4")],
                   [ref(GOOD, "c2"), ref(GOOD, "c4", prompt="p4")])
    return main, ctl


def test_a_defect_that_corrupts_every_run_alike_fails_by_the_controls_answer():
    main, ctl = constant_defect()
    for ph in main.phases:
        finish_phase(ph, [r for r in main.requests if r.phase == ph.name])
    assert all(ph.status == "pass" for ph in main.phases)  # every self-comparison holds
    counts = compare_answers(main, ctl)
    assert counts == {"compared": 2, "differ": 1, "hard": 1, "control_repeats_disagree": 0,
                      "without_tokens": 0, "envelope_nats": 0.0, "envelope_positions": 6,
                      "envelope_requests": 1, "threshold_nats": 0.5,
                      "envelope_by_margin": [{"margin_up_to": b, "drift_nats": 0.0,
                                              "positions": n}
                                             for b, n in ((1.0, 3), (2.0, 4), (4.0, 5),
                                                          (8.0, 6), (16.0, 6))]}
    r1 = main.requests[0]
    d = r1.differential
    assert d.position == 2 and d.cls == "hard" and d.fails and d.margin_nats == 4.75
    assert d.reference_token == 12 and d.observed_token == 99
    check = next(c for c in r1.checks if c.name == "control_answer")
    assert check.status == "fail" and "runs r1, r2, r3" in check.detail
    assert "control:c1, control:c2, control:c3" in check.detail
    assert r1.is_problem and main.summary.differential["hard"] == 1
    assert any(ph.status == "fail" for ph in main.phases)


def test_the_fixed_engine_answers_like_its_control():
    main, ctl = constant_defect(under=GOOD)
    assert compare_answers(main, ctl)["differ"] == 0
    assert not any(r.is_problem for r in main.requests)


def test_a_difference_at_a_near_tie_is_a_warning():
    main, ctl = constant_defect()
    ctl.references[0].margins = [3.0, 2.0, 0.2, 1.0, 1.0, 1.0]
    # each side's token among the other's top candidates, as a numerical flip has it
    ctl.references[0].top_ids[2], main.references[0].top_ids[2] = [12, 99], [99, 12]
    counts = compare_answers(main, ctl)
    assert counts["differ"] == 1 and counts["hard"] == 0
    assert main.requests[0].differential.cls == "near_tie"
    assert not main.requests[0].is_problem
    main.run_options.strict = True
    assert compare_answers(main, ctl)["hard"] == 1


def test_a_control_that_disagrees_with_itself_there_cannot_vouch():
    main, ctl = constant_defect()
    ctl.requests[2] = run("c3", "boundary-repeat", 1, [10, 11, 55, 1, 1, 1])
    counts = compare_answers(main, ctl)
    assert counts["hard"] == 0 and counts["control_repeats_disagree"] == 1
    assert "control's own solo runs disagree at position 2" in \
        main.requests[0].differential.decided_by
    # disagreeing only later than the difference: the control still vouches up to it
    main, ctl = constant_defect()
    ctl.requests[2] = run("c3", "boundary-repeat", 1, [10, 11, 12, 13, 77, 1])
    assert compare_answers(main, ctl)["hard"] == 1


def test_only_solo_greedy_compared_runs_are_answers():
    m = manifest("m", [run("a", "C4", 4, BAD), run("b", "boundary-repeat", 1, BAD,
                                                    temperature=1.0),
                       run("c", "edges", 1, BAD, match=None),
                       run("d", "boundary-repeat", 1, BAD, api="chat"),
                       run("e", "boundary-repeat", 1, BAD, n=2, choice=0)], [])
    assert solo_answers(m) == {}


def test_a_control_whose_margins_differ_decides_only_beyond_twice_that_difference():
    """An eager control (GPU run v): the configurations answer p4 alike, but their margins
    differ there by up to 2.5 nats; p3's answers split at a control margin of 4.75: within
    2 x 2.5, the engine's numerics (a warning). A control that computes the same function
    (margins alike) decides the same split as hard."""
    main, ctl = constant_defect()
    ctl.references[1].margins = [3.0, 2.0, 4.75, 1.0, 1.0, 3.5]  # p4: up to 2.5 nats apart
    counts = compare_answers(main, ctl)
    assert counts["envelope_nats"] == 2.5 and counts["threshold_nats"] == 5.0
    assert counts["differ"] == 1 and counts["hard"] == 0
    d = main.requests[0].differential
    assert d.cls == "near_tie" and d.threshold_nats == 5.0 and not d.fails
    from pleharness.differential import threshold_text
    assert "hard above 5 nats" in threshold_text(counts) and "up to 2.5 nats" in threshold_text(counts)
    # the run's --near-tie-nats, given explicitly, stays the threshold
    main, ctl = constant_defect()
    ctl.references[1].margins = [3.0, 2.0, 4.75, 1.0, 1.0, 3.5]
    main.run_options.near_tie_source = "--near-tie-nats"
    assert compare_answers(main, ctl)["hard"] == 1


def test_the_controls_answer_carries_the_threshold_its_replays_are_judged_by():
    """explain replays a differential case against the control's answer: at the threshold that
    judged the difference in the run (the configurations' envelope), not below it, in its own
    replays (explain_rule) and in the reproducer file's (ExpectedAnswer.threshold_nats)."""
    from pleharness.divergence import compare_outputs
    from pleharness.explain.replay import expected_rule
    from pleharness.run.judge import Rule
    from pleharness.scenarios.replay import ExpectedAnswer
    main, ctl = constant_defect()
    ctl.references[1].margins = [3.0, 2.0, 4.75, 1.0, 1.0, 3.5]  # envelope 2.5: threshold 5
    compare_answers(main, ctl)
    ans = main.requests[0].control_answer
    assert ans["threshold_nats"] == 5.0
    rule = expected_rule(Rule(0.5), ans)
    assert rule.near_tie_nats == 5.0 and expected_rule(Rule(0.5), None).near_tie_nats == 0.5
    assert expected_rule(Rule(6.0), ans).near_tie_nats == 6.0  # never lowered
    # the split at the control's margin 4.75: a warning at the run's threshold, hard below it
    assert not compare_outputs(GOOD, BAD, rule, ans["margins"]).fails
    assert compare_outputs(GOOD, BAD, Rule(0.5), ans["margins"]).fails
    e = ExpectedAnswer(ids=GOOD, margins=[3.0, 2.0, 4.75], threshold_nats=5.0)
    assert e.threshold_nats == 5.0 and ExpectedAnswer(ids=GOOD).threshold_nats is None


def alike(main, ctl, n, ctl_margin, drift):
    """``n`` more requests both configurations answer alike (GOOD), their control margins
    ``ctl_margin`` at every position and the margins under test ``drift`` nats off."""
    for i in range(n):
        p = f"q{ctl_margin}-{i}"
        main.requests.append(run(f"m{p}", "boundary-repeat", 1, GOOD, prompt=p))
        main.references.append(ref(GOOD, f"m{p}", prompt=p,
                                   margins=[ctl_margin + drift] * len(GOOD)))
        ctl.requests.append(run(f"c{p}", "boundary-repeat", 1, GOOD, prompt=p))
        ctl.references.append(ref(GOOD, f"c{p}", prompt=p, margins=[ctl_margin] * len(GOOD)))


def test_a_split_is_judged_by_the_margin_differences_at_comparable_margins():
    """GPU run w (PIECEWISE control, default suite): margins moved by up to 4.25 nats, but only
    at positions of 8-16 nats of margin; below 8 nats by at most 0.875. A split at a control
    margin of 4.75 (the planted defect's scale) is judged by the positions of up to 9.5 nats:
    hard; the overall envelope alone would call it the engine's numerics. Too few positions at
    comparable margins: the overall envelope decides."""
    from pleharness.differential import threshold_text
    main, ctl = constant_defect()
    alike(main, ctl, 4, 2.0, 0.5)    # 24 positions at margin 2, moved by 0.5
    alike(main, ctl, 1, 12.0, 4.25)  # 6 positions at margin 12, moved by 4.25
    counts = compare_answers(main, ctl)
    assert counts["envelope_nats"] == 4.25 and counts["threshold_nats"] == 8.5
    assert counts["hard"] == 1
    d = main.requests[0].differential
    assert d.fails and d.threshold_nats == 1.0 and d.margin_nats == 4.75
    bands = {b["margin_up_to"]: b for b in counts["envelope_by_margin"]}
    assert bands[4.0]["drift_nats"] == 0.5 and bands[16.0]["drift_nats"] == 4.25
    text = threshold_text(counts)
    assert "overall by up to 4.25 nats" in text and "at margins up to 8 nats by up to 0.5" in text
    # the same split with only the large-margin positions measured near it: numerics
    main, ctl = constant_defect()
    alike(main, ctl, 4, 6.0, 4.25)  # 24 positions at margin 6 (within 2 x 4.75), moved 4.25
    counts = compare_answers(main, ctl)
    assert counts["hard"] == 0 and main.requests[0].differential.threshold_nats == 8.5
    # too few comparable positions (the 6 of constant_defect's p4): the overall envelope
    main, ctl = constant_defect()
    alike(main, ctl, 3, 12.0, 4.25)
    assert compare_answers(main, ctl)["hard"] == 0
