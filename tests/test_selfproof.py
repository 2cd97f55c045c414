"""Issue 27: a pass that proves itself.

Unit tests on constructed evidence (counters, phases, manifests, chunks), then, marked ``engine``:
speculative acceptance per phase on the session engine (ngram, k = 3) and a ``compare`` that fails
a HEAD whose accepted steps were shortened (tests/faults_spec.py) while every token is right;
``ple-harness selftest`` on the session engine (every class detected, 0 false alarms; a class the
suite cannot see reported missed); an engine with prefix caching off makes the warm half of
``boundary`` vacuous (a warning; ``--strict`` fails it).
"""
import json
import re
import threading
from types import SimpleNamespace

import pytest

from conftest import load_json, run_cli, scenario_variant
from doubles import FaultProxy, RequestCtx
from faults_spec import ShortenAccepted
from pleharness import evidence
from pleharness.compare import Comparison, check_thresholds
from pleharness.compare_spec import gate, parse_spec_threshold
from pleharness.engine import metrics
from pleharness.errors import UsageError
from pleharness.faults import BUILTIN, CORE, FAMILIES
from pleharness.faults.builtin import CutShort, DropDelta, FlipUnderLoad, WrongFinish
from pleharness.manifest import Manifest, PhaseRecord
from pleharness.causes import headline
from pleharness.selftest import headline as selftest_headline
from pleharness.selftest import judge, plan_passes

METRICS = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} %(d)s
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} %(t)s
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} %(a)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} %(p0)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} %(p1)s
vllm:prefix_cache_queries_total{engine="0",model_name="m"} %(q)s
vllm:prefix_cache_hits_total{engine="0",model_name="m"} %(h)s
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
"""


def snap(**kw):
    vals = {"d": 0, "t": 0, "a": 0, "p0": 0, "p1": 0, "q": 0, "h": 0, **kw}
    return metrics.snapshot(SimpleNamespace(metrics_text=lambda: METRICS % vals))


def comp(start, dur):
    return SimpleNamespace(started_at=start, latency_s=dur)


# -- evidence ----------------------------------------------------------------------------------

def test_phase_evidence_from_counter_deltas():
    before = snap(d=10, t=20, a=5, p0=4, p1=1, q=100, h=10)
    after = snap(d=20, t=40, a=20, p0=12, p1=3, q=300, h=74)
    e = evidence.phase_evidence(before, after, [comp(0, 2), comp(1, 2), comp(2.5, 1)],
                                [10, 300, 257], 256)
    sd = e["spec_decode"]
    assert (sd["drafts"], sd["draft_tokens"], sd["accepted_tokens"]) == (10, 20, 15)
    assert sd["acceptance_rate"] == 15 / 20
    assert sd["mean_accepted_length"] == 1 + 15 / 10
    assert sd["accepted_per_position"] == [8 / 10, 2 / 10]
    assert e["prefix_cache"] == {"queried_tokens": 200, "hit_tokens": 64}
    assert e["preemptions"] == 0
    assert e["chunked_prefills"] == 2  # 300 and 257 > C = 256
    assert e["in_flight_peak"] == 2  # [0,2] and [1,3] overlap; [2.5,3.5] meets only the second


def test_no_metrics_means_no_counters_and_no_drafts_means_no_rates():
    e = evidence.phase_evidence(None, snap(), [comp(0, 1)], [5], None)
    assert e["counters"] is None and e["chunked_prefills"] is None and "spec_decode" not in e
    assert evidence.spec_health(0, 0, 0)["acceptance_rate"] is None
    assert evidence.in_flight_peak([comp(0, 1), comp(1, 1)]) == 1  # one ends as the next starts


def _phase(i, c, drafts, tokens, accepted, role="load", name=None):
    return PhaseRecord(index=i, name=name or f"p{i}", scenario="t", concurrency=c, role=role,
                       status="pass", engaged={"counters": {"x": 1},
                                               "spec_decode": evidence.spec_health(
                                                   drafts, tokens, accepted)})


def run_manifest(phases, k=3, strict=False):
    m = Manifest(run_id="r", status="complete", verdict="pass", phases=phases,
                 facts={"num_speculative_tokens": {"value": k, "source": "launch"}},
                 run_options={"strict": strict})
    from pleharness.verdict import verdict
    verdict(m)
    return m


def test_spec_health_per_concurrency_sums_the_load_phases_only():
    m = run_manifest([_phase(0, 1, 10, 30, 15), _phase(1, 4, 20, 60, 30), _phase(2, 1, 10, 30, 3),
                      _phase(3, 1, 100, 300, 0, role="reference")])
    sd = m.summary.engaged["spec_decode"]
    assert sd["overall"]["accepted_tokens"] == 48 and sd["overall"]["draft_tokens"] == 120
    assert sd["by_concurrency"]["C1"]["acceptance_rate"] == 18 / 60
    assert sd["by_concurrency"]["C4"]["mean_accepted_length"] == 1 + 30 / 20
    assert m.summary.vacuous == [] and m.verdict == "pass"


def test_speculative_decoding_that_never_drafted_is_vacuous_and_fails_with_strict():
    phases = [_phase(0, 1, 0, 0, 0), _phase(1, 2, 0, 0, 0)]
    m = run_manifest(phases)
    assert m.verdict == "pass"
    assert m.summary.vacuous == ["speculative decoding: 0 drafts in 2 load phase(s) although "
                                    "k = 3: the proposer never proposed, so no verify step was "
                                    "tested"]
    assert "VACUOUS (warnings): speculative decoding: 0 drafts" in headline(m)
    strict = run_manifest([_phase(0, 1, 0, 0, 0), _phase(1, 2, 0, 0, 0)], strict=True)
    assert strict.verdict == "fail"
    from pleharness.causes import causes
    assert any(c.startswith("vacuous (--strict): speculative decoding") for c in causes(strict))
    assert run_manifest([_phase(0, 1, 0, 0, 0)], k=0).summary.vacuous == []  # k = 0: off


def test_mark_vacuous_warns_and_fails_the_phase_with_strict():
    for strict, status in ((False, "pass"), (True, "fail")):
        ph = PhaseRecord(index=0, name="boundary-warm", scenario="b", concurrency=1,
                         status="pass")
        from pleharness.run.context import RunContext
        ctx = SimpleNamespace(strict=strict, save=lambda: None)
        ctx.add_phase_check = lambda p, c, reason=None: RunContext.add_phase_check(ctx, p, c,
                                                                                   reason)
        evidence.mark_vacuous(ctx, ph, "warm runs: 0 of 3 hit the prefix cache: x")
        assert ph.vacuous == "warm runs: 0 of 3 hit the prefix cache: x"
        assert ph.status == status and ph.checks[-1].name == "engaged"
        assert ph.checks[-1].status == ("fail" if strict else "warn")


# -- compare gates on acceptance --------------------------------------------------------------

def test_spec_threshold_forms_and_errors():
    assert parse_spec_threshold("acceptance>=0.95*base") == ("acceptance", None, ">=", 0.95,
                                                              True)
    assert parse_spec_threshold("accepted_length@C4 > 2") == ("accepted_length", "C4", ">", 2.0,
                                                               False)
    assert parse_spec_threshold("C4>=62.9") is None
    check_thresholds(["C4>=62.9", "acceptance>=0.95*base"])
    for bad in ("acceptance>=x", "acceptance=>0.9", "accepted_length@4>=1"):
        with pytest.raises(UsageError, match="acceptance>=0.95\\*base"):
            check_thresholds([bad])
    from pleharness.suites import Gates
    assert Gates(thresholds=["acceptance>=0.95*base"]).thresholds
    with pytest.raises(ValueError):
        Gates(thresholds=["acceptance>>1"])


def test_gates_that_cannot_tell_good_from_bad_are_usage_errors():
    """Issue 36 item 3: an absolute bound outside the metric's range, @C0, and a level neither
    run has are refused before anything is judged."""
    from pleharness.compare import check_thresholds_against
    for bad, why in (("acceptance>=1.5", "always [0, 1]"), ("acceptance<0", "always [0, 1]"),
                     ("accepted_length>=0.5", "always >= 1"),
                     ("accepted_length<1", "always >= 1"), ("acceptance<=1", "always [0, 1]"),
                     ("acceptance@C0>=0.5", "@C0"),
                     ("acceptance>=0*base", "factor of BASE must be > 0")):
        with pytest.raises(UsageError, match=re.escape(why)):
            check_thresholds([bad])
    check_thresholds(["acceptance>=0.9", "acceptance<0.99", "accepted_length>1.2",
                      "acceptance>=1.5*base"])  # meetable (a factor: BASE decides)
    base = run_manifest([_phase(0, 1, 10, 30, 15), _phase(1, 4, 20, 60, 30)])
    check_thresholds_against(base, base, ["acceptance@C4>=0.9", "C1>=1"])
    with pytest.raises(UsageError, match=r"neither run has C999 \(levels with counters: C1, C4\)"):
        check_thresholds_against(base, base, ["acceptance@C999>=0.9"])
    with pytest.raises(UsageError, match=r"neither run has a load phase at C8 \(levels: C1, C4\)"):
        check_thresholds_against(base, base, ["C8>=10"])


def test_gate_fails_a_head_whose_acceptance_dropped_and_passes_an_equal_one():
    base = run_manifest([_phase(0, 1, 10, 30, 15), _phase(1, 4, 20, 60, 30)])
    same = run_manifest([_phase(0, 1, 10, 30, 15), _phase(1, 4, 20, 60, 30)])
    worse = run_manifest([_phase(0, 1, 10, 30, 15), _phase(1, 4, 20, 60, 12)])  # C4 only
    res = Comparison()
    gate(res, base, same, "acceptance>=0.95*base")
    assert not res.gate_failures and res.gates_passed
    res = Comparison()
    gate(res, base, worse, "acceptance>=0.95*base")
    assert len(res.gate_failures) == 2  # the run (27/90 vs 45/90) and C4 (12/60 vs 30/60)
    assert "at C4 misses >= 0.4750 (0.95 x BASE 0.5000)" in res.gate_failures[1]
    res = Comparison()
    gate(res, base, worse, "acceptance@C1>=0.95*base")
    assert not res.gate_failures  # C1 did not change
    res = Comparison()
    gate(res, base, Manifest(run_id="h"), "accepted_length>=1.5")
    assert res.gate_failures == ["--threshold accepted_length>=1.5: HEAD has no "
                                 "speculative-decoding counters (speculative decoding off, or "
                                 "no /metrics)"]


# -- the built-in fault classes on constructed chunks -----------------------------------------

def _chunk(ids, finish=None, usage=None):
    c = {"choices": [{"index": 0, "text": "x", "token_ids": list(ids), "finish_reason": finish}]}
    if usage:
        c["usage"] = usage
    return c


def test_builtin_classes_are_the_nine_of_the_issue_then_one_per_family():
    assert list(CORE) == ["flip_under_load", "corrupt_warm", "oov_id", "token0_run",
                          "dropped_delta", "usage_mismatch", "wrong_finish",
                          "sentinel_logprob", "cut_short"]
    assert list(BUILTIN) == list(CORE) + list(FAMILIES)
    fams = {c.family: c.scenarios for c in FAMILIES.values()}
    assert fams == {"stop strings": ("stop_strings",), "mixed parameters": ("mixed_params",),
                    "token-level stops": ("mixed_params",), "chat completions": ("chat_api",),
                    "client disconnects": ("disconnects",),
                    "prefix-cache isolation": ("prefix_isolation",),
                    "sampled requests": ("sampled",),
                    "several choices": ("choices",),
                    "constrained output": ("constrained",),
                    "prompt logprobs": ("prompt_logprobs",),
                    "emitted-token logprobs": ("transitions",),
                    "sampling parameters in one batch": ("mixed_params",),
                    "stops with min_tokens": ("mixed_params",),
                    "special tokens": ("mixed_params",),
                    "LoRA adapters": ("mixed_params",),
                    "stops in streams": ("stop_strings",),
                    "several choices with seeds and logprobs": ("choices",)}


def test_selftest_passes_run_the_suite_or_their_familys_scenarios():
    """Issue 35 item 8: a core class's pass runs the suite; a family class's pass only its
    family's scenario (the suite's own entry of that kind when it has one, else the
    selftest-families suite's); the clean pass runs the suite and the families it lacks."""
    own_stop = ("stop_strings", {"prompts": 2})
    cfg = SimpleNamespace(suite=SimpleNamespace(scenarios=[("transitions", {"repeats": 1}),
                                                           own_stop]))
    plan = plan_passes(cfg, ["flip_under_load", "ids_after_stop", "penalty_on_neighbour",
                             "stop_id_on_neighbour"], ["transitions", "stop_strings"])
    names = [(n, [r if isinstance(r, str) else r[0] for r in refs]) for n, _f, refs in plan]
    assert names == [("clean", ["transitions", "stop_strings", "mixed_params"]),
                     ("flip_under_load", ["transitions", "stop_strings"]),
                     ("ids_after_stop", ["stop_strings"]),
                     ("penalty_on_neighbour", ["mixed_params"]),
                     ("stop_id_on_neighbour", ["mixed_params"])]
    assert plan[2][2] == [own_stop]  # the suite's own entry, with its params
    assert plan[0][1] is None and isinstance(plan[3][1], FAMILIES["penalty_on_neighbour"])
    core_only = plan_passes(cfg, ["oov_id"], ["transitions", "stop_strings"])
    assert [refs for _n, _f, refs in core_only] == [cfg.suite.scenarios, cfg.suite.scenarios]


def _stop_chunk(ids, finish=None, usage=None):
    c = {"choices": [{"index": 0, "text": "x", "token_ids": list(ids), "finish_reason": finish}]}
    if usage:
        c["usage"] = usage
    return c


def test_family_classes_pick_by_what_is_in_flight_beside():
    stop = FAMILIES["ids_after_stop"]()
    body = {"prompt": [1], "max_tokens": 8, "stop": [" 4"], "stream": True}
    alone = RequestCtx(1, dict(body), in_flight=1)
    assert stop.chunk(alone, _stop_chunk([20, 21], "stop"))["choices"][0]["token_ids"] == [20, 21]
    loaded = RequestCtx(2, dict(body), in_flight=2)
    stop.chunk(loaded, _stop_chunk([30]))
    out = stop.chunk(loaded, _stop_chunk([31], "stop", {"prompt_tokens": 1,
                                                        "completion_tokens": 2}))
    assert out["choices"][0]["token_ids"] == [31, 31, 31] and out["usage"]["completion_tokens"] == 4
    assert stop.hits == [2]
    pen = FAMILIES["penalty_on_neighbour"]()
    default = {"prompt": [1], "max_tokens": 4, "ignore_eos": True, "stream": True}
    penalised = RequestCtx(1, dict(default, repetition_penalty=1.5), in_flight=1)
    pen.proxy = SimpleNamespace(lock=threading.Lock(), active=[])
    first = RequestCtx(2, dict(default), in_flight=1)
    pen.request(first, first.body)  # nobody penalised beside it: untouched
    pen.proxy.active = [penalised]
    second = RequestCtx(3, dict(default), in_flight=2)
    pen.request(second, second.body)
    assert pen.hits == [3] and not first.state.get("selected")
    assert pen.chunk(second, _stop_chunk([40, 41, 42]))["choices"][0]["token_ids"] == [40, 41, 41]
    eos = RequestCtx(4, {"prompt": [1], "max_tokens": 4, "stream": True}, in_flight=2)
    pen.request(eos, eos.body)  # the eos variant (no ignore_eos) is no default request
    assert pen.hits == [3]


def test_flip_under_load_leaves_a_request_alone_untouched():
    f = FlipUnderLoad()
    alone = RequestCtx(1, {"prompt": [1], "max_tokens": 4}, in_flight=1)
    assert f.chunk(alone, _chunk([20, 21, 22, 23]))["choices"][0]["token_ids"] == [20, 21, 22, 23]
    crowded = RequestCtx(2, {"prompt": [1], "max_tokens": 4}, in_flight=2)
    assert f.chunk(crowded, _chunk([20, 21, 22, 23]))["choices"][0]["token_ids"] == [20, 21, 21, 23]
    assert f.hits == [2]


def test_cut_short_wrong_finish_and_dropped_delta_on_a_stream():
    body = {"prompt": [1], "max_tokens": 4, "stream": True}
    f, ctx = CutShort(), RequestCtx(4, body, in_flight=1)
    out = []
    for i in range(4):
        c = f.chunk(ctx, _chunk([30 + i], "length" if i == 3 else None))
        ctx.tokens_so_far += 1
        out.append(c)
    u = f.chunk(ctx, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}})
    assert [c["choices"][0]["token_ids"] for c in out if c] == [[30], [31]]
    assert out[1]["choices"][0]["finish_reason"] == "length" and out[2] is None
    assert u["usage"]["completion_tokens"] == 2 and f.hits == [4]
    w = WrongFinish()
    assert w.chunk(RequestCtx(4, body, 1), _chunk([1], "length"))["choices"][0][
        "finish_reason"] == "stop"
    assert w.chunk(RequestCtx(5, body, 1), _chunk([1], "length"))["choices"][0][
        "finish_reason"] == "length"  # not a 4th request
    d, ctx = DropDelta(), RequestCtx(8, body, in_flight=1)
    kept = []
    for i in range(4):
        kept.append(d.chunk(ctx, _chunk([40 + i])))
        ctx.tokens_so_far += 1
    assert [k is None for k in kept] == [False, False, True, False] and d.hits == [8]


def _failed(prompt_hash: str, phase: str = "C3", check: str = "vocab_range"):
    from pleharness.manifest import CheckResult, RequestRecord
    return RequestRecord(id=f"r-{prompt_hash}-{check}", scenario="s", phase=phase,
                         concurrency=3, prompt_key="p", prompt_len=3, prompt_hash=prompt_hash,
                         max_tokens=8, checks=[CheckResult(name=check, status="fail")])


def test_selftest_outcomes_never_hide_a_fault_that_did_not_fire():
    f = FlipUnderLoad()
    m = Manifest(run_id="x", status="complete", verdict="pass")
    assert judge("flip_under_load", f, 0, m).outcome == "missed (never triggered)"
    f.hits.append(3)
    f.keys.add(("pA", 8))
    assert judge("flip_under_load", f, 0, m).outcome == "missed"
    m.requests = [_failed("pA")]
    assert judge("flip_under_load", f, 1, m).outcome == "detected"
    assert judge("clean", None, 1, m).outcome == "false alarm"
    rows = [judge("clean", None, 0, m), judge("flip_under_load", f, 1, m),
            judge("oov_id", BUILTIN["oov_id"](), 0, m)]
    assert selftest_headline(rows, 0) == ("this suite on this engine catches 1/2 planted fault "
                                          "classes; 0 false alarms (missed: oov_id)")


def test_a_family_class_whose_requests_were_left_out_is_vacuous_not_missed():
    """Issue 52: a class that never fired because its scenario left out every request it acts
    on, with the reason (no LoRA adapter here), is vacuous: named, not a miss; one whose
    requests were sent and that never fired is still a miss."""
    lora = FAMILIES["adapter_on_base_neighbour"]()
    m = Manifest(run_id="x", status="complete", verdict="pass")
    m.tables["mixed_params"] = [{"variant": "adapter", "left_out": "the engine serves no LoRA "
                                 "adapter", "prompt_key": "p15", "params": {}, "compared": False,
                                 "differs_from_default": None}]
    res = judge("adapter_on_base_neighbour", lora, 0, m)
    assert res.outcome == "vacuous (adapter: the engine serves no LoRA adapter)"
    sent = Manifest(run_id="y", status="complete", verdict="pass")
    sent.tables["mixed_params"] = [dict(m.tables["mixed_params"][0], left_out=None)]
    assert judge("adapter_on_base_neighbour", lora, 0, sent).outcome == \
        "missed (never triggered)"
    assert judge("min_tokens_lost_under_load", FAMILIES["min_tokens_lost_under_load"](), 0,
                 m).outcome == "missed (never triggered)"  # its variants were not left out
    rows = [judge("clean", None, 0, m), res]
    assert selftest_headline(rows, 0) == (
        "this suite on this engine catches 0/0 planted fault classes; 0 false alarms; 1 "
        "vacuous on this engine, its requests left out: adapter_on_base_neighbour")


def test_selftest_detection_is_its_own_requests_through_a_rule_the_clean_pass_did_not_raise():
    """Issue 47 item 4: a pass that failed elsewhere, or only by a rule the clean pass raised
    too, detected nothing; a failing clean pass leads the headline."""
    f = FlipUnderLoad()
    f.hits.append(3)
    f.keys.add(("pA", 8))
    m = Manifest(run_id="x", status="complete", verdict="fail")
    m.requests = [_failed("pB")]  # another prompt's failure
    res = judge("flip_under_load", f, 1, m)
    assert res.outcome.startswith("missed") and res.also_failed == ["vocab_range"]
    m.requests = [_failed("pA", check="prompt_logprobs_parity")]
    res = judge("flip_under_load", f, 1, m, clean_rules=["prompt_logprobs_parity"])
    assert res.outcome.startswith("missed") and res.caught_by == []
    res = judge("flip_under_load", f, 1, m, clean_rules=["parity"])
    assert res.outcome == "detected" and res.caught_by == ["prompt_logprobs_parity"]
    # a phase check of the phase holding a changed request counts
    from pleharness.manifest import CheckResult, PhaseRecord
    m.requests = [_failed("pA", check="parity_pass_placeholder")]
    m.requests[0].checks = []
    m.phases = [PhaseRecord(index=0, name="C3", scenario="s", concurrency=3,
                            checks=[CheckResult(name="health_after_phase", status="fail")])]
    assert judge("flip_under_load", f, 1, m).caught_by == ["health_after_phase"]
    clean = judge("clean", None, 1, Manifest(run_id="c", requests=[_failed("pZ", check="x")]))
    line = selftest_headline([clean, judge("flip_under_load", f, 1, m)], 1)
    assert line.startswith("clean pass failed (rules x): detection power unknown for them; ")


def test_selftest_unknown_fault_class_is_a_usage_error(tmp_path):
    r = run_cli("selftest", "--fault", "nope", "--url", "http://127.0.0.1:9",
                "--results-dir", str(tmp_path))
    assert r.returncode == 2
    assert "--fault 'nope': not a built-in fault class (known: flip_under_load" in r.stderr


# -- on the real CPU engine -------------------------------------------------------------------
# The session engine (tests/conftest.py cpu_engine): profiles/cpu-ngram.toml, ngram speculative
# decoding k = 3, block size 32, max_num_batched_tokens 256, prefix caching on.

@pytest.mark.engine
def test_acceptance_per_phase_and_compare_fails_shortened_accepted_steps(cpu_engine, tmp_path):
    args = ("--results-dir", str(tmp_path), "--scenario", "boundary")
    r = run_cli("stress", "--url", cpu_engine.url, "--run-id", "base", *args)
    assert r.returncode == 0, r.stdout[-3000:]
    base = load_json(tmp_path / "base" / "manifest.json")
    load = [p for p in base["phases"] if p["role"] == "load"]
    for p in load:
        sd = p["engaged"]["spec_decode"]
        assert len(sd["accepted_per_position"] or [0, 0, 0]) == 3  # k = 3 draft positions
        if sd["draft_tokens"]:
            assert sd["acceptance_rate"] == sd["accepted_tokens"] / sd["draft_tokens"]
            assert sd["mean_accepted_length"] == 1 + sd["accepted_tokens"] / sd["drafts"]
    total = base["summary"]["engaged"]["spec_decode"]["overall"]
    assert total["drafts"] > 0 and total["accepted_tokens"] > 0  # the proposer was exercised
    warm = next(p for p in load if p["name"] == "boundary-warm")
    assert warm["vacuous"] is None and warm["engaged"]["warm_runs_hit"] > 0
    assert "speculative decoding (load phases): acceptance" in r.stdout
    fault = ShortenAccepted(0.5)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r = run_cli("stress", "--url", proxy.url, "--run-id", "head", *args)
    assert r.returncode == 0 and fault.scraped > 0  # every token right: HEAD passes on its own
    c = run_cli("compare", str(tmp_path / "base"), str(tmp_path / "head"),
                "--threshold", "acceptance>=0.95*base")
    assert c.returncode == 1, c.stdout
    assert "PASS token parity" in c.stdout
    assert "FAIL --threshold acceptance>=0.95*base: HEAD acceptance" in c.stdout
    same = run_cli("compare", str(tmp_path / "base"), str(tmp_path / "base"),
                   "--threshold", "acceptance>=0.95*base")
    assert same.returncode == 0, same.stdout


# The rule that catches each family class. choice_token_changed: on an engine with speculative
# decoding (the cpu-ngram session engine) greedy choices are left out (top_k kills its engine
# core) and seeded ones are judged reference-free where seeds do not reproduce, so logprob_sanity
# or the choices check catches it there; on the embedded default (no speculative decoding) parity.
FAMILY_RULES = {"ids_after_stop": {"stop_string"}, "stop_id_on_neighbour": {"parity"},
                "penalty_on_neighbour": {"parity"}, "chat_flip_under_load": {"parity"},
                "serve_from_original": {"prefix_isolation"},
                "corrupt_after_disconnect": {"abandoned_prefix"},
                "sampled_first_token_under_load": {"sampled_distribution"},
                "prompt_logprobs_shifted": {"prompt_logprobs_parity"},
                "choice_token_changed": {"parity", "choices", "logprob_sanity"},
                "constrained_broken_under_load": {"constrained"},
                "logprobs_off_under_load": {"logprob_parity"},
                "truncation_lost_beside_greedy": {"parity"},
                "min_tokens_lost_under_load": {"stop_token"},
                "special_text_skipped_under_load": {"special_tokens"},
                "adapter_on_base_neighbour": {"parity"},
                "stop_matched_per_delta": {"stop_string"},
                "choice_logprobs_swapped": {"logprob_parity", "logprob_sanity", "choices"}}

# Issue 52's classes whose requests a CPU engine with speculative decoding (the cpu-ngram
# session engine) leaves out, with the reason: seeded top_k / top_p / min_p samples (seeds do not
# reproduce there, top_k kills its engine core), a forced EOS (logit_bias is refused with
# speculative decoding), a LoRA adapter (it serves none): vacuous there, never a miss.
# tests/test_request_shapes.py detects them on an engine without speculative decoding that
# serves an adapter.
VACUOUS_ON_NGRAM = ("truncation_lost_beside_greedy", "special_text_skipped_under_load",
                    "adapter_on_base_neighbour")
# seeded choices go uncompared there (seeds do not reproduce): vacuous unless a reference-free
# rule happens to see the swapped logprobs
MAYBE_VACUOUS_ON_NGRAM = ("choice_logprobs_swapped",)


def test_every_family_class_has_its_catching_rule():
    assert set(FAMILY_RULES) == set(FAMILIES)  # a new family class names the rule that catches it


def _selftest(url, tmp_path, run_id, faults=()):
    args = [a for f in faults for a in ("--fault", f)]
    r = run_cli("selftest", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *args)
    data = json.loads((tmp_path / run_id / "selftest.json").read_text())
    assert r.returncode == 0, r.stdout[-4000:]
    n = len(faults) or len(BUILTIN)
    rows = {p["name"]: p for p in data["passes"]}
    vac = [f for f in faults or BUILTIN if f in VACUOUS_ON_NGRAM
           or (f in MAYBE_VACUOUS_ON_NGRAM and rows[f]["outcome"].startswith("vacuous"))]
    n -= len(vac)
    assert data["headline"] == (f"this suite on this engine catches {n}/{n} planted fault "
                                "classes; 0 false alarms" + (
                                    f"; {len(vac)} vacuous on this engine, its requests left "
                                    f"out: {', '.join(vac)}" if vac else ""))
    assert rows["clean"]["outcome"] == "clean" and rows["clean"]["exit_code"] == 0
    for name in vac:  # left out on this engine, with the reason: vacuous, not missed
        assert rows[name]["outcome"].startswith("vacuous (") and rows[name]["fired"] == 0
    for name in [f for f in faults or BUILTIN if f not in vac]:
        assert rows[name]["outcome"] == "detected" and rows[name]["fired"] > 0, rows[name]
        if name in FAMILIES:  # its family's own rule; its pass ran only its family's scenario
            assert FAMILY_RULES[name] & set(rows[name]["caught_by"]), rows[name]
            assert rows[name]["ran"] == list(FAMILIES[name].scenarios)
            assert set(FAMILIES[name].scenarios) <= set(rows["clean"]["ran"])
    return rows


@pytest.mark.engine
def test_selftest_plans_core_and_family_passes_and_catches_them(cpu_engine, tmp_path):
    # a core class runs the suite, a family class only its scenario, the clean pass both (issue
    # 35 item 8); every class, once each, is the nightly test below (the families' own engine
    # tests catch each family's fault with its rule in the default suite)
    rows = _selftest(cpu_engine.url, tmp_path, "some",
                     ("flip_under_load", "oov_id", "serve_from_original",
                      "logprobs_off_under_load"))
    assert "parity" in rows["flip_under_load"]["caught_by"]
    assert "vocab_range" in rows["oov_id"]["caught_by"]
    assert set(rows) == {"clean", "flip_under_load", "oov_id", "serve_from_original",
                         "logprobs_off_under_load"}
    assert rows["flip_under_load"]["ran"] == rows["oov_id"]["ran"]  # the suite
    assert "prefix_isolation" not in rows["flip_under_load"]["ran"]


@pytest.mark.engine
@pytest.mark.nightly
def test_selftest_catches_every_class(cpu_engine, tmp_path):
    rows = _selftest(cpu_engine.url, tmp_path, "all")
    assert {k for c in FAMILIES.values() for k in c.scenarios} <= set(rows["clean"]["ran"])
    assert "parity" in rows["flip_under_load"]["caught_by"]
    assert "vocab_range" in rows["oov_id"]["caught_by"]
    assert "usage" in rows["wrong_finish"]["caught_by"]
    assert "logprob_sanity" in rows["sentinel_logprob"]["caught_by"]
    assert "degeneration" in rows["token0_run"]["caught_by"]


@pytest.mark.engine
@pytest.mark.nightly
def test_selftest_reports_a_fault_that_never_fired_as_missed(cpu_engine, tmp_path):
    # boundary alone runs one request at a time: a fault that needs two in flight never fires
    r = run_cli("selftest", "--url", cpu_engine.url, "--results-dir", str(tmp_path),
                "--run-id", "b", "--scenario", "boundary", "--fault", "flip_under_load")
    data = json.loads((tmp_path / "b" / "selftest.json").read_text())
    assert r.returncode == 1
    assert data["passes"][1]["outcome"] == "missed (never triggered)"
    assert (data["status"], data["exit_code"]) == ("complete", 1)  # the job record's (issue 50)
    assert (data["job"]["status"], data["job"]["exit_code"], data["job"]["steps_done"]) == (
        "complete", 1, ["engine", "passes", "verdict"])
    assert data["headline"] == ("this suite on this engine catches 0/1 planted fault classes; "
                                "0 false alarms (missed: flip_under_load)")


@pytest.mark.engine
def test_prefix_caching_off_makes_the_warm_half_vacuous(plain_engine, tmp_path):
    url = plain_engine.url
    small = scenario_variant(tmp_path, "boundary", depth=1, edges=False, q_solo_runs=3)
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", "warn",
                "--scenario", small)
    m = load_json(tmp_path / "warn" / "manifest.json")
    assert m["facts"]["prefix_caching"]["value"] is False
    warm = next(p for p in m["phases"] if p["name"] == "boundary-warm")
    n = warm["requests"]
    why = f"warm runs: 0 of {n} hit the prefix cache: prefix caching is off in this engine"
    assert warm["vacuous"].startswith(why), warm["vacuous"]
    assert warm["engaged"]["warm_runs_hit"] == 0 and warm["status"] == "pass"
    assert r.returncode == 0 and m["verdict"] == "pass"  # a warning by default
    assert why in m["summary"]["headline"] and "VACUOUS (warnings)" in m["summary"]["headline"]
    cold = next(p for p in m["phases"] if p["name"] == "boundary-cold")
    assert cold["vacuous"] is None
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", "strict",
                "--scenario", small, "--strict")
    m = load_json(tmp_path / "strict" / "manifest.json")
    assert r.returncode == 1 and m["verdict"] == "fail"
    assert f"phase check engaged failed after phase boundary-warm: vacuous: {why}" in r.stdout
