"""The judge (pleharness/run/judge.py) on constructed evidence, no engine: a match passes, a hard
divergence fails, a near tie warns, ``--strict`` and seeded samples have no near-tie excuse, the
golden model blames a corrupt reference (which fails its own run and is replaced), and a failing
check fails the phase; ``compare_outputs`` (explain's replays) applies the same rule."""
import pytest

from pleharness.engine.completion import Completion
from pleharness.golden import GoldenOutput
from pleharness.manifest import CheckResult, Manifest, PhaseRecord, ReferenceRecord, RequestRecord
from pleharness.parity import token_hash
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.run.judge import Judge, Rule, compare_outputs, finish_phase

PROMPT = Prompt(key="p", ids=(1, 2, 3))
REF = [10, 11, 12, 13]


def _setup(margin=5.0, rule=Rule(near_tie_nats=0.5), golden=None, checks=None):
    m = Manifest(run_id="t")
    refs_run = RequestRecord(id="r00001", scenario="s", phase="refs", concurrency=1,
                             prompt_key="p", prompt_len=3, prompt_hash=PROMPT.hash, max_tokens=4,
                             output_hash=token_hash(REF))
    m.phases = [PhaseRecord(index=0, name="refs", scenario="s", concurrency=1, role="reference"),
                PhaseRecord(index=1, name="load", scenario="s", concurrency=2)]
    m.requests = [refs_run]
    ref = ReferenceRecord(prompt_key="p", prompt_hash=PROMPT.hash, prompt_len=3, max_tokens=4,
                          output_hash=token_hash(REF), output_ids=list(REF),
                          margins=[margin] * 4, request_id="r00001")
    m.references = [ref]
    refs = {(PROMPT.hash, 4): ref}
    return m, Judge(m, refs, rule, golden, check_registry=checks or {}), refs


def _judge(judge, m, out, checks=None):
    spec = RequestSpec(PROMPT, 4, checks=checks or {})
    c = Completion(token_ids=list(out), finish_reason="length", prompt_tokens=3,
                   completion_tokens=len(out))
    rec = RequestRecord(id=f"r{len(m.requests) + 1:05d}", scenario="s", phase="load",
                        concurrency=2, prompt_key="p", prompt_len=3, prompt_hash=PROMPT.hash,
                        max_tokens=4, output_hash=token_hash(out), output_len=len(out))
    judge.judge_request(m.phases[1], spec, c, rec, None)
    m.requests.append(rec)
    finish_phase(m.phases[1], [r for r in m.requests if r.phase == "load"])
    return rec


def _parity(rec):
    return next((c for c in rec.checks if c.name == "parity"), None)


def test_a_match_passes():
    m, judge, _ = _setup()
    rec = _judge(judge, m, REF)
    assert rec.match is True and rec.divergence is None and _parity(rec) is None
    assert m.phases[1].status == "pass" and m.phases[1].matched == 1


def test_a_hard_divergence_fails_the_phase():
    m, judge, _ = _setup(margin=5.0)
    rec = _judge(judge, m, [10, 11, 99, 13])
    d = rec.divergence
    assert rec.match is False and d.position == 2 and d.cls == "hard" and d.fails
    assert _parity(rec).status == "fail" and "hard at position 2" in _parity(rec).detail
    assert m.phases[1].status == "fail" and m.phases[1].reason == "1 hash mismatch(es)"


def test_a_near_tie_is_a_warning():
    m, judge, _ = _setup(margin=0.1)
    rec = _judge(judge, m, [10, 11, 99, 13])
    assert rec.divergence.cls == "near_tie" and not rec.divergence.fails
    assert _parity(rec).status == "warn"
    assert m.phases[1].status == "pass"
    assert m.phases[1].reason == "1 near-tie divergence(s) (warning)"


def test_strict_leaves_no_near_tie_excuse():
    m, judge, _ = _setup(margin=0.1, rule=Rule(near_tie_nats=0.5, strict=True))
    rec = _judge(judge, m, [10, 11, 99, 13])
    assert rec.divergence.cls == "near_tie" and rec.divergence.fails
    assert "(strict)" in _parity(rec).detail and m.phases[1].status == "fail"


class _Golden:
    """A golden model that finds the reference's token 12 implausible at position 2 and whose
    own continuation is the observed output."""

    def __init__(self, continuation):
        self.continuation = continuation

    def score(self, prompt, prefix, tokens):
        lps = {12: -9.0, 99: -0.05}
        return {t: lps.get(t, -20.0) for t in tokens}, [(99, -0.05), (12, -9.0)]

    def generate(self, prompt, max_tokens):
        return GoldenOutput(ids=list(self.continuation),
                            top=[[(t, -0.01), (t + 1, -5.0)] for t in self.continuation])


def test_the_golden_model_blames_a_corrupt_reference_which_is_replaced():
    obs = [10, 11, 99, 13]
    m, judge, refs = _setup(margin=5.0, golden=_Golden(obs))
    rec = _judge(judge, m, obs)
    ref_run = m.requests[0]
    # the reference's own run fails; the load run matches the golden continuation that
    # replaced it
    assert [c.name for c in ref_run.checks if c.status == "fail"] == ["corrupt_reference"]
    assert rec.divergence.corrupt_side == "reference"
    assert rec.match is True and _parity(rec).status == "pass"
    new = refs[(PROMPT.hash, 4)]
    assert new.source == "golden" and new.output_ids == obs and new.replaces.startswith("r00001")
    assert m.references == [new]
    (entry,) = m.summary.corrupt_references
    assert entry["reference_run"] == "r00001" and entry["method"] == "golden"
    assert m.phases[1].status == "pass"


def test_the_golden_model_blames_the_load_run_and_keeps_the_reference():
    m, judge, refs = _setup(margin=5.0, golden=_Golden(REF))
    ref = refs[(PROMPT.hash, 4)]
    judge.golden.score = lambda p, pre, toks: ({12: -0.05, 99: -9.0}, [(12, -0.05)])
    rec = _judge(judge, m, [10, 11, 99, 13])
    assert rec.divergence.corrupt_side == "load" and rec.divergence.fails
    assert "is the outlier" in _parity(rec).detail
    assert refs[(PROMPT.hash, 4)] is ref and not m.requests[0].checks


def test_a_failing_check_fails_the_phase_and_an_unknown_one_is_skipped():
    def never(ctx, spec, c, params):
        return CheckResult(name="never", status="fail", detail="always fails")
    m, judge, _ = _setup(checks={"never": never})
    rec = _judge(judge, m, REF, checks={"never": {}, "missing": {}})
    assert {c.name: c.status for c in rec.checks} == {"never": "fail", "missing": "skip"}
    assert rec.match is True
    assert m.phases[1].status == "fail" and m.phases[1].reason == "1 failed check(s)"


def test_a_missing_reference_is_a_parity_failure():
    m, judge, refs = _setup()
    refs.clear()
    rec = _judge(judge, m, REF)
    assert rec.match is False and _parity(rec).status == "fail"
    assert "no single-request reference" in _parity(rec).detail


@pytest.mark.parametrize("margin,temperature,fails,cls", [
    (5.0, 0.0, True, "hard"), (0.1, 0.0, False, "near_tie"), (0.1, 1.0, True, "near_tie"),
    (None, 0.0, True, "unknown")])
def test_compare_outputs_applies_the_same_rule(margin, temperature, fails, cls):
    rule = Rule(near_tie_nats=0.5)
    assert compare_outputs(REF, REF, rule, [margin] * 4) is None
    d = compare_outputs(REF, [10, 11, 99, 13], rule, None if margin is None else [margin] * 4,
                        temperature=temperature)
    assert (d.position, d.cls, d.fails) == (2, cls, fails)
    assert compare_outputs(REF, [10, 11, 99, 13], Rule(0.5, strict=True), [0.1] * 4).fails


@pytest.mark.parametrize("floor,top,cls,by", [
    (None, [(12, -1.0), (7, -1.2)], "hard", "golden"),  # 99 not in the golden top-k
    ({"informative": True, "tolerance_nats": 0.3}, [(12, -1.0), (99, -3.0)], "hard", "golden"),
    ({"informative": True, "tolerance_nats": 3.0}, [(12, -1.0), (99, -3.0)], "near_tie",
     "golden"),  # the gap (2.0) is within the run's measured floor, both in the top-k
    ({"informative": True, "tolerance_nats": 3.0}, [(12, -1.0), (7, -1.2)], "hard", "golden"),
    ({"informative": False, "tolerance_nats": 9.0}, [(12, -1.0)], "near_tie", "engine margin")])
def test_compare_outputs_weighs_the_golden_model_as_the_run_did(floor, top, cls, by):
    """Seen on the H200 (issue 33): a planted fault at a position whose engine margin was 0.004
    nats was hard by the golden model in the run; explain's replays, judged by the margin alone,
    called it a near tie. compare_outputs takes the run's golden evidence and measured floor."""
    asked = []

    def golden_at(pos):
        asked.append(pos)
        return {"logprobs": {12: -1.0, 99: -3.0}, "top": top}
    rule = Rule(near_tie_nats=0.5, serving_dtype="bfloat16")
    by_margin = compare_outputs(REF, [10, 11, 99, 13], rule, [0.004] * 4)
    assert (by_margin.cls, by_margin.fails) == ("near_tie", False)
    d = compare_outputs(REF, [10, 11, 99, 13], rule, [0.004] * 4, golden_at=golden_at,
                        golden_floor=floor)
    assert asked == [2] and d.golden_gap_nats == 2.0
    assert (d.cls, d.fails, d.decided_by.split(" (")[0]) == (cls, cls == "hard", by)
    assert compare_outputs(REF, REF, rule, [0.004] * 4, golden_at=golden_at) is None
    assert asked == [2]  # equal outputs: the golden model is not asked


def test_golden_mode_keeps_the_engines_own_reference_for_what_the_golden_model_cannot_model():
    """--reference golden: a greedy default request gets the golden continuation; a sampled
    request and one with a stop string (the golden model decodes max_tokens greedy tokens with
    no stop, penalty or EOS) get the engine's own solo run, in a phase of their own."""
    from pleharness.run.references import References, golden_models

    class Golden:
        def generate(self, ids, n):
            return GoldenOutput(ids=[7] * n, top=[[(7, -0.1), (8, -3.0)]] * n)

    m, phases = Manifest(run_id="t"), []

    def run_phase(name, conc, specs, role="load"):
        phases.append((name, [s.ref_key for s in specs]))
        outs = []
        for s in specs:
            ids = [5] * s.max_tokens
            rec = RequestRecord(id=f"r{len(m.requests) + 1:05d}", scenario="s", phase=name,
                                concurrency=1, prompt_key=s.prompt.key, prompt_len=3,
                                prompt_hash=s.prompt.hash, max_tokens=s.max_tokens,
                                output_hash=token_hash(ids))
            m.requests.append(rec)
            outs.append(type("O", (), {"spec": s, "record": rec, "completion": Completion(
                token_ids=ids, finish_reason="length")})())
        return outs

    refs = References(m, mode="golden", golden=Golden(), run_phase=run_phase, cache_state="cold")
    greedy = RequestSpec(PROMPT, 4)
    sampled = RequestSpec(PROMPT, 4, temperature=1.0, seed=3)
    stopped = RequestSpec(PROMPT, 4, stop=("ab",))
    assert golden_models(greedy) and not golden_models(sampled) and not golden_models(stopped)
    refs.take([greedy, sampled, stopped], phase_name="refs")
    assert refs.by_key[greedy.ref_key].source == "golden"
    assert refs.by_key[greedy.ref_key].output_ids == [7] * 4
    for s in (sampled, stopped):
        assert refs.by_key[s.ref_key].source == "solo" and refs.by_key[s.ref_key].output_ids == [5] * 4
    assert phases[0] == ("refs-engine", [sampled.ref_key, stopped.ref_key])
    assert phases[1] == ("refs", [greedy.ref_key])  # the engine's solo run, judged vs golden
