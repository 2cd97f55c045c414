"""Unit tests (no engine) of issue 26 items 2 and 3: the reference key of per-request
parameters, the stop_string check's rules on hand-made completions, and the stop scenario's
choice of cut positions."""
from types import SimpleNamespace

from pleharness.checks.stop_string import check as stop_check
from pleharness.engine.completion import Completion
from pleharness.engine.facts import as_facts
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.scenarios.stop_strings import pick_positions, steps_of

WORDS = {1: "</s>", 10: " 1", 11: " 2", 12: " 3", 13: " 4", 14: " 5", 15: " 6", 16: " 16"}


class Ctx:
    facts = as_facts({"eos_token_id": 1})

    def detokenize(self, ids):
        return "".join(WORDS[i] for i in ids)


P = Prompt("p", (5, 6, 7))


def spec(**kw):
    return RequestSpec(P, 8, **kw)


def comp(ids, text, chunks=None, finish="stop", streamed=True):
    return Completion(token_ids=ids, text=text, finish_reason=finish, prompt_tokens=3,
                      completion_tokens=len(ids), chunks=chunks, streamed=streamed)


def test_parameters_are_part_of_the_reference_key():
    plain = spec()
    assert plain.params == {} and plain.ref_key == (P.hash, 8)
    stop = spec(stop=(" 4",))
    assert stop.params == {"stop": [" 4"]} and stop.ref_key != plain.ref_key
    assert spec(stop=(" 4",), stream=False).ref_key == stop.ref_key  # streamed == non-streamed
    pen = spec(repetition_penalty=1.5)
    assert pen.ref_key not in (plain.ref_key, stop.ref_key)
    assert spec(logit_bias=((17, -100.0),)).params == {"logit_bias": {"17": -100.0}}
    assert spec(ignore_eos=False).params == {"ignore_eos": False}


def test_stop_string_passes_the_engines_contract():
    ids = [10, 11, 12, 13]  # " 1 2 3 4": the stop " 4" completed by the last ID
    c = comp(ids, " 1 2 3", chunks=[([10], ""), ([11, 12, 13], " 1 2 3")])
    r = stop_check(Ctx(), spec(stop=(" 4",)), c, {"expect_len": 4})
    assert r.status == "pass", r.detail


def test_ids_after_the_stop_fail():
    ids = [10, 11, 12, 13, 14, 15]  # the rest of the step kept after the stop " 4"
    r = stop_check(Ctx(), spec(stop=(" 4",)), comp(ids, " 1 2 3"), {"expect_len": 4})
    assert r.status == "fail"
    assert "ids after the stop: 2 ID(s) after the one that completed ' 4' (position 3)" in r.detail
    assert "expect_len: 6 IDs, expected 4" in r.detail


class SpecCtx(Ctx):
    """Speculative decoding on (k = 2), the stop request's solo reference returned ``ref_ids``."""

    def __init__(self, ref_ids=None, role="load", k=2, source="solo"):
        self.facts = as_facts({"eos_token_id": 1, "num_speculative_tokens": k})
        self.phase_role = role
        ref = SimpleNamespace(output_ids=ref_ids, source=source)
        self.references = {spec(stop=(" 4",)).ref_key: ref} if ref_ids is not None else {}


def test_ids_kept_past_a_stop_by_a_speculative_step_warn_only_as_the_engines_own_solo_behaviour():
    """GPU run q (vLLM 0.26.0, ngram k = 2): stock vLLM keeps the rest of a speculative step past
    a stop string (vllm-project/vllm#47616) in every run, solo ones too. That is a warn when the
    request is a reference, or its solo reference has the same IDs, and at most k IDs follow the
    stop; load-only extra IDs, more than k, no speculative decoding, or another broken rule fail."""
    ids = [10, 11, 12, 13, 14]  # one ID past the stop " 4"
    s, c = spec(stop=(" 4",)), comp(ids, " 1 2 3")
    r = stop_check(SpecCtx(role="reference"), s, c, {"expect_len": 4})
    assert r.status == "warn" and "vllm-project/vllm#47616" in r.detail, r.detail
    assert stop_check(SpecCtx(ref_ids=ids), s, c, {"expect_len": 4}).status == "warn"
    assert stop_check(SpecCtx(ref_ids=ids[:4]), s, c, {}).status == "fail"  # only under load
    assert stop_check(SpecCtx(), s, c, {}).status == "fail"  # no reference to tell
    assert stop_check(SpecCtx(ref_ids=ids, source="golden"), s, c, {}).status == "fail"
    assert stop_check(SpecCtx(role="reference", k=0), s, c, {}).status == "fail"
    assert stop_check(Ctx(), s, c, {}).status == "fail"  # no speculative decoding fact
    three = [10, 11, 12, 13, 14, 15, 16]  # 3 IDs past the stop: more than one step of k = 2
    assert stop_check(SpecCtx(role="reference"), s, comp(three, " 1 2 3"), {}).status == "fail"
    assert stop_check(SpecCtx(role="reference"), s, c, {"expect_len": 3}).status == "fail"
    bad_usage = comp(ids, " 1 2 3")
    bad_usage.completion_tokens = 9
    assert stop_check(SpecCtx(role="reference"), s, bad_usage, {}).status == "fail"


def test_text_past_the_stop_or_inconsistent_usage_fail():
    r = stop_check(Ctx(), spec(stop=(" 4",)), comp([10, 11, 12, 13], " 1 2 3 4"), {})
    assert r.status == "fail" and "text: contains the stop string ' 4'" in r.detail
    c = comp([10, 11, 12, 13], " 1 2 3")
    c.completion_tokens = 6
    r = stop_check(Ctx(), spec(stop=(" 4",)), c, {})
    assert r.status == "fail" and "usage: completion_tokens 6 for 4 IDs" in r.detail
    r = stop_check(Ctx(), spec(stop=(" 4",)), comp([10, 11, 12, 13], " 1 2 3", finish="length"),
                   {})
    assert r.status == "fail" and "finish_reason 'length'" in r.detail
    r = stop_check(Ctx(), spec(stop=(" 6",)), comp([10, 11], " 1 2"), {})  # stopped early
    assert r.status == "fail" and "reaches no stop string and ignore_eos was on" in r.detail


def test_streamed_deltas_are_judged_by_their_concatenations_only():
    """Issue 35 item 7: text lagging its IDs (vLLM holding back a stop prefix) and text ahead of
    them (a gateway that re-chunks: the text on the first piece) both pass; the latter is noted.
    Text past the stop still fails, however the deltas split it."""
    lag = [([10], ""), ([11], " 1"), ([12, 13], " 2 3")]
    r = stop_check(Ctx(), spec(stop=(" 4",)), comp([10, 11, 12, 13], " 1 2 3", lag), {})
    assert r.status == "pass" and "re-chunked" not in r.detail
    ahead = [([10], " 1 2 3"), ([11], ""), ([12], ""), ([13], "")]
    r = stop_check(Ctx(), spec(stop=(" 4",)), comp([10, 11, 12, 13], " 1 2 3", ahead), {})
    assert r.status == "pass" and "deltas re-chunked: after delta 0 (1 IDs)" in r.detail
    past = [([10], " 1 2 3 4"), ([11, 12, 13], "")]
    r = stop_check(Ctx(), spec(stop=(" 4",)), comp([10, 11, 12, 13], " 1 2 3 4", past), {})
    assert r.status == "fail" and "text: contains the stop string ' 4'" in r.detail


def test_eos_ids_are_left_out_of_the_text_and_a_failed_request_is_skipped():
    r = stop_check(Ctx(), spec(stop=(" 3",)), comp([1, 10, 11, 12], " 1 2"), {})
    assert r.status == "pass", r.detail
    c = comp([], "")
    c.error = "http"
    assert stop_check(Ctx(), spec(stop=(" 3",)), c, {}).status == "skip"
    assert stop_check(Ctx(), spec(), comp([10], " 1"), {}).status == "skip"


def test_cut_positions_inside_and_at_the_end_of_a_step():
    steps = steps_of([([1], ""), ([2], ""), ([3, 4, 5, 6], ""), ([7, 8, 9, 10], ""),
                      ([11], ""), ([12], "")])
    assert [s[0] for s in steps] == [1, 1, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1]
    inside, end = pick_positions(steps, 1, 11, q=4)
    assert steps[inside][0] == 4 and steps[inside][1] < 3  # not the step's last token
    assert steps[end][1] == steps[end][0] - 1 and abs(end - inside) >= 3
    merged = steps_of([([1], ""), (list(range(2, 12)), "")])  # 10 IDs: several steps merged
    assert all(steps_ok == (1, 0) or steps_ok[0] == 10 for steps_ok in merged)
    assert pick_positions(merged, 1, 8, q=4) == [3, 5]  # no claim of "inside": 1/3 and 2/3


class ByteCtx(Ctx):
    """Tokens 20 and 21 are byte-fallback tokens whose bytes form no character alone:
    /detokenize gives U+FFFD for each, as the tokenizers library's decode does."""

    def detokenize(self, ids):
        return "".join("\ufffd" if i in (20, 21) else WORDS[i] for i in ids)


def test_a_stop_string_of_replacement_characters_is_never_picked_nor_judged():
    # run s (H100, vLLM 0.26, random weights): fuzz drew the stop '\ufffd\ufffd' from an output's
    # byte tokens; the engine's incremental detokenizer emits no text for them, so it never
    # stopped, and the check failed a healthy engine 41 times
    from pleharness.scenarios.shared.stops import stop_for
    ctx = ByteCtx()
    assert stop_for(ctx, [10, 20, 21], 2) is None  # '\ufffd', '\ufffd\ufffd', ' 1\ufffd\ufffd'
    assert stop_for(ctx, [10, 20, 11], 2) == " 2"  # a real character after them still qualifies
    r = stop_check(ctx, spec(stop=("\ufffd\ufffd",)), comp([10, 20, 21, 11], " 1 2",
                                                            finish="length"), {})
    assert r.status == "skip" and "U+FFFD" in r.detail
    r = stop_check(ctx, spec(stop=(" 2",)), comp([10, 20, 21, 11], " 1\ufffd\ufffd",
                                                  finish="length"), {})
    assert r.status == "fail"  # an ordinary stop string is still judged beside byte tokens


def test_the_incremental_detokenizer_emits_no_text_where_detokenize_gives_u_fffd():
    """The premise of the U+FFFD rule, on the embedded model's real tokenizer: tokenizers'
    DecodeStream (what vllm/v1/engine/detokenizer.py steps for a fast tokenizer) emits nothing
    for byte tokens that form no character, where a whole decode (/detokenize) gives U+FFFD."""
    import pytest
    decoders = pytest.importorskip("tokenizers.decoders")
    if not hasattr(decoders, "DecodeStream"):
        pytest.skip("tokenizers without DecodeStream")
    from tokenizers import Tokenizer

    from pleharness.model import ensure_embedded_model
    tok = Tokenizer.from_file(str(ensure_embedded_model() / "tokenizer.json"))
    partial = [i for i in range(tok.get_vocab_size()) if tok.decode([i]) == "\ufffd"]
    assert len(partial) >= 2  # the byte-fallback tokens a random-weight model emits
    ids = partial[:2]
    assert tok.decode(ids) == "\ufffd\ufffd"
    stream = decoders.DecodeStream(skip_special_tokens=True)
    assert [stream.step(tok, i) for i in ids] == [None, None]
