"""Issue 16: response invariants and the schedules the default suite never sent (identical prompts
in flight, seeded sampling, non-streamed requests, max_tokens residues mod q).

Unit tests of the checks on hand-made completions; then the FakeEngine (no model) for the client's
non-streamed path; then, marked ``engine``, planted faults through a FaultProxy in front of the real
CPU engine (tests/doubles.py): every fault must fail the run and name the request and the rule.
"""
import math

import pytest

from conftest import engine_fixture, load_json, run_cli
from doubles import (CorruptConfident, FakeEngine, FaultProxy, Reseed, SentinelLogprobs,
                     StopAtBlock, TruncatePrompt)
from pleharness.checks import DEFAULT_CHECKS, REGISTRY
from pleharness.checks.logprob_sanity import real_logprob, sane_top_logprobs
from pleharness.divergence import margins
from pleharness.engine.client import EngineClient
from pleharness.engine.completion import Completion
from pleharness.engine.facts import EngineFacts
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec


class Ctx:
    def __init__(self, m=None):
        self.facts = EngineFacts({"vocab_size": 100, **({"max_model_len": m} if m else {})}, {})
        self.references = {}


def spec(max_tokens=3, n=3, **kw):
    return RequestSpec(Prompt("p", tuple(range(16, 16 + n))), max_tokens, **kw)


def comp(ids, logprobs=None, chosen=None, finish="length", pt=3, ct=None, **kw):
    return Completion(token_ids=list(ids), finish_reason=finish, prompt_tokens=pt,
                      completion_tokens=len(ids) if ct is None else ct, logprobs=logprobs,
                      token_logprobs=chosen, **kw)


def run(name, c, s=None, params=None, ctx=None):
    return REGISTRY[name](ctx or Ctx(), s or spec(), c, params or {})


# -- item 2: logprob sanity ------------------------------------------------------------------------

def test_logprob_sanity_is_a_default_check_and_keeps_its_old_name():
    assert "logprob_sanity" in DEFAULT_CHECKS and "logprobs_finite" not in DEFAULT_CHECKS
    assert REGISTRY["logprobs_finite"] is REGISTRY["logprob_sanity"]


def test_logprob_sanity_passes_a_sane_greedy_answer():
    c = comp([5, 6, 7], [{5: -0.1, 9: -2.5}, {6: -0.01, 5: -4.0}, {7: -1.0, 8: -1.0}],
             [-0.1, -0.01, -1.0])
    r = run("logprob_sanity", c)
    assert r.status == "pass", r.detail


def test_sentinel_entries_fail_and_name_the_position():
    # the trigger: one real entry, then -9999.0 on token ids 0, 1, ...
    c = comp([5, 6, 7], [{5: -0.1, 9: -2.5}, {6: -0.2, 0: -9999.0}, {7: -0.3, 0: -9999.0}],
             [-0.1, -0.2, -0.3])
    r = run("logprob_sanity", c)
    assert r.status == "fail"
    assert "sentinel" in r.detail and "position 1" in r.detail and "0: -9999.0" in r.detail
    for bad in (math.nan, math.inf, -math.inf, None, 0.5):
        r = run("logprob_sanity", comp([5], [{5: -0.1, 9: bad}], [-0.1], ct=1), spec(1))
        assert r.status == "fail" and "position 0" in r.detail, bad


def test_top_candidates_are_ranked_by_value_not_by_key_order():
    # issue 24: JSON objects are unordered; a proxy that reorders keys changes nothing
    for top in ({5: -0.1, 9: -3.0, 4: -1.0}, {9: -3.0, 4: -1.0, 5: -0.1}, {4: -1.0, 5: -0.1}):
        r = run("logprob_sanity", comp([5], [top], [-0.1]), spec(1))
        assert r.status == "pass", (top, r.detail)
    # reordered keys hide no rule: greedy top-1 by value, sentinels, the emitted token's entry
    r = run("logprob_sanity", comp([5], [{9: -0.2, 5: -2.0}], [-2.0]), spec(1))
    assert r.status == "fail" and "greedy but emitted token 5 (-2.0000) is not top-1 (-0.2000)" \
        in r.detail
    r = run("logprob_sanity", comp([5], [{0: -9999.0, 5: -0.1}], [-0.1]), spec(1))
    assert r.status == "fail" and "sentinel" in r.detail
    assert margins([{9: -3.0, 4: -1.0, 5: -0.1}, {4: -1.0, 5: -0.1, 9: -3.0}]) == [0.9, 0.9]


def test_emitted_token_logprob_must_equal_its_entry_and_be_listed():
    r = run("logprob_sanity", comp([5], [{5: -0.1, 9: -3.0}], [-0.7]), spec(1))
    assert r.status == "fail" and "logprob -0.7 != its candidate entry -0.1" in r.detail
    r = run("logprob_sanity", comp([5], [{8: -0.1, 9: -3.0}], [-0.1]), spec(1))
    assert r.status == "fail" and "emitted token 5 missing" in r.detail


def test_greedy_emitted_token_must_be_top1_sampled_need_not():
    # vLLM lists the emitted token first, then the top-k (when it is not one of them)
    c = comp([5], [{5: -2.0, 9: -0.2, 4: -1.9}], [-2.0])
    r = run("logprob_sanity", c, spec(1))
    assert r.status == "fail" and "greedy but emitted token 5" in r.detail
    r = run("logprob_sanity", c, spec(1, temperature=1.0, seed=3))
    assert r.status == "pass", r.detail
    # a tie within the tolerance is top-1
    assert run("logprob_sanity", comp([5], [{9: -0.5, 5: -0.5}], [-0.5]), spec(1)).status == "pass"


def test_margins_ignore_sentinels():
    assert real_logprob(-1.0) and not real_logprob(-9999.0) and not real_logprob(math.nan)
    assert sane_top_logprobs({1: -0.5, 0: -9999.0, 2: None}) == {1: -0.5}
    # one real entry and sentinels: no margin (never a hard 9998-nat one), two sentinels: none
    assert margins([{5: -0.1, 0: -9999.0}, {0: -9999.0, 1: -9999.0}, {5: -0.1, 6: -0.3}]) == \
        [None, None, 0.2]


# -- items 3, 6, 7: accounting --------------------------------------------------------------------

def test_usage_catches_too_few_or_too_many_ids_in_both_modes():
    s = spec(35)
    short = comp(range(32), finish="length")  # stopped at a block boundary, q = 4
    for streamed in (True, False):
        short.streamed = streamed
        r = run("usage", short, s)
        assert r.status == "fail" and "only 32 of max_tokens=35 IDs" in r.detail
        assert ("(non-streamed)" in r.detail) is (not streamed)
    r = run("usage", comp(range(32), finish="stop"), s)
    assert r.status == "fail" and "only 32 of max_tokens=35" in r.detail
    r = run("usage", comp(range(36)), s)
    assert r.status == "fail" and "more than max_tokens=35" in r.detail
    # reaching max_model_len is the one legitimate short "length"
    assert run("usage", comp(range(32)), s, ctx=Ctx(m=35)).status == "pass"


def test_edge_check_expects_the_versions_answer_and_the_prompt_on_200():
    from pleharness.checks.max_model_len_edge import policy_for
    assert policy_for("0.26.0") == "reject" and policy_for("0.32.0") == "clamp"
    assert policy_for("0.26.0+ple.1") == "reject" and policy_for("v0.40.1") == "clamp"
    assert policy_for("0.29.1") is None and policy_for("fake") is None and policy_for(None) is None
    m, ctx = 64, Ctx(m=64)
    v32, v26 = {"version": "0.32.0"}, {"version": "0.26.0"}
    whole = spec(8, n=m)
    cut = comp(range(8), pt=m // 2 + 2)  # the trigger: answered 200, front cut away
    for v in (v32, v26):
        r = run("max_model_len_edge", cut, whole, v, ctx)
        assert r.status == "fail" and f"saw {m // 2 + 2} of {m} prompt tokens" in r.detail
    rej = Completion(error="http", http_status=400, error_detail="HTTP 400: too long")
    assert run("max_model_len_edge", rej, whole, v32, ctx).status == "pass"
    # L + T = M + 1: 0.26 rejects, 0.32 clamps to M - L = 7 tokens; the other answer fails
    over = spec(8, n=m - 7)
    clamped = comp(range(7), pt=m - 7)
    assert run("max_model_len_edge", clamped, over, v32, ctx).status == "pass"
    assert run("max_model_len_edge", rej, over, v26, ctx).status == "pass"
    r = run("max_model_len_edge", clamped, over, v26, ctx)
    assert r.status == "fail" and "expected a 4xx rejection: vLLM 0.26.0 rejects" in r.detail
    r = run("max_model_len_edge", rej, over, v32, ctx)
    assert r.status == "fail" and "vLLM 0.32.0 clamps" in r.detail
    r = run("max_model_len_edge", comp(range(8), pt=m - 7), over, v32, ctx)
    assert r.status == "fail" and "8 IDs with finish_reason 'length', expected 7" in r.detail
    # an unmeasured version: either form, as a warning; a truncated prompt still fails
    assert run("max_model_len_edge", rej, over, {"version": "0.29.0"}, ctx).status == "warn"
    assert run("max_model_len_edge", clamped, over, {"version": "0.29.0"}, ctx).status == "warn"
    r = run("max_model_len_edge", comp(range(7), pt=m // 2), over, {"version": "0.29.0"}, ctx)
    assert r.status == "fail" and f"usage.prompt_tokens {m // 2} != {m - 7} sent" in r.detail
    # requests that fit: 200 with T tokens and the prompt that was sent
    fits = spec(8, n=m - 8)
    assert run("max_model_len_edge", comp(range(8), pt=m - 8), fits, v32, ctx).status == "pass"
    r = run("max_model_len_edge", comp(range(8), pt=m - 9), fits, v32, ctx)
    assert r.status == "fail" and f"usage.prompt_tokens {m - 9} != {m - 8} sent" in r.detail
    r = run("max_model_len_edge", rej, fits, v32, ctx)
    assert r.status == "fail" and "for a request that fits" in r.detail
    r = run("max_model_len_edge", Completion(error="http", http_status=500), fits, v32, ctx)
    assert r.status == "fail"


# -- items 5, 6: reference keys and the client ----------------------------------------------------

def test_reference_key_includes_sampling_not_streaming():
    g, g_plain = spec(8), spec(8, stream=False)
    s1, s2 = spec(8, temperature=1.0, seed=1), spec(8, temperature=1.0, seed=2)
    assert g.ref_key == g_plain.ref_key
    assert len({g.ref_key, s1.ref_key, s2.ref_key}) == 3
    assert spec(8, temperature=1.0, seed=1, stream=False).ref_key == s1.ref_key


def test_client_non_streamed_equals_streamed_on_the_double():
    with FakeEngine() as eng:
        cl = EngineClient(eng.url, FakeEngine.MODEL)
        a = cl.complete([20, 21, 22], 7, logprobs=2)
        b = cl.complete([20, 21, 22], 7, logprobs=2, stream=False, seed=5)
        assert a.error is None and b.error is None, (a.error_detail, b.error_detail)
        assert a.streamed and not b.streamed
        assert b.token_ids == a.token_ids and len(b.token_ids) == 7
        assert b.logprobs == a.logprobs and len(b.logprobs) == 7
        assert (b.finish_reason, b.prompt_tokens, b.completion_tokens) == ("length", 3, 7)
        assert b.ttft_s is None and a.ttft_s is not None


# -- the ladder's new requests (no engine needed to plan them) ------------------------------------

def test_transitions_plans_residues_and_seeds():
    from pleharness.scenarios.base import load_scenario_file
    sc = load_scenario_file("transitions")
    prompts = [Prompt(f"p{i}", tuple(range(16, 21 + i))) for i in range(8)]
    spec_dec = [sc.request_for(i, pr, 4) for i, pr in enumerate(prompts)]
    assert sorted({s.max_tokens % 4 for s in spec_dec}) == [0, 1, 2, 3]
    assert not any(s.temperature for s in spec_dec)  # seeds are not reproducible with spec decode
    plain = [sc.request_for(i, pr, 1) for i, pr in enumerate(prompts)]
    assert {s.max_tokens for s in plain} == {32}
    seeded = [s for s in plain if s.temperature > 0]
    assert len(seeded) == 2 and len({s.seed for s in seeded}) == 2
    assert all("seeded sample" in s.note and len(s.prompt) == 1 for s in seeded)  # never split
    assert [sc.request_for(i, pr, None).max_tokens for i, pr in enumerate(prompts)] == [32] * 8
    assert not any(sc.request_for(i, pr, None).seed for i, pr in enumerate(prompts))  # k unknown
    sc.params.sampled_with_spec_decode = True
    assert len([s for i, pr in enumerate(prompts) if (s := sc.request_for(i, pr, 4)).seed]) == 2


class _Manifest:
    def __init__(self):
        self.tables = {}


class _Ctx:
    """Records the phases a scenario issues (no engine)."""

    def __init__(self, facts, reference_mode="solo"):
        self.reference_mode = reference_mode
        self.facts = EngineFacts(facts, {})
        self.references = {}
        self.phases = []
        self.manifest = _Manifest()
        self.engine_probe = None

    def note(self, table, texts, echo=False):
        texts = [texts] if isinstance(texts, str) else list(texts)
        self.manifest.tables.setdefault(table, []).extend({"note": t} for t in texts)

    def run_phase(self, name, c, specs, **kw):
        self.phases.append((name, c, list(specs)))
        return []

    def take_references(self, specs, **kw):
        self.refs = list(specs)


@pytest.mark.parametrize("k", [3, 0, None])
def test_transitions_ladder_sends_the_new_schedules(k):
    from pleharness.scenarios.base import load_scenario_file
    sc = load_scenario_file("transitions")
    facts = {"vocab_size": 500, "max_model_len": 1024}
    ctx = _Ctx(facts if k is None else {**facts, "num_speculative_tokens": k})
    sc.run(ctx)
    ladder = [p for p in ctx.phases if p[0].startswith("r")]
    assert len(ladder) == 16 and all(len(s) == 2 * c for _, c, s in ladder)
    for name, c, specs in ladder:
        if c >= 2:  # the first two requests are identical and start together
            a, b = specs[0], specs[1]
            assert (a.prompt, a.max_tokens, a.temperature, a.seed, a.stream) == \
                   (b.prompt, b.max_tokens, b.temperature, b.seed, b.stream)
            assert "identical copy in flight" in b.note
    every = [s for _, _, specs in ladder for s in specs]
    by_prompt: dict = {}
    for s in every:
        by_prompt.setdefault(s.prompt.key, set()).add(s.stream)
    assert all(modes == {True, False} for modes in by_prompt.values())  # each prompt, both modes
    assert 0.35 < sum(not s.stream for s in every) / len(every) < 0.65
    assert all(s.ref_key in {r.ref_key for r in ctx.refs} for s in every)
    assert all(r.stream for r in ctx.refs)
    seeded = [(s, c) for _, c, specs in ladder for s in specs if s.temperature > 0]
    notes = ctx.manifest.tables.get("transitions_notes", [])
    if k:
        assert {s.max_tokens % (k + 1) for s in every} == set(range(k + 1))
        assert not seeded and "seeded sampled requests left out" in notes[0]["note"]
    elif k is None:
        assert {s.max_tokens for s in every} == {32} and not seeded
        assert "number of speculative tokens is unknown" in notes[0]["note"]
    else:
        assert {c for _, c in seeded} == {1, 2, 3, 4} and not notes  # at every concurrency


def test_no_seeded_samples_against_a_greedy_golden_reference():
    from pleharness.scenarios.base import load_scenario_file
    sc = load_scenario_file("transitions")
    ctx = _Ctx({"vocab_size": 500, "num_speculative_tokens": 0, "max_model_len": 1024}, "golden")
    sc.run(ctx)
    assert not any(s.temperature for _, _, specs in ctx.phases for s in specs)
    assert "golden decodes greedily" in ctx.manifest.tables["transitions_notes"][0]["note"]


def test_malformed_non_streamed_answer_is_a_protocol_error(tmp_path):
    # FakeEngine: C2 phase = requests 21-24; 23 is the first non-streamed ladder request
    with FakeEngine(lambda k, body: "malformed" if body.get("stream") is False else None) as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id", "nm",
                    "--scenario", "transitions", "--ladder", "2,1", "--repeats", "1",
                    "--max-tokens", "8", "--vocab-size", "600", timeout=120)
    m = load_json(tmp_path / "nm" / "manifest.json")
    assert r.returncode == 1, (r.stdout + r.stderr)[-2000:]
    bad = [q for q in m["requests"] if q["error"]]
    assert bad and all(q["error"] == "protocol" and q["error_detail"].startswith(
        "malformed JSON response") and "non-streamed" in q["note"] for q in bad)
    assert len(bad) == len([q for q in m["requests"] if "non-streamed" in (q["note"] or "")])


# -- planted faults in front of the real CPU engine ------------------------------------------------
# The session engine (tests/conftest.py cpu_engine): profiles/cpu-ngram.toml, ngram speculative
# decoding k = 3 (q = 4), block size 32, max_num_batched_tokens 256, prefix caching.
C, B, K = 256, 32, 3
Q = 1 + K
FACTS = ["--block-size", str(B), "--chunk-size", str(C), "--num-speculative-tokens", str(K)]


def stress_via(url, tmp_path, run_id, *args, facts=FACTS):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *facts, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def failed(q, rule):
    return [c for c in q["checks"] if c["name"] == rule and c["status"] == "fail"]


def named(out, q, rule):
    """The console's failing-requests table names the request and the rule."""
    return q["id"] in out and rule in out


@pytest.mark.engine
def test_sentinel_logprobs_fail_logprob_sanity(cpu_engine, tmp_path):
    # item 2: answers given while 3+ requests are in flight: one real top entry, then -9999.0
    fault = SentinelLogprobs(lambda ctx: ctx.in_flight >= 3)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy.url, tmp_path, "sentinel", "--scenario", "transitions",
                               "--ladder", "4,1", "--repeats", "1")
    assert fault.hits, "the double planted nothing"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if failed(q, "logprob_sanity")]
    assert len(bad) == len(fault.hits)
    for q in bad:
        assert q["concurrency"] == 4 and q["match"] is not False  # the tokens themselves are right
        detail = failed(q, "logprob_sanity")[0]["detail"]
        assert "sentinel/non-finite logprob in top candidates" in detail and "-9999.0" in detail
    assert named(out, bad[0], "logprob_sanity")
    # no other request failed: a clean answer's logprobs are sane (greedy top-1, sorted, ...)
    assert all(not failed(q, "logprob_sanity") for q in m["requests"] if q["concurrency"] == 1)


@pytest.mark.engine
def test_prompt_of_m_tokens_answered_200_with_a_cut_prompt_fails(cpu_engine, tmp_path):
    # item 3: the proxy forwards only the last M/2 + 2 tokens of a prompt of M tokens (or more)
    M = 1024
    fault = TruncatePrompt(lambda ctx: len(ctx.body["prompt"]) >= M, lambda n: M // 2 + 2)
    sc = tmp_path / "edges.toml"
    sc.write_text('kind = "boundary"\n[params]\ndepth = 1\ncontrols = false\n'
                  'cold_warm = false\n')
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy.url, tmp_path, "edge", "--scenario", str(sc))
    assert fault.hits, "the double planted nothing"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    edges = m["tables"]["max_model_len_edges"]
    assert [e["check"] for e in edges] == ["pass", "pass", "pass", "fail"]
    assert edges[3]["prompt_len"] == M and edges[3]["http_status"] == 200
    (q,) = [q for q in m["requests"] if failed(q, "max_model_len_edge")]
    assert q["prompt_len"] == M and q["prompt_tokens"] == M // 2 + 2
    assert f"the engine saw {M // 2 + 2} of {M} prompt tokens" in \
        failed(q, "max_model_len_edge")[0]["detail"]
    assert named(out, q, "max_model_len_edge")
    # the engine's version (0.32.0) clamps max_tokens at M + 1: 200 with M - L tokens, passing
    assert m["engine"]["version"] == "0.32.0"
    assert edges[2]["http_status"] == 200 and edges[2]["output_len"] == 7


@pytest.mark.engine
def test_second_of_two_identical_in_flight_corrupted_fails(cpu_engine, tmp_path):
    # item 4: corrupt a request that arrives while an identical prompt is in flight, from its first
    # confidently decided position >= 2 (so the divergence is hard on any machine)
    fault = CorruptConfident(lambda ctx: ctx.twins_in_flight >= 1, start=2)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy.url, tmp_path, "twins", "--scenario", "transitions",
                               "--ladder", "3,2,1", "--repeats", "1")
    assert fault.hits, "the default ladder never had identical prompts in flight"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if q["match"] is False]
    assert len(bad) == len(fault.hits)
    hit_pos = sorted(p for _, p in fault.hits)
    assert sorted(q["first_divergence"] for q in bad) == hit_pos
    for q in bad:  # one of two identical requests of its phase (whichever arrived second)
        twins = [x for x in m["requests"] if x["phase"] == q["phase"]
                 and x["prompt_hash"] == q["prompt_hash"]]
        assert len(twins) == 2 and any("identical copy in flight" in x["note"] for x in twins)
        assert q["concurrency"] >= 2
        assert failed(q, "parity") and q["divergence"]["class"] == "hard"
    assert named(out, bad[0], "parity")


@pytest.mark.engine
def test_non_streamed_answer_differing_from_streamed_fails(cpu_engine, tmp_path):
    # item 6: non-streamed answers given while others are in flight are corrupted
    fault = CorruptConfident(lambda ctx: not ctx.streamed and ctx.in_flight >= 2, start=3)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy.url, tmp_path, "plain", "--scenario", "transitions",
                               "--ladder", "4,1", "--repeats", "1")
    assert fault.hits, "the default ladder sent no non-streamed request"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if q["match"] is False]
    assert len(bad) == len(fault.hits) and all("non-streamed" in q["note"] for q in bad)
    assert all(failed(q, "parity") and q["divergence"]["class"] == "hard" for q in bad)
    assert named(out, bad[0], "parity")
    # the clean non-streamed answers (at C1) equal their streamed references; usage holds on both
    plain_ok = [q for q in m["requests"] if "non-streamed" in (q["note"] or "")
                and q["concurrency"] == 1]
    assert plain_ok and all(q["match"] is True for q in plain_ok)
    assert all(not failed(q, "usage") for q in m["requests"])


@pytest.mark.engine
def test_stop_at_a_speculative_block_boundary_fails_usage(cpu_engine, tmp_path):
    # item 7: the engine stops at the last multiple of q below max_tokens (usage consistent,
    # finish_reason "length"); only max_tokens not divisible by q shows it
    fault = StopAtBlock(Q)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy.url, tmp_path, "block", "--scenario", "transitions",
                               "--ladder", "2,1", "--repeats", "1")
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    ladder = [q for q in m["requests"] if q["phase"].startswith("r1-")]
    assert {q["max_tokens"] % Q for q in ladder} == set(range(Q))  # every residue was sent
    bad = [q for q in m["requests"] if failed(q, "usage")]
    assert bad and {q["max_tokens"] % Q for q in bad} == set(range(1, Q))
    # caught in both delivery modes
    assert {"non-streamed" in (q["note"] or "") for q in bad} == {True, False}
    assert any("(non-streamed)" in failed(q, "usage")[0]["detail"] for q in bad)
    assert all(q["max_tokens"] % Q == 0 for q in m["requests"] if q["scenario"] == "transitions"
               and q["phase"] != "warmup" and not failed(q, "usage"))
    for q in bad:
        cut = q["max_tokens"] - q["max_tokens"] % Q
        assert q["output_len"] == cut and q["finish_reason"] == "length"
        assert f"only {cut} of max_tokens={q['max_tokens']} IDs" in failed(q, "usage")[0]["detail"]
    assert named(out, bad[0], "usage")


cpu_engine_plain = engine_fixture(
    "cpu-engine-plain", ["--block-size", "32", "--max-num-batched-tokens", "256",
                         "--max-num-seqs", "8"], {"VLLM_CPU_KVCACHE_SPACE": "1"}, scope="module",
    doc="The CPU engine without speculative decoding (per-request seeds are reproducible there).")


@pytest.mark.engine
@pytest.mark.nightly
def test_seeded_samples_reproduce_and_a_reseeded_one_fails(cpu_engine_plain, tmp_path):
    # item 5, on the engine without speculative decoding: clean, every seeded request equals its
    # solo reference at every concurrency; then a seeded request answered while others are in
    # flight gets another sample (the proxy changes its seed) and the run fails, naming it
    facts = ["--block-size", str(B), "--chunk-size", str(C), "--num-speculative-tokens", "0"]
    args = ["--scenario", "transitions", "--ladder", "4,3,2,1", "--repeats", "1"]
    r, out, m = stress_via(cpu_engine_plain.url, tmp_path, "seeds-clean", *args,
                           "--engine-probe", facts=facts)
    assert r.returncode == 0, out[-3000:]
    # issue 24 item 4: the engine probe measured that seeds reproduce alone, and that decided
    p = m["engine_probe"]
    assert p["status"] == "measured" and p["seeded_samples_reproduce"] is True
    # alone and in a batch (the 12 seeded prompts in flight together, up to max_num_seqs 8):
    # without speculative decoding each equals its solo sample (36 of 36 over 3 batches,
    # measured 2026-12-02)
    assert p["seeded_samples_reproduce_alone"] is p["seeded_samples_reproduce_in_batch"] is True
    assert p["evidence"]["seeded_samples"]["batch"]["differing"] == 0
    assert all(len(set(e["output_hashes"])) == 1 and e["first_divergence"] is None
               for e in p["evidence"]["seeded_samples"]["prompts"])
    seeded = [q for q in m["requests"] if "seeded sample" in (q["note"] or "")
              and q["phase"].startswith("r1-")]
    cs = {q["concurrency"] for q in seeded}
    assert 1 in cs and len(cs) >= 3
    assert all(q["match"] is True for q in seeded)
    assert {"non-streamed" in q["note"] for q in seeded} == {True, False}
    fault = Reseed(lambda ctx: ctx.in_flight >= 2)
    with FaultProxy(cpu_engine_plain.url, fault) as proxy:
        r, out, m = stress_via(proxy.url, tmp_path, "seeds", *args, facts=facts)
    assert fault.hits, "no seeded request was in flight with others"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if q["match"] is False]
    assert bad and all("seeded sample" in q["note"] and q["concurrency"] >= 2 for q in bad)
    # a sampled divergence is never excused as a near tie
    assert all(failed(q, "parity") and q["divergence"]["fails"] for q in bad)
    assert named(out, bad[0], "parity")
