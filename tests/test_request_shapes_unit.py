"""Issue 52 without an engine: the new request fields, checks ``special_tokens`` and
``stop_token`` (stop strings under min_tokens), the straddling stop's position, the
``mixed_params`` variants' rules, the fuzz feature ``raw`` and the LoRA adapters of /v1/models."""
import pytest
from pydantic import ValidationError

from pleharness.checks.special_tokens import check as special_check
from pleharness.checks.stop_token import check as stop_token_check
from pleharness.engine.client import EngineClient
from pleharness.engine.completion import Completion
from pleharness.engine.facts import as_facts
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.scenarios.fuzz_features import Features, apply, fit, toml_lines
from pleharness.scenarios.mixed_params import Variant
from pleharness.scenarios.shared.stops import stop_span
from pleharness.scenarios.stop_strings import straddle_check, straddle_position

WORDS = {1: "</s>", 10: " 1", 11: " 2", 12: " 3", 13: " 4", 14: " 5"}


class Ctx:
    facts = as_facts({"eos_token_id": 1})

    def detokenize(self, ids):
        return "".join(WORDS[i] for i in ids)


P = Prompt("p", (5, 6, 7))


def comp(ids, text, finish="length"):
    return Completion(token_ids=ids, text=text, finish_reason=finish, prompt_tokens=3,
                      completion_tokens=len(ids))


def test_new_fields_are_sent_and_part_of_the_reference_key():
    plain = RequestSpec(P, 8)
    for kw, want in ((dict(min_p=0.1), {"min_p": 0.1}),
                     (dict(skip_special_tokens=False), {"skip_special_tokens": False}),
                     (dict(adapter="tiny-lora"), {"model": "tiny-lora"})):
        s = RequestSpec(P, 8, **kw)
        assert s.params == want and s.ref_key != plain.ref_key
    assert RequestSpec(P, 8, skip_special_tokens=True).params == {}


def test_special_tokens_kept_or_skipped_as_asked():
    keep = RequestSpec(P, 4, skip_special_tokens=False)
    assert special_check(Ctx(), keep, comp([10, 1, 1], " 1</s></s>"), {}).status == "pass"
    # the prompt's tail leading the text (random-ID prompts): only the end and the count judged
    assert special_check(Ctx(), keep, comp([10, 1, 1], "tail 1</s></s>"), {}).status == "pass"
    r = special_check(Ctx(), keep, comp([10, 1, 1], " 1"), {})
    assert r.status == "fail" and "skip_special_tokens false" in r.detail and "2 EOS" in r.detail
    skip = RequestSpec(P, 4)
    assert special_check(Ctx(), skip, comp([10, 1], " 1"), {}).status == "pass"
    assert special_check(Ctx(), skip, comp([10, 1], " 1</s>"), {}).status == "fail"
    assert special_check(Ctx(), skip, comp([10, 11], " 1 2"), {}).status == "skip"  # no EOS
    stop = RequestSpec(P, 4, stop=(" 2",), skip_special_tokens=False)
    assert special_check(Ctx(), stop, comp([10, 1], " 1"), {}).status == "skip"


def test_the_id_that_ended_the_output_is_not_in_its_text():
    """vLLM leaves the text of a stop-terminating ID out (found by a clean fuzz run on the real
    CPU engine: an answer ended by EOS with skip_special_tokens false has no '</s>' at its end;
    the check had asked for one)."""
    keep = RequestSpec(P, 4, skip_special_tokens=False, ignore_eos=False)
    assert special_check(Ctx(), keep, comp([10, 1], " 1", "stop"), {}).status == "pass"
    assert special_check(Ctx(), keep, comp([10, 1], " 1</s>", "stop"), {}).status == "fail"
    # an EOS inside the output (ignore_eos) keeps its text; the one named in stop_token_ids
    # that ended it does not
    forced = RequestSpec(P, 4, skip_special_tokens=False, ignore_eos=True, stop_token_ids=(1,))
    assert special_check(Ctx(), forced, comp([1, 10, 1], "</s> 1", "stop"), {}).status == "pass"
    assert special_check(Ctx(), forced, comp([1, 10, 1], " 1", "stop"), {}).status == "fail"
    # cut by max_tokens at an EOS of ignore_eos: it is an ordinary token, kept
    ign = RequestSpec(P, 2, skip_special_tokens=False, ignore_eos=True)
    assert special_check(Ctx(), ign, comp([10, 1], " 1</s>", "length"), {}).status == "pass"


def test_min_tokens_holds_a_stop_string_back():
    s = RequestSpec(P, 8, stop=(" 2",), min_tokens=3)
    ok = stop_token_check(Ctx(), s, comp([10, 11, 12, 13, 11], " 1 2 3 4", "stop"), {})
    assert ok.status == "pass", ok.detail  # a stop string ended it after the floor
    early = stop_token_check(Ctx(), s, comp([10, 11], " 1", "stop"), {})
    assert early.status == "fail" and "2 IDs, fewer than min_tokens 3" in early.detail
    # without a stop string, "stop" with no stop ID last is still wrong
    bare = RequestSpec(P, 8, min_tokens=3)
    assert stop_token_check(Ctx(), bare, comp([10, 11, 12], " 1 2 3", "stop"), {}).status == \
        "fail"


def test_a_straddling_stop_starts_a_delta_and_spans_two_tokens():
    steps = [(1, 0), (2, 0), (2, 1), (1, 0), (1, 0), (1, 0)]
    assert straddle_position(steps, 0, 5, []) == 3  # starts a delta, nearest the middle
    assert straddle_position(steps, 0, 5, [3]) is None  # none 3 or more from position 3
    assert straddle_position([(3, 0), (3, 1), (3, 2)], 0, 2, []) is None
    ids = [10, 11, 12, 13, 14]
    assert stop_span(Ctx(), ids, 3) == (" 4", 1)
    assert stop_span(Ctx(), ids, 3, min_back=2) == (" 3 4", 2)
    rows = [type("R", (), {"straddles": s})() for s in (False, True)]
    assert straddle_check(rows).status == "pass"
    assert straddle_check(rows[:1]).status == "warn"


def test_variants_reject_what_changes_nothing_or_cannot_be_judged():
    with pytest.raises(ValidationError, match="need temperature > 0"):
        Variant(name="k", top_k=3, stop_token_at=2)
    with pytest.raises(ValidationError, match="changes nothing"):
        Variant(name="n", top_k=3)
    with pytest.raises(ValidationError, match="eos_bias with ignore_eos"):
        Variant(name="e", eos_bias=100.0)
    assert Variant(name="s", temperature=1.0, top_k=3, seed=1).seeded
    assert not Variant(name="u", temperature=1.0).seeded
    assert Variant(name="a", adapter=True).adapter
    Variant(name="x", eos_bias=100.0, skip_special_tokens=False)  # kept in the text: allowed


def test_fuzz_draws_raw_text_and_replays_it():
    spec = RequestSpec(P, 6)
    raw = apply(spec, Features(raw=True), None)
    assert raw.params == {"skip_special_tokens": False} and "special_tokens" in raw.checks
    assert Features(raw=True).tag() == "<raw>"
    assert "skip_special_tokens = false" in toml_lines(raw)
    assert not fit(Features(raw=True, stop_str_at=1), 6, True, "chat").raw  # stop text rules


def test_adapters_are_the_models_with_a_parent():
    c = EngineClient("http://127.0.0.1:9")
    c.models = lambda: [{"id": "base", "parent": None}, {"id": "tiny-lora", "parent": "base"},
                        {"id": "odd", "parent": "odd"}]
    assert c.adapters() == ["tiny-lora"]
    c.models = lambda: []
    assert c.adapters() == []
