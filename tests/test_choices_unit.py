"""Unit tests (no engine) of issue 35 item 2: grouping choice specs into requests, the
``choices`` check's rules on hand-made choices, the ``usage`` check on a non-streamed choice,
the scenario's parameters and its left-out rules, and the client's reading of an answer for n
choices (from a local HTTP double)."""
import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from pleharness.checks.choices import check as choices_check
from pleharness.checks.usage import check as usage_check
from pleharness.engine.choices import ChoiceCompletion, acomplete_choices
from pleharness.engine.client import EngineClient
from pleharness.errors import UsageError
from pleharness.manifest import ReferenceRecord
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.run.choices import plan, ungroup
from pleharness.scenarios.choices import Choices, ChoicesParams, version_tuple

P = Prompt("p", (5, 6, 7))


def choices(n, seed=None, temperature=0.0, **kw):
    base = RequestSpec(P, 4, temperature=temperature, seed=seed, **kw)
    return [replace(base, n=n, choice=i, seed=None if seed is None else seed + i)
            for i in range(n)]


def groups_of(specs):
    return plan("ph", specs, None, None, lambda s: {}, None)[0]


def test_choice_specs_group_into_one_request_each():
    one = RequestSpec(P, 4)
    specs = [one, *choices(2, seed=10, temperature=1.0), one, *choices(3)]
    assert groups_of(specs) == [[0], [1, 2], [3], [4, 5, 6]]
    assert ungroup([[0], [1, 2]], [["a"], ["b", "c"]], 3) == ["a", "b", "c"]
    assert ungroup([[0], [1, 2]], [["a"], None], 3) == ["a", None, None]
    # a seeded choice is compared with the single request of its own (derived) seed; n and
    # the choice index are no part of the reference key
    two = choices(2, seed=10, temperature=1.0)
    alone = RequestSpec(P, 4, temperature=1.0, seed=11)
    assert two[1].ref_key == alone.ref_key != two[0].ref_key
    assert choices(3)[2].ref_key == RequestSpec(P, 4).ref_key


@pytest.mark.parametrize("bad,why", [
    (lambda c: c[:1], "only 1 spec(s) left for n = 2"),
    (lambda c: [c[1], c[0]], "is choice 1, expected 0"),
    (lambda c: [c[0], replace(c[1], seed=99)], "seed must be the request's seed + its index"),
    (lambda c: [c[0], replace(c[1], max_tokens=5)], "differs from choice 0"),
    (lambda c: [replace(x, messages=(("user", "hi"),)) for x in c], "chat, abandoned"),
])
def test_choices_that_cannot_form_one_request_are_refused(bad, why):
    with pytest.raises(UsageError) as e:
        groups_of(bad(choices(2, seed=10, temperature=1.0)))
    assert "phase ph: the choices of request p (n = 2)" in str(e.value) and why in str(e.value)
    with pytest.raises(UsageError, match="custom issue function"):
        plan("ph", choices(2), lambda s: None, None, lambda s: {}, None)


def answer(ids_per_choice, prompt_tokens=3, completion_tokens=None, streamed=True):
    outs = [ChoiceCompletion(token_ids=list(ids), finish_reason="length", index=i,
                             n=len(ids_per_choice), prompt_tokens=prompt_tokens,
                             completion_tokens=len(ids) if streamed else None, streamed=streamed,
                             request_prompt_tokens=prompt_tokens,
                             request_completion_tokens=completion_tokens if completion_tokens
                             is not None else sum(map(len, ids_per_choice)))
            for i, ids in enumerate(ids_per_choice)]
    for o in outs:
        o.siblings = outs
    return outs


def ctx_with(refs):
    return SimpleNamespace(references=refs, facts=SimpleNamespace(max_model_len=None))


def ref(ids):
    from pleharness.parity import token_hash
    return ReferenceRecord(prompt_key="p", prompt_hash=P.hash, prompt_len=3, max_tokens=4,
                           output_hash=token_hash(ids), output_ids=list(ids))


def test_usage_must_count_the_prompt_once_and_every_choice():
    specs = choices(3)
    ok = answer([[1, 2, 3, 4]] * 3)
    r = choices_check(ctx_with({}), specs[0], ok[0], {})
    assert r.status == "pass" and "request usage 3 + 12" in r.detail
    bad = answer([[1, 2, 3, 4]] * 3, completion_tokens=4)
    r = choices_check(ctx_with({}), specs[0], bad[0], {})
    assert r.status == "fail"
    assert "usage counts every choice: usage.completion_tokens 4 != 12" in r.detail
    # judged once per request: on choice 0
    assert choices_check(ctx_with({}), specs[1], bad[1], {}).status == "pass"
    tripled = answer([[1, 2, 3, 4]] * 3, prompt_tokens=9)
    r = choices_check(ctx_with({}), specs[0], tripled[0], {})
    assert "usage.prompt_tokens 9 != the prompt's 3 (counted once; 3 x 3 = 9)" in r.detail
    missing = answer([[1, 2, 3, 4]] * 3)
    missing[2].error = "protocol"
    r = choices_check(ctx_with({}), specs[0], missing[0], {})
    assert r.status == "fail" and "every choice: choice(s) [2]" in r.detail
    assert choices_check(ctx_with({}), RequestSpec(P, 4), ok[0], {}).status == "skip"


def test_a_seeded_clone_fails_unless_the_seeds_agree_alone():
    specs = choices(3, seed=100, temperature=1.0)
    a, b = [1, 2, 3, 4], [9, 8, 7, 6]
    refs = {specs[0].ref_key: ref(a), specs[1].ref_key: ref(b), specs[2].ref_key: ref(a)}
    cloned = answer([a, a, a])
    r = choices_check(ctx_with(refs), specs[1], cloned[1], {})
    assert r.status == "fail"
    assert ("seeded choices differ: choice 1 repeats choice 0's 4 IDs, while seeds 101 and 100 "
            "give different samples alone (a clone)") in r.detail
    # seeds 102 and 100 sample the same IDs alone: equal choices are then no clone
    r = choices_check(ctx_with(refs), specs[2], cloned[2], {})
    assert r.status == "fail" and "choice 2 repeats choice 1's" in r.detail
    assert "choice 2 repeats choice 0's" not in r.detail
    fine = answer([a, b, a])
    assert choices_check(ctx_with(refs), specs[2], fine[2], {}).status == "pass"
    # uncompared (seeds not reproducible): distinctness is not judged
    loose = [replace(s, compare=False) for s in specs]
    assert choices_check(ctx_with({}), loose[1], cloned[1], {}).status == "pass"


def test_usage_check_on_a_non_streamed_choice_leaves_the_count_to_choices():
    (s, *_), (c, *_) = choices(2), answer([[1, 2, 3, 4]] * 2, streamed=False)
    assert usage_check(None, s, c, {}).status == "pass"
    c.prompt_tokens = 6
    assert "usage.prompt_tokens 6 != intended 3" in usage_check(None, s, c, {}).detail


def test_scenario_parameters_and_what_it_leaves_out():
    with pytest.raises(ValueError, match="each n must be between 2 and 128"):
        ChoicesParams(n=[1, 2])
    with pytest.raises(ValueError, match="no request to send"):
        ChoicesParams(prompts=0, seeded=0)
    sc = Choices("choices", ChoicesParams(), "choices.toml")
    # issue 48: prompts shortened to fit max_model_len, never an error; none fits: left out
    assert sc.prompt_lengths({"max_model_len": 50}) == (8, 34)
    assert sc.prompt_lengths({"max_model_len": 16}) is None
    assert sc.prompt_lengths({}) == (8, 40)
    assert sc.unsafe_sampling({"num_speculative_tokens": 0}) is None
    assert sc.unsafe_sampling({"num_speculative_tokens": 3, "device_type": "cuda"}) is None
    assert "a CPU engine with speculative decoding (k = 3)" in sc.unsafe_sampling(
        {"num_speculative_tokens": 3, "device_type": "cpu"})
    assert "unknown device type" in sc.unsafe_sampling({"num_speculative_tokens": 3})
    forced = Choices("choices", ChoicesParams(sampled_with_spec_decode=True), "x")
    assert forced.unsafe_sampling({"num_speculative_tokens": 3, "device_type": "cpu"}) is None
    assert version_tuple("0.32.0") == (0, 32) and version_tuple("v0.7.3+cpu") == (0, 7)
    assert version_tuple(None) is None


class _Answers(BaseHTTPRequestHandler):
    """A server double answering one request for n choices as vLLM 0.32.0 does (measured):
    streamed, one choice a chunk with its own continuous usage, then the request's usage."""

    protocol_version = "HTTP/1.1"
    bodies: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.bodies.append(body)
        n, ids = body["n"], [[10, 11], [20, 21], [30, 31]]
        if not body["stream"]:
            data = {"choices": [{"index": i, "token_ids": ids[i], "text": "x",
                                 "finish_reason": "length"} for i in reversed(range(n))],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n}}
            raw = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        events = []
        for pos in range(2):
            for i in range(n):
                events.append({"choices": [{"index": i, "token_ids": [ids[i][pos]], "text": "x",
                                            "finish_reason": "length" if pos else None}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": pos + 1}})
        events.append({"choices": [], "usage": {"prompt_tokens": 3,
                                                "completion_tokens": 2 * n}})
        raw = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        raw = raw.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.mark.parametrize("stream", [True, False])
def test_the_client_reads_every_choice_into_its_own_completion(stream):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    client = EngineClient(f"http://127.0.0.1:{srv.server_address[1]}", model="m")
    try:
        outs = client._run(acomplete_choices(client, [1, 2, 3], 2, 3, stream=stream))
    finally:
        client.close()
        srv.shutdown()
    body = _Answers.bodies[-1]
    # greedy choices go as top-1 sampling: vLLM refuses n > 1 at temperature 0
    assert body["n"] == 3 and body["temperature"] == 1.0 and body["top_k"] == 1
    assert [o.token_ids for o in outs] == [[10, 11], [20, 21], [30, 31]]
    assert all(o.error is None and o.finish_reason == "length" for o in outs)
    assert all(o.request_prompt_tokens == 3 and o.request_completion_tokens == 6 for o in outs)
    assert [o.completion_tokens for o in outs] == ([2, 2, 2] if stream else [None] * 3)
    assert outs[1].siblings is outs
