"""Unit tests (no engine) of issue 35 item 3: the constrained check's rules on hand-made
completions (JSON Schema, regex, choice; complete and cut outputs), the request parameters the
constraint makes, the scenario's parameter validation, logprob_sanity's masked candidates of a
constrained request (vLLM 0.32 reports them as -9999.0, docs/constrained-output.md), and the
selftest family class on hand-made chunks."""
import json
import re
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pleharness.checks import logprob_sanity
from pleharness.checks.constrained import check, conformance, constraint_problem, describe
from pleharness.engine.completion import Completion
from pleharness.faults.constrained import ConstrainedBrokenUnderLoad, is_constrained
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec, params_key
from pleharness.scenarios.base import ScenarioError
from pleharness.scenarios.constrained import DEFAULT_CONSTRAINTS, ConstrainedParams

P = Prompt("p", (5, 40, 41))
INT = {"type": "integer", "minimum": 0, "maximum": 999}
ENUM = {"type": "string", "enum": ["x", "yy", "zzz"]}


def spec(kind, con, **kw):
    return RequestSpec(P, 24, ignore_eos=False, structured=(kind, con), **kw)


def done(text, finish="stop", n=3, **kw):
    return Completion(token_ids=list(range(20, 20 + n)), text=text, finish_reason=finish, **kw)


@pytest.mark.parametrize("kind,con,good,bad,why", [
    ("regex", "(cat|dog|bird) [0-9]{1,2}", "dog 12", "dog 123", "does not match"),
    ("regex", "[0-9]{3}", "757", "#57", "does not match"),
    ("choice", ("red", "green", "blue"), "green", "gree", "is none of the 3 choices"),
    ("json", ENUM, '"yy"', '"y"', "breaks the schema at the value"),
    ("json", INT, "42", "1000", "1000 is greater than the maximum of 999"),
    ("json", INT, " 7 ", "#", "does not parse as JSON"),
    ("json", {"type": "object", "properties": {"a": INT}, "required": ["a"]}, '{"a": 3}',
     '{"a": -1}', "breaks the schema at a:"),
])
def test_conforming_outputs_pass_and_others_fail_naming_why(kind, con, good, bad, why):
    ok = check(None, spec(kind, con), done(good), {})
    assert ok.status == "pass" and ok.detail.endswith(f"{good!r} conforms"), ok
    res = check(None, spec(kind, con), done(bad), {})
    assert res.status == "fail" and why in res.detail, res
    assert res.detail.startswith(describe(kind, con) + ":") and repr(bad)[:20] in res.detail


def test_a_cut_output_is_noted_unless_it_must_finish():
    cut = done('"zz', finish="length", n=24)
    res = check(None, spec("json", ENUM), cut, {})
    assert res.status == "skip" and "finish_reason 'length' after 24 tokens" in res.detail
    assert "(not judged)" in res.detail
    res = check(None, spec("json", ENUM), cut, {"must_finish": True})
    assert res.status == "fail" and "while the same request alone finished" in res.detail


def test_unconstrained_or_failed_requests_skip():
    assert check(None, RequestSpec(P, 4), done("x"), {}).status == "skip"
    failed = done("", error="http")
    res = check(None, spec("regex", "a"), failed, {})
    assert res.status == "skip" and "request failed: http" in res.detail


def test_constraint_problems_name_the_fault():
    assert constraint_problem("regex", "[0-9]{3}") is None
    assert "expected one of json, regex, choice" in constraint_problem("grammar", "x")
    assert "does not compile" in constraint_problem("regex", "((")
    assert "not a valid JSON Schema" in constraint_problem("json", {"type": "nope"})
    assert "JSON Schema object" in constraint_problem("json", "[]")
    assert "distinct strings" in constraint_problem("choice", ["a", "a"])
    assert "distinct strings" in constraint_problem("choice", [])
    with pytest.raises(ValueError, match="does not compile"):
        conformance("regex", "((", "x")


def test_the_constraint_is_a_request_parameter_and_part_of_the_reference_key():
    s = spec("choice", ("red", "blue"))
    assert s.params == {"ignore_eos": False, "structured_outputs": {"choice": ["red", "blue"]}}
    other = spec("choice", ("red", "green"))
    plain = RequestSpec(P, 24, ignore_eos=False)
    assert len({s.ref_key, other.ref_key, plain.ref_key}) == 3
    assert json.loads(params_key(spec("json", INT).params))["structured_outputs"] == {
        "json": INT}


def test_scenario_params_validate_each_constraint():
    assert ConstrainedParams().constraints == DEFAULT_CONSTRAINTS
    for bad, msg in (([], "no constraint"), ([{"regex": "a", "choice": ["b"]}], "one key of"),
                     ([{"regex": "(("}], "constraint 0: regex"),
                     ([{"regex": "a"}, {"choice": "abc"}], "constraint 1: a choice")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            ConstrainedParams(constraints=bad)
    assert issubclass(ScenarioError, ValueError)


def test_default_constraints_are_judgeable():
    for c in DEFAULT_CONSTRAINTS:
        (kind, con), = c.items()
        assert constraint_problem(kind, con) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 999), st.sampled_from(["x", "yy", "zzz"]), st.text(max_size=6))
def test_json_scalars_conform_exactly_when_the_schema_allows_them(n, word, junk):
    assert conformance("json", INT, json.dumps(n)) is None
    assert conformance("json", ENUM, json.dumps(word)) is None
    want_ok = junk in ("x", "yy", "zzz")
    assert (conformance("json", ENUM, json.dumps(junk)) is None) == want_ok
    assert (conformance("choice", ("x", "yy", "zzz"), junk) is None) == want_ok
    assert (conformance("regex", "[0-9]{3}", junk) is None) == bool(
        re.fullmatch(r"[0-9]{3}", junk))


def masked_completion(emitted_lp=0.0):
    """A constrained answer as vLLM 0.32 gives it: the grammar allows one token at position 1,
    the forbidden ones fill the top k at -9999.0."""
    return Completion(token_ids=[318, 73], text="red", finish_reason="stop",
                      logprobs=[{318: -1.13, 76: -1.41, 3: -9999.0},
                                {73: emitted_lp, 1: -9999.0, 0: -9999.0}],
                      token_logprobs=[-1.13, emitted_lp])


def test_logprob_sanity_allows_the_grammars_masked_candidates_of_a_constrained_request():
    con = spec("choice", ("red", "green"))
    assert logprob_sanity.check(None, con, masked_completion(), {}).status == "pass"
    res = logprob_sanity.check(None, RequestSpec(P, 2), masked_completion(), {})
    assert res.status == "fail" and "sentinel/non-finite" in res.detail  # unconstrained: no
    nan = masked_completion()
    nan.logprobs[1][5] = float("nan")
    assert logprob_sanity.check(None, con, nan, {}).status == "fail"
    forbidden = masked_completion(-9999.0)
    res = logprob_sanity.check(None, con, forbidden, {})
    assert res.status == "fail" and "a token the grammar's mask forbids" in res.detail


def ctx_of(body, in_flight):
    return SimpleNamespace(body=body, in_flight=in_flight, state={}, number=1, streamed=True)


def test_the_family_class_breaks_only_constrained_requests_in_flight_with_another():
    body = {"prompt": [1], "structured_outputs": {"choice": ["red"]}}
    assert is_constrained(body) and not is_constrained({"prompt": [1]})
    f = ConstrainedBrokenUnderLoad()
    chunk = {"choices": [{"index": 0, "text": "red", "token_ids": [318]}]}
    alone = ctx_of(body, 1)
    assert f.chunk(alone, json.loads(json.dumps(chunk))) == chunk and not f.hits
    plain = ctx_of({"prompt": [1]}, 2)
    assert f.chunk(plain, json.loads(json.dumps(chunk))) == chunk and not f.hits
    loaded = ctx_of(body, 2)
    out = f.chunk(loaded, json.loads(json.dumps(chunk)))
    assert out["choices"][0] == {"index": 0, "text": "#ed", "token_ids": [317]}
    assert len(f.hits) == 1
    again = f.chunk(loaded, json.loads(json.dumps(chunk)))  # once per request
    assert again == chunk and len(f.hits) == 1
    assert conformance("choice", ("red", "green", "blue"), "#ed") is not None
