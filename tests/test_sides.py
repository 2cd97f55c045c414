"""Which side of a divergence is wrong (issue 23 item 1) and the half-precision golden tolerance
(issue 24 item 3), on constructed evidence (no engine)."""
import pytest

from pleharness.attribution import attribute
from pleharness.divergence import analyse, golden_side, majority_side, noise_floor, solo_gaps
from pleharness.manifest import Manifest, PhaseRecord, ReferenceRecord, RequestRecord
from pleharness.parity import token_hash
from pleharness.render import to_junit
from pleharness.causes import causes, headline
from pleharness.run.context import RunContext, RunOptions
from pleharness.run.judge import finish_phase
from pleharness.run.sides import judge_sides


def gold(lp_ref, lp_obs, ref=60, obs=120, top=None):
    return {"logprobs": {ref: lp_ref, obs: lp_obs},
            "top": top if top is not None else sorted([(ref, lp_ref), (obs, lp_obs)],
                                                      key=lambda t: -t[1])}


def test_golden_side_names_the_token_the_golden_model_finds_implausible():
    side, why = golden_side(60, 120, gold(-3.46, -0.06), 0.01)
    assert side == "reference" and "-3.46" in why and "-0.06" in why
    assert golden_side(60, 120, gold(-0.06, -3.46), 0.01)[0] == "load"
    # within the tolerance both are plausible: no side is blamed
    assert golden_side(60, 120, gold(-0.70, -0.72), 0.5)[0] == "undecided"
    # the better token is outside the golden top-k too: the golden model vouches for neither
    assert golden_side(60, 120, gold(-9.0, -7.0, top=[(5, -0.01)]), 0.01)[0] == "undecided"
    assert golden_side(60, None, gold(-1, -2), 0.01)[0] == "undecided"


def test_majority_side_needs_two_runs_agreeing():
    assert majority_side("A", "B", {"A": ["r1"], "B": ["r2", "r3"]})[0] == "reference"
    assert majority_side("A", "B", {"A": ["r1", "r4", "r5"], "B": ["r2"]})[0] == "load"
    assert majority_side("A", "B", {"A": ["r1"], "B": ["r2"]})[0] == "undecided"
    assert majority_side("A", "B", {"A": ["r1", "r3"], "B": ["r2", "r4"]})[0] == "undecided"


GOOD, BAD, OTHER = [5, 6, 7, 8], [5, 9, 7, 8], [5, 6, 7, 1]


def rec(i, phase, out, ref_out, ph_len=4):
    r = RequestRecord(id=f"r{i:05d}", scenario="s", phase=phase, concurrency=1 if phase == "refs" else 2,
                      prompt_key="p0", prompt_len=ph_len, prompt_hash="ph", max_tokens=4,
                      output_hash=token_hash(out), output_len=len(out))
    if ref_out is not None:
        r.reference_hash = token_hash(ref_out)
        r.match = out == ref_out
        if not r.match:
            from pleharness.divergence import first_divergence
            from pleharness.manifest import CheckResult, SideEvidence
            r.first_divergence = first_divergence(ref_out, out)
            r.output_ids = list(out)
            r.divergence = analyse(ref_out, out, r.first_divergence, None, 0.01)
            r.divergence.side_evidence = SideEvidence(reference_run="r00001",
                                                      reference_source="solo",
                                                      observed_run=r.id, observed_role="load")
            r.checks.append(CheckResult(name="parity", status="fail", detail="unknown at ..."))
    return r


def corrupt_first_run_manifest(second_solo=True):
    """A prompt whose first (cold, kept) reference run r00001 is corrupt: its second run alone
    (r00006, ``second_solo``) and three load runs agree with each other, a fourth load run
    differs from them too."""
    m = Manifest(run_id="t")
    m.phases = [PhaseRecord(index=0, name="refs", scenario="s", concurrency=1, role="reference"),
                PhaseRecord(index=1, name="load", scenario="s", concurrency=2)]
    m.references = [ReferenceRecord(prompt_key="p0", prompt_hash="ph", prompt_len=4, max_tokens=4,
                                    output_hash=token_hash(BAD), output_ids=BAD,
                                    request_id="r00001")]
    m.requests = [rec(1, "refs", BAD, None)] + [rec(i, "load", GOOD, BAD) for i in (2, 3, 4)] \
        + [rec(5, "load", OTHER, BAD)] + ([rec(6, "refs", GOOD, None)] if second_solo else [])
    for ph in m.phases:
        finish_phase(ph, [r for r in m.requests if r.phase == ph.name])
    return m


def test_majority_names_the_corrupt_reference_and_rejudges_later_runs():
    m = corrupt_first_run_manifest()
    counts = judge_sides(m)
    assert counts == {"reference": 3, "load": 1, "undecided": 0}
    ref_run = m.requests[0]
    assert [c.name for c in ref_run.failed_checks] == ["corrupt_reference"]
    assert "the reference run r00001 of prompt p0 is the outlier" in ref_run.failed_checks[0].detail
    assert "1 of 6 runs" in ref_run.failed_checks[0].detail
    for r in m.requests[1:4]:  # judged against the majority output: they match it
        assert r.match is True and r.reference_hash == token_hash(GOOD)
        assert r.divergence.corrupt_side == "reference" and not r.divergence.fails
        assert "majority output" in r.divergence.side_evidence.judged_against
        assert not r.is_problem
    odd = m.requests[4]  # differs from the majority too, at position 3 (not 1)
    assert odd.match is False and odd.is_problem and odd.first_divergence == 3
    assert odd.divergence.corrupt_side == "load" and odd.divergence.reference_token == 8
    (new,) = m.references
    assert new.source == "majority" and new.output_ids == GOOD and new.replaces.startswith("r00001")
    assert m.phases[0].status == "fail" and m.phases[1].status == "fail"
    (cr,) = m.summary.corrupt_references
    assert cr["reference_run"] == "r00001" and cr["method"] == "majority"
    # every report names the corrupt request first
    assert causes(m)[0].startswith("corrupt reference: the reference run r00001 of prompt p0")
    assert headline(m).startswith("corrupt reference: the reference run r00001")
    assert 'message="r00001 p0: corrupt reference: the reference run r00001' in to_junit(m)


def test_a_run_rejudged_equal_to_the_replacing_output_keeps_its_pass_when_settled_again():
    """A run judged again equal to the output that replaced a corrupt reference passes
    (:func:`pleharness.run.judge.rejudge`); its divergence from the corrupt reference stays as
    evidence. A pass that settles divergences again afterwards (the control's attribution after
    the float32 golden path replaced a reference during the suite) must not turn that evidence
    back into a failing parity check (it did: the settlement re-derived "fail" from it)."""
    for twin_out, attribution in ((GOOD, "also_in_control"), (OTHER, "only_under_test")):
        m = corrupt_first_run_manifest()
        judge_sides(m)
        control = Manifest(run_id="c")
        control.requests = [rec(i, "load", twin_out, twin_out) for i in (2, 3, 4)]
        attribute(m, control)
        for r in m.requests[1:4]:
            assert r.match is True and r.divergence.attribution == attribution
            assert not r.divergence.fails and not r.is_problem
            assert [c.status for c in r.checks if c.name == "parity"] == ["pass"]
        # the odd run (OTHER) is judged as before: it fails unless a control twin gave OTHER too
        assert m.requests[4].is_problem is (twin_out != OTHER)


def test_crowded_runs_alike_never_outvote_a_reference_that_ran_alone():
    """A batching defect corrupts every crowded run of a prompt alike: without a run alone or a
    control twin behind their output, their number decides nothing (it named the clean solo
    reference corrupt, and the corrupted runs "matched" the output that replaced it)."""
    m = corrupt_first_run_manifest(second_solo=False)
    m.requests.append(rec(6, "refs", BAD, None))  # the reference repeats alone
    counts = judge_sides(m)
    assert counts == {"reference": 0, "load": 1, "undecided": 3}, counts
    assert not m.summary.corrupt_references and m.references[0].request_id == "r00001"
    for r in m.requests[1:4]:  # still judged against the solo reference: still failing
        d = r.divergence
        assert r.match is False and r.is_problem and d.corrupt_side == "undecided"
        assert "split by load" in d.side_evidence.detail and d.side_evidence.votes_observed == 3
    assert not m.requests[0].failed_checks
    # a run alone behind the crowded output, or a control twin, makes it a vote again
    m = corrupt_first_run_manifest(second_solo=False)
    m.requests[3].concurrency = 1
    assert judge_sides(m)["reference"] == 3
    m = corrupt_first_run_manifest(second_solo=False)
    judge_sides(m, Manifest(run_id="c", requests=[rec(7, "load", GOOD, GOOD)]))
    assert m.requests[1].divergence.corrupt_side == "reference"


def test_majority_counts_control_twins_and_stays_undecided_without_a_majority():
    m = corrupt_first_run_manifest()
    m.requests = m.requests[:2]  # one reference run, one load run: one against one
    judge_sides(m)
    d = m.requests[1].divergence
    assert d.corrupt_side == "undecided" and m.requests[1].is_problem
    m = corrupt_first_run_manifest()
    m.requests = m.requests[:2]
    control = Manifest(run_id="t-control", requests=[rec(7, "load", GOOD, GOOD)])
    judge_sides(m, control)  # the control twin sides with the load run
    d = m.requests[1].divergence
    assert d.corrupt_side == "reference" and d.side_evidence.votes_observed == 2
    assert "control:r00007" in d.side_evidence.voters[token_hash(GOOD)[:12]]


# -- half-precision golden tolerance (issue 24 item 3) ------------------------------------------

def test_noise_floor_is_a_high_quantile_of_the_solo_golden_gaps():
    gaps = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 9.0]  # one corrupt-looking outlier
    tol, info = noise_floor(gaps, "bfloat16", 0.5)
    assert tol == pytest.approx(9.0) and info["samples"] == 10  # nearest rank of 0.95 of 10: the 10th
    tol, info = noise_floor(gaps * 2, "bfloat16", 0.5, quantile=0.9)
    assert tol == pytest.approx(1.8)
    tol, info = noise_floor([0.1] * 10, "bf16", 0.5)  # below the dtype threshold: the threshold
    assert tol == 0.5 and "threshold, which applies" in info["source"]
    tol, info = noise_floor([3.0, 3.0], "bfloat16", 0.5)  # too few samples
    assert tol == 0.5 and "fewer than 5" in info["source"]
    tol, info = noise_floor([3.0] * 10, "float32", 0.01)  # float32: unchanged
    assert tol == 0.01 and "not half precision" in info["source"]
    assert solo_gaps([(-1.0, 7, -0.5), (-0.1, 3, -0.1)], [4, 3]) == [0.5]


REF, OBS = [1, 2, 3, 4], [1, 2, 9, 4]


def test_bf16_gap_inside_the_floor_is_a_near_tie_beyond_it_hard_float32_unchanged():
    g = {"logprobs": {3: -0.5, 9: -2.0}, "top": [(3, -0.5), (5, -1.0), (9, -2.0)]}
    d = analyse(REF, OBS, 2, None, 0.5, golden=g, tolerance=2.0)
    assert d.cls == "near_tie" and not d.fails and d.golden_tolerance_nats == 2.0
    d = analyse(REF, OBS, 2, None, 0.5, golden=g, tolerance=1.0)
    assert d.cls == "hard" and d.fails
    # issue 32: within the floor, but the observed token is outside the golden top-k (a flat
    # random-weight model, where every gap is tiny): the informative golden model vouches for
    # one side only, so it is no numerical flip
    g = {"logprobs": {3: -0.5, 9: -0.6}, "top": [(3, -0.5), (5, -0.55)]}
    d = analyse(REF, OBS, 2, None, 0.5, golden=g, tolerance=2.0)
    assert d.cls == "hard" and d.fails
    assert golden_side(3, 9, g, 2.0)[0] == "load"
    d = analyse(REF, OBS, 2, None, 0.5, golden=g)  # float32 rule: 9 outside the top-k: hard
    assert d.cls == "hard" and d.golden_tolerance_nats is None


class FakeGolden:
    """The solo references' teacher-forced golden view: each flips at one position by ``gap``."""

    def __init__(self, gaps):
        self.gaps = list(gaps)

    def force(self, prompt, out):
        gap = self.gaps.pop(0)
        return [(-gap - 0.1, 999, -0.1)] + [(-0.1, t, -0.1) for t in out[1:]]


def bf16_context(tmp_path, dtype, gaps, div_gap):
    m = Manifest(run_id="bf")
    ctx = RunContext(None, m, tmp_path / "manifest.json", None, None,
                     options=RunOptions(serving_dtype=dtype, near_tie_nats=0.5),
                     golden=FakeGolden(gaps))
    # one solo run of each of len(gaps) prompts (the floor counts each prompt once)
    ctx.judge._solo_runs = [
        (RequestRecord(id=f"s{i:05d}", scenario="s", phase="refs", concurrency=1,
                       prompt_key=f"p{i}", prompt_len=2, prompt_hash=f"solo{i}", max_tokens=3),
         [1, 2], [5, 6, 7]) for i in range(len(gaps))]
    m.phases = [PhaseRecord(index=0, name="load", scenario="s", concurrency=2)]
    r = RequestRecord(id="r00009", scenario="s", phase="load", concurrency=2, prompt_key="p",
                      prompt_len=2, prompt_hash="ph", max_tokens=4, output_hash="x", match=False,
                      first_divergence=2)
    g = {"logprobs": {3: -0.5, 9: -0.5 - div_gap}, "top": [(3, -0.5), (9, -0.5 - div_gap)]}
    r.divergence = analyse(REF, OBS, 2, None, 0.5, golden=g)
    from pleharness.manifest import CheckResult
    r.checks.append(CheckResult(name="parity", status="fail", detail="hard"))
    m.requests = [r]
    finish_phase(m.phases[0], [r])
    assert m.phases[0].status == "fail"
    return ctx, r


@pytest.mark.parametrize("div_gap,cls", [(1.5, "near_tie"), (4.0, "hard")])
def test_measured_tolerance_judges_golden_divergences_on_bf16(tmp_path, div_gap, cls):
    ctx, r = bf16_context(tmp_path, "bfloat16", [1.0, 1.2, 1.4, 1.6, 2.0], div_gap)
    ctx.finish_judgement()
    tol = ctx.manifest.run_options.golden_tolerance
    assert tol["tolerance_nats"] == pytest.approx(2.0) and tol["samples"] == 5
    assert tol["solo_runs_scored"] == 5 and "quantile" in tol["source"]
    assert r.divergence.cls == cls and r.divergence.fails == (cls == "hard")
    assert ctx.manifest.phases[0].status == ("fail" if cls == "hard" else "pass")


def test_float32_golden_divergence_is_not_rejudged(tmp_path):
    ctx, r = bf16_context(tmp_path, "float32", [1.0] * 5, 1.5)
    ctx.finish_judgement()
    assert "golden_tolerance" not in ctx.manifest.run_options.model_fields_set
    assert r.divergence.cls == "hard" and r.divergence.fails


@pytest.mark.parametrize("dtype,cls", [("bfloat16", "near_tie"), ("float16", "near_tie"),
                                       ("float32", "hard")])
def test_also_in_control_is_never_hard_on_half_precision(tmp_path, dtype, cls):
    ctx, r = bf16_context(tmp_path, dtype, [], 9.0)
    ctx.manifest.run_options.serving_dtype = dtype
    twin = RequestRecord(id="c1", scenario="s", phase="load", concurrency=2, prompt_key="p",
                         prompt_len=2, prompt_hash="ph", max_tokens=4, output_hash="x",
                         match=False, first_divergence=2)
    attribute(ctx.manifest, Manifest(run_id="c", requests=[twin]))
    d = r.divergence
    assert d.attribution == "also_in_control" and not d.fails and d.cls == cls
    assert (d.reclassified is not None) == (cls == "near_tie")


# -- end to end: the real CPU engine behind a double that corrupts a prompt's first run ----------

SCENARIO = """kind = "transitions"
[params]
ladder = [2, 1]
repeats = 1
requests_per_slot = 2
max_tokens = 8
warmup_requests = 0
max_tokens_residues = false
sampled_every = 0
[params.prompts]
count = 2
min_len = 10
max_len = 20
"""


@pytest.mark.engine
@pytest.mark.parametrize("path", ["golden", "majority"])
def test_corrupt_first_run_is_the_corrupt_reference(cpu_engine, tmp_path, path):
    """The first (cold, kept: --reference-cache-state cold) run of the 10-token prompt is
    corrupted from position 1 on; its four load runs are healthy. The reference is named the
    corrupt side (golden logprobs, or 1 run against 4), it alone fails the run, and the load runs
    are judged against the golden continuation / the majority output, which they match."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from conftest import load_json, run_cli
    from doubles import FaultProxy
    from faults_side import FirstRunCorrupt

    sc = tmp_path / "side.toml"
    sc.write_text(SCENARIO)
    fault = FirstRunCorrupt(prompt_len=10, vocab=793)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r = run_cli("stress", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id", path,
                    "--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3",
                    "--scenario", str(sc), "--reference-cache-state", "cold",
                    *(["--no-golden"] if path == "majority" else []))
    out = r.stdout + r.stderr
    m = load_json(tmp_path / path / "manifest.json")
    assert len(fault.hits) == 1, fault.hits
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    p0 = [q for q in m["requests"] if q["prompt_len"] == 10]
    ref_run = next(q for q in p0 if q["phase"] == "references")
    loads = [q for q in p0 if q["phase"] != "references"]
    assert len(loads) == 4
    (cr,) = m["summary"]["corrupt_references"]
    method = path
    assert cr["reference_run"] == ref_run["id"] and cr["method"] == method
    problems = [q["id"] for q in m["requests"] if q["error"] or any(
        c["status"] == "fail" for c in q["checks"]) or (q["match"] is False)]
    assert problems == [ref_run["id"]], problems  # only the corrupt reference fails
    assert [c["name"] for c in ref_run["checks"] if c["status"] == "fail"] == ["corrupt_reference"]
    assert all(q["match"] is True for q in loads)  # judged against the replacement
    new = next(x for x in m["references"] if x["prompt_len"] == 10)
    assert new["source"] == method and new["replaces"].startswith(ref_run["id"])
    assert new["output_hash"] == loads[0]["output_hash"]
    revealing = [q for q in loads if q.get("divergence")]
    assert revealing and all(q["divergence"]["corrupt_side"] == "reference" for q in revealing)
    ev = revealing[0]["divergence"]["side_evidence"]
    assert ev["reference_run"] == ref_run["id"] and ev["method"] == method
    if method == "golden":
        assert len(revealing) == 1  # later runs match the golden continuation outright
        assert ev["golden_logprob_reference"] < ev["golden_logprob_observed"] - 1
    else:
        assert ev["votes_reference"] == 1 and ev["votes_observed"] == 4 and len(revealing) == 4
    lead = f"the reference run {ref_run['id']} of prompt {ref_run['prompt_key']} is the outlier"
    assert lead in m["summary"]["headline"].split(";")[0]
    assert (tmp_path / path / "summary.md").read_text().count(lead) >= 1
    assert lead in (tmp_path / path / "junit.xml").read_text()
    assert "corrupt reference: " + lead in out


def test_golden_force_agrees_with_generate_and_score(tmp_path):
    """The worker's ``force`` op (the noise floor's measurement) on the embedded model: along the
    golden model's own greedy continuation every top-1 is the token itself (gap 0), and each
    logprob equals teacher forcing one position at a time (``score``)."""
    import sys
    from pleharness.golden import GoldenModel
    from pleharness.model import SHIPPED_DIR
    prompt = [20, 31, 42, 53, 64, 75]
    with GoldenModel(SHIPPED_DIR, sys.executable, log_path=tmp_path / "g.log") as g:
        out = g.generate(prompt, 6).ids
        forced = g.force(prompt, out)
        assert [f[1] for f in forced] == out and solo_gaps(forced, out) == []
        other = out[:3] + [(out[3] + 1) % 793] + out[4:]
        forced = g.force(prompt, other)
        lps, _ = g.score(prompt, other[:3], [other[3]])
        assert forced[3][0] == pytest.approx(lps[other[3]], abs=1e-4)
        assert forced[3][1] == out[3] and solo_gaps(forced[:4], other[:4]) == [
            pytest.approx(forced[3][2] - forced[3][0])]


def test_failed_solo_runs_are_left_out_of_the_noise_floor(tmp_path):
    """A corrupt reference run's tokens are far from the golden top-1; counted, they would lift
    the tolerance above the corruption they show (a 9-nat flip would pass as noise)."""
    from pleharness.manifest import CheckResult
    ctx, r = bf16_context(tmp_path, "bfloat16", [1.0, 1.2, 1.4, 1.6, 2.0], 4.0)
    bad = RequestRecord(id="r00002", scenario="s", phase="refs", concurrency=1, prompt_key="p",
                        prompt_len=2, prompt_hash="bad", max_tokens=3,
                        checks=[CheckResult(name="corrupt_reference", status="fail")])
    ctx.judge._solo_runs.append((bad, [1, 2], [5, 6, 7]))
    ctx.golden.gaps.append(9.0)  # would be the 0.95 quantile if it were counted
    ctx.finish_judgement()
    tol = ctx.manifest.run_options.golden_tolerance
    assert tol["solo_runs_scored"] == 5 and tol["solo_runs_left_out"] == 1
    assert tol["tolerance_nats"] == pytest.approx(2.0) and r.divergence.cls == "hard"


def test_a_corrupt_seeded_reference_is_judged_apart_from_an_equal_greedy_one():
    # one prompt, max_tokens 1: the greedy reference and the seeded sample's reference are the
    # same token (common for a one-token answer), so they have one hash. The seeded reference
    # r00002 is the outlier of its 3 runs; the greedy reference r00001 is right (2 of 3) and
    # the greedy load run r00006 is the outlier there. Keyed by (prompt, max_tokens, reference
    # hash) alone, the seeded majority replaced the greedy reference too, r00006 "matched" it,
    # and r00001 (listed last) was named the corrupt reference.
    from pleharness.divergence import first_divergence
    from pleharness.manifest import CheckResult, SideEvidence
    A, B = [5], [9]

    def one(i, phase, out, ref_out, ref_run, temperature=0.0, seed=None):
        r = RequestRecord(id=f"r{i:05d}", scenario="s", phase=phase, concurrency=2,
                          prompt_key="p0", prompt_len=1, prompt_hash="ph", max_tokens=1,
                          output_hash=token_hash(out), output_len=1, temperature=temperature,
                          seed=seed)
        if ref_out is not None:
            r.reference_hash, r.match = token_hash(ref_out), out == ref_out
            if not r.match:
                r.first_divergence = first_divergence(ref_out, out)
                r.output_ids = list(out)
                r.divergence = analyse(ref_out, out, r.first_divergence, None, 0.01)
                if temperature > 0:
                    r.divergence.fails = True
                r.divergence.side_evidence = SideEvidence(
                    reference_run=ref_run, reference_source="solo", observed_run=r.id,
                    observed_role="load")
                r.checks.append(CheckResult(name="parity", status="fail", detail="hard at 0"))
        return r

    m = Manifest(run_id="t")
    m.phases = [PhaseRecord(index=0, name="refs", scenario="s", concurrency=1, role="reference"),
                PhaseRecord(index=1, name="load", scenario="s", concurrency=2)]
    seeded_ref = ReferenceRecord(prompt_key="p0", prompt_hash="ph", prompt_len=1, max_tokens=1,
                                 output_hash=token_hash(A), output_ids=A, request_id="r00002",
                                 temperature=1.0, seed=3)
    greedy_ref = ReferenceRecord(prompt_key="p0", prompt_hash="ph", prompt_len=1, max_tokens=1,
                                 output_hash=token_hash(A), output_ids=A, request_id="r00001")
    m.references = [seeded_ref, greedy_ref]
    m.requests = [one(1, "refs", A, None, None), one(2, "refs", A, None, None, 1.0, 3),
                  one(3, "load", B, A, "r00002", 1.0, 3), one(4, "load", B, A, "r00002", 1.0, 3),
                  one(5, "load", A, A, "r00001"), one(6, "load", B, A, "r00001")]
    for ph in m.phases:
        finish_phase(ph, [r for r in m.requests if r.phase == ph.name])
    judge_sides(m)
    greedy_run, seeded_run = m.requests[0], m.requests[1]
    assert [c.name for c in seeded_run.failed_checks] == ["corrupt_reference"]
    assert greedy_run.failed_checks == []
    assert all(r.match for r in m.requests[2:4])  # they equal the seeded majority
    odd = m.requests[5]  # the greedy outlier stays a failure, against the greedy reference
    assert odd.match is False and odd.is_problem and odd.reference_hash == token_hash(A)
    assert odd.divergence.corrupt_side == "load"
    assert greedy_ref in m.references and seeded_ref not in m.references
    (new,) = [x for x in m.references if x.source == "majority"]
    assert (new.output_ids, new.temperature, new.seed) == (B, 1.0, 3)
    (cr,) = m.summary.corrupt_references
    assert cr["reference_run"] == "r00002"


@pytest.mark.parametrize("strict", [False, True])
def test_a_run_judged_again_against_the_majority_keeps_the_runs_rule(strict):
    """After a corrupt reference is replaced, a run that differs from the majority output too
    is judged under the run's rule: a near tie there is a warning, but under --strict every
    divergence fails (before: settled at the threshold alone, strict ignored)."""
    from pleharness.manifest import RunOptionsRecord
    good, bad, odd = [5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 3, 8]  # odd differs from good at 2
    m = Manifest(run_id="t", run_options=RunOptionsRecord(strict=strict, near_tie_nats=0.01))
    m.phases = [PhaseRecord(index=0, name="refs", scenario="s", concurrency=1, role="reference"),
                PhaseRecord(index=1, name="load", scenario="s", concurrency=2)]
    # the corrupt reference agrees with the majority before position 2: its margin there
    # (0.001 nats, below the 0.01 threshold) judges the odd run
    m.references = [ReferenceRecord(prompt_key="p0", prompt_hash="ph", prompt_len=4,
                                    max_tokens=4, output_hash=token_hash(bad), output_ids=bad,
                                    request_id="r00001", margins=[5.0, 5.0, 0.001, 5.0])]
    # (the second run alone agrees with the load runs: the first run is the outlier)
    m.requests = [rec(1, "refs", bad, None)] + [rec(i, "load", good, bad) for i in (2, 3, 4)] \
        + [rec(5, "load", odd, bad), rec(6, "refs", good, None)]
    for ph in m.phases:
        finish_phase(ph, [r for r in m.requests if r.phase == ph.name])
    judge_sides(m)
    r = m.requests[4]
    assert r.first_divergence == 2 and r.divergence.corrupt_side == "load"
    assert r.divergence.cls == "near_tie" and r.divergence.fails is strict
    (parity,) = [c for c in r.checks if c.name == "parity"]
    assert parity.status == ("fail" if strict else "warn"), parity
