"""The per-request features ``fuzz`` draws (pleharness/scenarios/fuzz_features.py, issue 35
item 8): each is drawn, left out where the engine configuration cannot take it, shrinks towards
absent, names concrete stop / bias IDs, round-trips through repro.toml (the ``replay`` kind reads
and sends it) and is recorded in ``fuzz_failing``; a bad value in a replay file is a usage error
naming the key. The engine run is in tests/test_fuzz.py (test_engine_clean_fuzz_passes_with_every_feature,
test_engine_fuzz_finds_a_stop_token_fault)."""
from dataclasses import replace

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis.errors import NoSuchExample

from pleharness.request import RequestSpec
from pleharness.scenarios import load_scenario_file
from pleharness.scenarios.base import ScenarioError
from pleharness.scenarios.fuzz.repro import failing_rows, write_repro
from pleharness.scenarios.fuzz.strategy import (FuzzParams, FuzzPhase, FuzzRequest, PhaseSpecs,
                                                Schedule, build_space, schedules)
from pleharness.scenarios.fuzz_features import (CONSTRAINTS, NONE, Features, allowed, apply,
                                                 fit, gate, resolve, toml_lines)
from pleharness.scenarios.replay import Replay, prompt_of

FACTS = {"num_speculative_tokens": 3, "block_size": 32, "max_num_batched_tokens": 256,
         "max_model_len": 1024, "max_num_seqs": 8, "vocab_size": 793}
OK = settings(database=None, max_examples=2000,  # found within a few dozen: stops when found,
              phases=[Phase.generate])  # without shrinking it (only that one exists is asked)
NEVER = settings(database=None, max_examples=300)  # a NoSuchExample search runs every example


def space(k: int = 3, chat: bool = True, **kw):
    sp = build_space({**FACTS, "num_speculative_tokens": k}, FuzzParams(max_tokens=9, **kw))
    if chat:
        sp.chat_min = 20  # as FuzzExamples._chat_prompts sets it where the model has a chat template
    return sp


def members(s: Schedule):
    return [r for p in s.phases for r in p.members()]


K0 = space(0)


@pytest.mark.parametrize("what", [
    lambda f: f.logprobs is not None, lambda f: f.stop_at is not None,
    lambda f: f.min_tokens is not None, lambda f: f.eos, lambda f: f.penalty is not None,
    lambda f: f.bias_at is not None, lambda f: f.prompt_logprobs is not None,
    lambda f: f.echo, lambda f: f.stop_str_at is not None, lambda f: f.constraint is not None])
def test_each_feature_is_drawn(what):
    find(schedules(K0), lambda s: any(what(r.features) for r in members(s)), settings=OK)


def test_chat_api_requests_are_drawn_streamed_only_with_a_template():
    find(schedules(K0), lambda s: any(r.shape == "messages" for r in members(s)), settings=OK)
    with pytest.raises(NoSuchExample):
        find(schedules(space(0, chat=False)),
             lambda s: any(r.shape == "messages" for r in members(s)), settings=NEVER)
    with pytest.raises(NoSuchExample):
        find(schedules(K0), lambda s: any(r.shape == "messages" and not r.stream
                                          for r in members(s)), settings=NEVER)


def test_engine_facts_leave_features_out_with_a_reason():
    sp = space(3)
    assert "logit_bias" not in sp.features and "logit_bias" in K0.features
    assert any("logit_bias left out" in n and "k = 3" in n for n in sp.notes)
    unknown = build_space({k: v for k, v in FACTS.items() if k != "num_speculative_tokens"},
                          FuzzParams())
    assert "logit_bias" not in unknown.features
    assert any("logit_bias left out" in n and "unknown" in n for n in unknown.notes)
    with pytest.raises(NoSuchExample):  # vLLM refuses logit_bias with speculative decoding
        find(schedules(sp), lambda s: any(r.features.bias_at is not None for r in members(s)),
             settings=NEVER)
    assert not space(0, features=False).features
    with pytest.raises(NoSuchExample):
        find(schedules(space(0, features=False)),
             lambda s: any(r.features for r in members(s)), settings=NEVER)


@settings(max_examples=150, deadline=None, database=None)
@given(schedules(K0))
def test_drawn_features_fit_their_request(sched):
    for r in members(sched):
        f = r.features
        if f.prompt_logprobs is not None:  # vLLM refuses prompt logprobs streamed
            assert not r.stream and r.shape != "messages"
        for pos in (f.stop_at, f.bias_at):
            assert pos is None or 0 <= pos < r.max_tokens
        assert f.min_tokens is None or 1 <= f.min_tokens <= r.max_tokens
        assert f.logprobs is None or 1 <= f.logprobs <= 5
        assert not f.echo or not r.stream  # echo on non-streamed requests only
        if f.stop_str_at is not None:  # a stop string: text prompts to /v1/completions only
            assert r.shape == "chat" and 0 <= f.stop_str_at < r.max_tokens
            assert f.stop_at is None and f.min_tokens is None and f.constraint is None
        if f.constraint is not None:  # constrained output: text prompts only
            assert r.shape in ("chat", "messages") and f.stop_at is None
            assert f.min_tokens is None and 0 <= f.constraint < len(CONSTRAINTS)
    for ph in sched.phases:
        assert ph.carrier is None or not ph.carrier.features  # a carrier decodes to its end


def test_features_shrink_towards_absent():
    """The smallest schedule with a stop ID keeps that one feature and nothing else. Hypothesis'
    shrinker may stop at a phase of two requests (the concurrency and the request list shrink
    together), so the request count is not asserted; usually it is C1[1+1<stop@0>]."""
    got = find(schedules(K0), lambda s: any(r.features.stop_at is not None
                                            for r in members(s)),
               settings=settings(OK, derandomize=True,  # the same search on every machine
                                 phases=list(Phase)))  # shrinking is what this test is about
    rs = members(got)
    assert any(r.features == Features(stop_at=0) for r in rs), got.summary()
    assert all(not r.features or r.features == Features(stop_at=0) for r in rs), got.summary()
    assert all(r.shape == "random" and r.max_tokens == 1 for r in rs), got.summary()


def test_stop_and_bias_ids_come_from_the_output_without_parameters():
    # stop_at 2: the ID there (7) was emitted before (position 0), so the first ID from 2 on
    # not emitted before (9, position 3) stops it there; bias_at 1: the ID emitted there
    base, prompt = [7, 8, 7, 9, 5], (40, 41, 42)
    assert resolve(Features(stop_at=2, bias_at=1, bias=-100.0), base, prompt) == \
        ((9,), ((8, -100.0),))
    # past the output (or none at all): the prompt's ID, modulo its length
    assert resolve(Features(stop_at=4, bias_at=7, bias=10.0), [1, 2], prompt) == \
        ((41,), ((41, 10.0),))
    spec = apply(RequestSpec(prompt_of([40, 41, 42]), 6),
                 Features(logprobs=3, stop_at=0, min_tokens=2, eos=True,
                          penalty=("frequency_penalty", -1.0), prompt_logprobs=1), [5, 6])
    assert spec.logprobs == 3 and spec.params == {
        "ignore_eos": False, "frequency_penalty": -1.0, "stop_token_ids": [5],
        "min_tokens": 2, "prompt_logprobs": 1}
    assert {"stop_token", "prompt_logprobs"} <= set(spec.checks)
    # the parameters are the reference key: the reference is the solo request with them
    assert spec.ref_key != RequestSpec(prompt_of([40, 41, 42]), 6).ref_key
    assert apply(RequestSpec(prompt_of([1]), 2), NONE, None).params == {}


def full_spec(stream: bool = True, chat: bool = False) -> RequestSpec:
    """A request with every per-request parameter fuzz writes."""
    s = RequestSpec(prompt_of([20, 21, 22]), 6, stream=stream, logprobs=4, ignore_eos=False,
                    repetition_penalty=0.8, logit_bias=((17, -100.0),), stop_token_ids=(9, 11),
                    min_tokens=2, prompt_logprobs=None if stream else 3)
    if chat:
        s = replace(s, messages=(("user", 'Reply with OK. "the" \u00e9 \\ engine'),))
    return s


def test_every_field_round_trips_through_repro_toml(tmp_path):
    a = FuzzRequest("new", 3, "random", 0, 6, False, "q - 1",
                    features=Features(logprobs=4, prompt_logprobs=3))
    b = FuzzRequest("new", 3, "messages", 1, 6, True, "chat",
                    features=Features(stop_at=1, eos=True))
    sched = Schedule((FuzzPhase(2, (a, b)),))
    specs = [PhaseSpecs([full_spec(stream=False), full_spec(chat=True)])]
    path = tmp_path / "repro.toml"
    write_repro(specs, sched, path, "run1")
    sc = load_scenario_file(str(path))
    got = [Replay._spec(r) for r in sc.params.phases[0].requests]
    for want, g in zip(specs[0].requests, got):
        assert g.params == want.params and g.ref_key == want.ref_key
        assert (g.logprobs, g.stream, g.messages) == (want.logprobs, want.stream, want.messages)
        assert "stop_token" in g.checks
    assert "prompt_logprobs" in got[0].checks and got[1].messages[0][1].endswith("\\ engine")
    assert sched.summary() == "C2[3n+6<lp4,plp3>,3a+6<stop@1,eos>]"
    # fuzz_failing: the drawn features and the parameters as sent, request by request
    rows = failing_rows(sched, specs)
    assert [r.features for r in rows] == ["<lp4,plp3>", "<stop@1,eos>"]
    assert rows[0].params["prompt_logprobs"] == 3 and rows[0].logprobs == 4
    assert rows[1].api == "chat" and rows[1].params["stop_token_ids"] == [9, 11]


REQ = """kind = "replay"
[[params.phases]]
name = "p"
concurrency = 1
[[params.phases.requests]]
prompt = [20, 21]
max_tokens = 4
"""


@pytest.mark.parametrize("extra, msg", [
    ("prompt_logprobs = 2", "prompt_logprobs needs stream = false"),
    ("logprobs = 21", "logprobs"),
    ("min_tokens = 5", "min_tokens 5 exceeds max_tokens 4"),
    ('logit_bias = { "x" = 1.0 }', "key 'x' is not a token ID"),
    ('logit_bias = { "3" = 300.0 }', "outside -100..100"),
    ("stop_token_ids = [-1]", "stop_token_ids"),
    ("repetition_penalty = 0.0", "repetition_penalty"),
    ("frequency_penalty = 3.0", "frequency_penalty"),
    ("echo = true", "echo needs logprobs"),
    ('messages = [{ role = "robot", content = "x" }]', "role"),
    ('messages = [{ role = "user", content = "x" }]\nstream = false', "cannot take stream"),
    ('stop = ["a"]\nmessages = [{ role = "user", content = "x" }]', "cannot take stop"),
    ('structured_outputs = { choice = ["a", "a"] }\nignore_eos = false', "structured_outputs"),
    ('structured_outputs = { regex = "(" }\nignore_eos = false', "does not compile"),
    ('structured_outputs = { grammar = "x" }\nignore_eos = false', "constraint kind 'grammar'"),
    ('structured_outputs = { regex = "a", choice = ["a"] }\nignore_eos = false', "one key"),
    ('structured_outputs = { choice = ["a", "b"] }', "needs ignore_eos = false"),
    ("echo = true\nstream = false", "echo needs logprobs"),
])
def test_a_bad_value_in_a_replay_file_names_the_key(tmp_path, extra, msg):
    path = tmp_path / "r.toml"
    path.write_text(REQ + extra + "\n")
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(str(path))
    assert str(path) in str(e.value) and "params.phases" in str(e.value)
    assert msg in str(e.value)


def test_ids_outside_the_vocabulary_leave_the_phase_out_on_that_engine(tmp_path):
    """Issue 48: a reproducer written on another engine is no usage error there: the phase
    whose request does not fit is left out, vacuous, naming the request and the key."""
    from pleharness.engine.facts import as_facts
    from pleharness.run.dryrun import plan_scenario
    for extra, key in (("stop_token_ids = [793]", "stop_token_ids"),
                       ('logit_bias = { "900" = 5.0 }', "logit_bias")):
        path = tmp_path / "r.toml"
        path.write_text(REQ + extra + "\n")
        sc = load_scenario_file(str(path))
        assert sc.unfit(as_facts(FACTS)) == {
            0: f"params.phases[0].requests[0].{key}: token IDs outside [0, 793)"}
        plan = plan_scenario(sc, FACTS)
        assert plan.error is None and len(plan.load) == plan.planned == 1
        assert plan.load[0].status == "left out" and f"requests[0].{key}" in plan.load[0].vacuous


# -- echo, stop strings, constrained output -------------------------------------------------
def test_fit_keeps_the_new_features_where_vllm_and_the_checks_take_them():
    f = Features(echo=True, stop_str_at=9, stop_at=1, min_tokens=2, constraint=None)
    # a stop string drops stop IDs and min_tokens, is clamped to max_tokens, and echo goes with
    # a streamed request
    assert fit(f, 4, True, "chat") == Features(stop_str_at=3)
    assert fit(f, 4, False, "chat") == Features(echo=True, stop_str_at=3)
    # random token IDs are no text: neither a stop string nor a constraint
    assert fit(f, 4, False, "random") == Features(echo=True, stop_at=1, min_tokens=2)
    assert fit(Features(constraint=2), 4, False, "random") == NONE
    # a constraint wins over a stop string; the chat API takes it, but not a stop string
    g = Features(constraint=1, stop_str_at=0, stop_at=0, min_tokens=1, eos=True)
    assert fit(g, 4, True, "chat") == Features(constraint=1, eos=True)
    assert fit(Features(constraint=0, stop_str_at=0), 4, True, "messages") == \
        Features(constraint=0)


def test_chat_off_leaves_text_features_out_with_a_reason():
    names, notes = allowed(__import__("pleharness.engine.facts", fromlist=["as_facts"])
                           .as_facts({**FACTS, "num_speculative_tokens": 0}), True, False)
    assert not {"stop", "structured", "messages"} & names and "echo" in names
    assert any("stop strings and constrained output left out" in n for n in notes)


class Ctx:
    """A ScenarioContext of a tokenizer where ID i's text is ``T[i]`` (EOS 1 has none)."""

    T = {1: "</s>", 5: " a", 6: " b", 7: " a", 8: "b", 9: " c"}

    class facts:
        eos_token_id = 1

    def detokenize(self, ids):
        return "".join(self.T[i] for i in ids)


def test_a_stop_string_is_taken_from_the_output_without_parameters():
    spec = RequestSpec(prompt_of([20, 21]), 6, note="n")
    # " c" first completes at position 4 (EOS 1 at position 1 has no text in a completion)
    got = apply(spec, Features(stop_str_at=4), [5, 1, 6, 7, 9], Ctx())
    assert got.stop == (" c",) and "stop_string" in got.checks
    assert "stop_token" not in got.checks  # ends with "stop" on no stop ID
    assert got.params["stop"] == [" c"] and "stop_string" not in spec.checks
    # " a" at position 3 occurred before (position 0): " b a" is the first that completes there
    assert apply(spec, Features(stop_str_at=3), [5, 1, 6, 7, 9], Ctx()).stop == (" b a",)
    # none completes only at that position (EOS has no text; "</s>b" would only complete there
    # in a text with EOS in it, which no completion has), or no output there: dropped, and the
    # note says why
    for ids, j in (([5, 1], 1), ([6, 1, 8], 2), ([5], 3)):
        none = apply(spec, Features(stop_str_at=j, logprobs=2), ids, Ctx())
        assert none.stop is None and "stop_string" not in none.checks
        assert "stop string dropped" in none.note and none.logprobs == 2


def test_echo_and_a_constraint_are_sent_and_judged():
    spec = RequestSpec(prompt_of([20, 21]), 6, stream=False)
    e = apply(spec, Features(echo=True), None)
    assert e.params == {"echo": True} and e.logprobs == 1  # echo's scores come with logprobs
    assert "prompt_logprobs" in e.checks and e.ref_key != spec.ref_key
    both = apply(spec, Features(echo=True, prompt_logprobs=0, logprobs=3), None)
    assert both.params == {"echo": True, "prompt_logprobs": 0} and both.logprobs == 3
    c = apply(spec, Features(constraint=3), None)
    assert c.structured == CONSTRAINTS[3] and c.params["ignore_eos"] is False
    assert {"constrained", "stop_token"} <= set(c.checks)
    assert c.params["structured_outputs"] == {"regex": CONSTRAINTS[3][1]}
    assert apply(spec, Features(constraint=1), None).params["structured_outputs"] == \
        {"choice": ["red", "green", "blue"]}
    assert Features(echo=True, stop_str_at=2, constraint=1).tag() == \
        '<echo,stop"..."@2,choice1>'


def test_the_constrained_probe_gates_the_feature():
    import types

    class Client:
        def __init__(self, text):
            self.text = text

        def tokenize(self, prompt=None, **kw):
            return [3, 4]

        def complete(self, *a, **kw):
            return types.SimpleNamespace(error=None, text=self.text, finish_reason="stop")
    names = frozenset({"echo", "structured"})
    ok = types.SimpleNamespace(client=Client("ple harness probe"))
    assert gate(ok, names) == (names, [])
    got, notes = gate(types.SimpleNamespace(client=Client("whatever")), names)
    assert got == {"echo"} and "constrained output left out" in notes[0]
    assert "ignores structured_outputs" in notes[0]


@pytest.mark.parametrize("con", [("choice", ("yes", "no")), ("regex", '[0-9]{3} "x" \\d'),
                                 ("json", {"type": "string", "enum": ["x", "yy"]})])
def test_new_features_round_trip_through_repro_toml(tmp_path, con):
    a = RequestSpec(prompt_of([20, 21, 22]), 6, stream=False, logprobs=1, echo=True,
                    prompt_logprobs=2)
    b = RequestSpec(prompt_of([30, 31]), 6, ignore_eos=False, stop=(' 7 "8',))
    c = RequestSpec(prompt_of([40, 41]), 6, ignore_eos=False, structured=con)
    feats = (Features(echo=True, prompt_logprobs=2), Features(stop_str_at=4),
             Features(constraint=0))
    reqs = [FuzzRequest("new", n, "chat", 0, 6, s.stream, "q", features=f) for n, s, f in
            ((3, a, feats[0]), (2, b, feats[1]), (2, c, feats[2]))]
    sched = Schedule((FuzzPhase(3, tuple(reqs)),))
    path = tmp_path / "repro.toml"
    write_repro([PhaseSpecs([a, b, c])], sched, path, "run1")
    sc = load_scenario_file(str(path))
    got = [Replay._spec(r) for r in sc.params.phases[0].requests]
    for want, g in zip((a, b, c), got):
        assert g.params == want.params and g.ref_key == want.ref_key, toml_lines(want)
    assert "prompt_logprobs" in got[0].checks and got[0].echo
    assert "stop_string" in got[1].checks and "stop_token" not in got[1].checks
    assert got[2].structured == con and "constrained" in got[2].checks
    # the description quotes the summary (a stop string's tag has quotes: TOML must still read)
    assert sc.description == 'fuzz run1: C3[3hn+6<plp2,echo>,2h+6<stop"..."@4>,2h+6<choice0>]'




def test_a_bad_replay_file_is_a_usage_error_on_the_command_line(tmp_path):
    from conftest import run_cli
    path = tmp_path / "r.toml"
    path.write_text(REQ + 'structured_outputs = { choice = ["a", "b"] }\n')
    r = run_cli("scenarios", "--check", str(path), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs ignore_eos = false" in r.stdout + r.stderr


def test_a_feature_of_value_zero_is_present():
    # 0 == False in Python: a request whose only feature is stop_at=0 (the shrink target of a
    # stop ID) or prompt_logprobs=0 was taken for a plain one and sent without it
    for f in (Features(stop_at=0), Features(prompt_logprobs=0), Features(constraint=0),
              Features(stop_str_at=0)):
        assert f, f
    assert apply(RequestSpec(prompt_of([3, 4]), 2), Features(stop_at=0), [9]).params == {
        "stop_token_ids": [9]}
    assert not NONE
