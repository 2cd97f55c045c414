"""Issue 24 item 1: model-behaviour (relative) checks fail a request only when its judge (the
reference for a load request, the golden model for a reference or warm-up run) passes the same
check; engine-contract (absolute) checks always fail. Unit tests on constructed evidence; the
end-to-end proof on the real CPU engine is in tests/test_e2e_checks.py."""
from pleharness.checks import PHASE_REGISTRY, REGISTRY
from pleharness.engine.completion import Completion
from pleharness.engine.facts import EngineFacts
from pleharness.golden import GoldenError, GoldenOutput
from pleharness.manifest import ReferenceRecord
from pleharness.parity import token_hash
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec

WORDS = {1: " OK", 2: " 1", 3: " 2", 4: " 3", 5: " #", 6: " Sure"}


class Client:
    """The engine's /detokenize for a toy vocabulary (WORDS); counts its calls."""

    def __init__(self, broken=False):
        self.calls = 0
        self.broken = broken

    def detokenize(self, ids):
        self.calls += 1
        if self.broken:
            raise OSError("connection refused")
        return "".join(WORDS[i] for i in ids)


class Golden:
    def __init__(self, ids=None, error=None):
        self.ids, self.error, self.asked = ids, error, []

    def generate(self, prompt, max_tokens):
        self.asked.append((tuple(prompt), max_tokens))
        if self.error:
            raise GoldenError(self.error)
        return GoldenOutput(ids=list(self.ids))


class Ctx:
    def __init__(self, role="load", ref_ids=None, source="solo", golden=None, client=None):
        self.facts = EngineFacts({"vocab_size": 100}, {})
        self.phase_role = role
        self.golden = golden
        self.golden_error = None
        self.client = client or Client()
        self.references = {}
        if ref_ids is not None:
            s = spec()
            self.references[s.ref_key] = ReferenceRecord(
                prompt_key="p", prompt_hash=s.prompt.hash, prompt_len=3, max_tokens=3,
                output_hash=token_hash(ref_ids), output_ids=list(ref_ids), source=source)


def spec(**kw):
    return RequestSpec(Prompt("p", (16, 17, 18)), 3, **kw)


def comp(ids):
    return Completion(token_ids=list(ids), text="".join(WORDS[i] for i in ids),
                      finish_reason="length", prompt_tokens=3, completion_tokens=len(ids))


OK = {"regex": r"^\s*OK"}


def check(name, c, ctx, params, s=None):
    return REGISTRY[name](ctx, s or spec(), c, params)


def test_every_check_says_its_kind():
    kinds = {n: f.kind for n, f in {**REGISTRY, **PHASE_REGISTRY}.items()}
    assert kinds == {"vocab_range": "absolute", "usage": "absolute", "logprob_sanity": "absolute",
                     "logprobs_finite": "absolute", "max_model_len_edge": "absolute",
                     "health_after_phase": "absolute", "expected_text": "relative",
                     "counting": "relative", "degeneration": "relative",
                     "stop_string": "absolute", "sampled_degeneration": "relative",
                     "stop_token": "absolute", "prompt_logprobs": "absolute",
                     "choices": "absolute", "constrained": "absolute",
                     "special_tokens": "absolute"}
    for n, f in {**REGISTRY, **PHASE_REGISTRY}.items():
        import sys
        assert f"Kind: **{f.kind}**" in sys.modules[f.__module__].__doc__, n


def test_load_miss_is_a_note_when_the_reference_misses_too():
    ctx = Ctx(ref_ids=[6, 1, 1])  # the model answers "Sure OK OK" alone too
    r = check("expected_text", comp([6, 1, 1]), ctx, OK)
    assert r.status == "note"
    assert "model behaviour: the single-request reference fails it too" in r.detail
    assert "' Sure OK OK'" in r.detail


def test_load_miss_fails_when_the_reference_passes():
    ctx = Ctx(ref_ids=[1, 1, 1])
    r = check("expected_text", comp([5, 1, 1]), ctx, OK)
    assert r.status == "fail" and r.detail.endswith("; the single-request reference passes it")
    r = check("counting", comp([2, 5, 4]), Ctx(ref_ids=[2, 3, 4]), {"n": 3})
    assert r.status == "fail" and "word 2 is '#', expected '2'" in r.detail
    r = check("counting", comp([2, 5, 4]), Ctx(ref_ids=[2, 5, 5]), {"n": 3})
    assert r.status == "note" and "fails it too: word 2 is '#'" in r.detail


def test_a_pass_needs_no_judge_and_the_text_is_asked_once():
    ctx = Ctx(ref_ids=[6, 1, 1])
    assert check("expected_text", comp([1]), ctx, OK).status == "pass"
    assert ctx.client.calls == 0
    for _ in range(3):
        check("expected_text", comp([6]), ctx, OK)
    assert ctx.client.calls == 1  # the reference's text is cached per context


def test_load_without_reference_or_text_keeps_failing():
    r = check("expected_text", comp([6]), Ctx(), OK)
    assert r.status == "fail" and "no reference to judge it" in r.detail
    r = check("expected_text", comp([6]), Ctx(ref_ids=[6], client=Client(broken=True)), OK)
    assert r.status == "fail" and "could not be judged" in r.detail


def test_reference_run_is_judged_by_the_golden_model():
    gold = Golden(ids=[1, 1, 1])  # the golden model answers OK: the engine's solo run is wrong
    r = check("expected_text", comp([5, 5, 5]), Ctx(role="reference", golden=gold), OK)
    assert r.status == "fail" and r.detail.endswith("; the golden model passes it")
    assert gold.asked == [((16, 17, 18), 3)]
    gold = Golden(ids=[6, 6, 6])  # the golden model does not answer OK either: the model's
    r = check("expected_text", comp([6, 6, 6]), Ctx(role="warmup", golden=gold), OK)
    assert r.status == "note" and "the golden model fails it too" in r.detail
    # a golden reference (--reference golden) is the judge itself; the model is not asked again
    gold = Golden(ids=[1])
    r = check("expected_text", comp([6, 6, 6]),
              Ctx(role="reference", ref_ids=[1, 1, 1], source="golden", golden=gold), OK)
    assert r.status == "fail" and "golden reference passes it" in r.detail and not gold.asked


def test_reference_run_without_golden_judge_is_a_note():
    r = check("expected_text", comp([6]), Ctx(role="reference"), OK)
    assert r.status == "note" and "no golden reference to judge it, so not a failure" in r.detail
    r = check("expected_text", comp([6]), Ctx(role="reference", golden=Golden(error="oom")), OK)
    assert r.status == "note" and "golden model failed: oom" in r.detail
    gold = Golden(ids=[1])
    r = check("expected_text", comp([6]), Ctx(role="reference", golden=gold), OK,
              s=spec(temperature=1.0, seed=3))
    assert r.status == "note" and "seeded sample" in r.detail and not gold.asked


def test_absolute_checks_fail_whatever_the_reference_shows():
    # the reference has the same out-of-range ID: still an engine fault
    ctx = Ctx(ref_ids=[1, 1, 1])
    bad = Completion(token_ids=[1, 500], text="", finish_reason="length", prompt_tokens=3,
                     completion_tokens=2)
    ctx.references[spec().ref_key].output_ids = [1, 500]
    assert check("vocab_range", bad, ctx, {}).status == "fail"
    assert check("usage", bad, ctx, {}).status == "fail"  # 2 of max_tokens=3 under ignore_eos
