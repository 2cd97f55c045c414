"""Issue 26 items 4 and 5 against the real CPU engine (the session engine, profiles/cpu-ngram.toml:
block size 32, C = 256, ngram k = 3, prefix caching): client disconnects (scenario
``disconnects``) and prefix-cache isolation (scenario ``prefix_isolation``). The clean engine
passes both, also attached without /reset_prefix_cache; an engine double that corrupts the
requests arriving after a disconnect, and one that serves a near duplicate from the original's
answer, are caught (failing requests and rule asserted)."""
import pytest

import clean_scenarios
from clean_scenarios import failed, is_problem, pcheck, phase
from conftest import NO_GOLDEN, load_json, run_cli
from doubles import Fault, FaultProxy
from faults_disconnect import CorruptAfterDisconnect, ServeFromOriginal
from pleharness.engine import metrics

B, C, K = 32, 256, 3
VOCAB = 793
FACTS = ["--block-size", str(B), "--chunk-size", str(C), "--num-speculative-tokens", str(K)]


def stress(url, tmp_path, run_id, *scenarios, more=()):
    args = [a for s in scenarios for a in ("--scenario", s)] + list(more)
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *FACTS, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def records(m, ph):
    return [q for q in m["requests"] if q["phase"] == ph]


@pytest.mark.engine
@pytest.mark.nightly  # default (issue 49): test_e2e_cpu.py::test_stress_default_suite_launch
# asserts clean_scenarios.disconnects and .prefix_isolation on the default suite's run
def test_clean_engine_passes_disconnects_and_isolation(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "clean", "disconnects", "prefix_isolation")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    clean_scenarios.disconnects(m, (tmp_path / "clean" / "summary.md").read_text())
    clean_scenarios.prefix_isolation(m)


@pytest.mark.engine
def test_attached_without_reset_says_so_and_passes(cpu_engine, tmp_path):
    fault = Fault()
    fault.refused = ("/reset_prefix_cache",)  # an engine without VLLM_SERVER_DEV_MODE=1
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "noreset", "disconnects", "prefix_isolation")
    assert r.returncode == 0, out[-3000:]
    assert m["verdict"] == "pass"
    for ph in ("disconnect", "isolation-original"):
        fc = pcheck(m, ph, "fresh_cache")
        assert fc["status"] == "skip" and "404" in fc["detail"], fc
    names = [p["name"] for p in m["phases"]]
    # the near duplicates' references come before the original has run
    assert names.index("isolation-refs") < names.index("isolation-ref-original") \
        < names.index("isolation-original")
    assert all(x["reference_cache"].startswith("not fresh: /reset_prefix_cache answered 404")
               for x in m["tables"]["prefix_isolation"])
    # the planned disconnects ran (the run's own record); whether the proxy also saw a client go
    # depends on the machine's speed (a client that closes after its answer ended is no
    # disconnect to it: seen with a second test pass beside this one), so it is not asserted
    roles = {x["role"] for x in m["tables"]["disconnects"]}
    assert {"abandoned before the first token", "abandoned mid-decode"} <= roles, roles


@pytest.mark.engine
def test_corrupted_continuation_after_disconnect_is_caught(cpu_engine, tmp_path):
    fault = CorruptAfterDisconnect(block=B)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "afterabort", "disconnects", more=[NO_GOLDEN])
    assert fault.gone and fault.hits, "the double saw no disconnect"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    follow = records(m, "after-disconnect")
    assert len(follow) == 4
    # the double corrupts the follow-ups that share a first block with a prompt whose client it
    # saw go away (on a machine too slow to read the mid-decode stream before it ends, or one
    # whose client closed just as the stream ended, the two views of "went away" can differ:
    # the double's own is the one that decides what it corrupted)
    ids = {q["id"]: tuple(m["prompts"][q["prompt_hash"]][:B]) for q in follow}
    hit = [q for q in follow if ids[q["id"]] in fault.heads]
    assert len(fault.hits) == len(hit) >= 2  # the before-first-token one is always seen
    bad = [q for q in m["requests"] if is_problem(q)]
    assert {q["id"] for q in bad} == {q["id"] for q in hit}
    for q in hit:  # rule: parity with the single-request reference (a hard divergence)
        assert q["match"] is False and q["first_divergence"] == 0
        assert q["divergence"]["fails"] and "parity" in failed(q)
    mid_rec = next(q for q in records(m, "disconnect") if q["prompt_key"].startswith("disc-mid"))
    mid = next(q for q in follow if q["prompt_key"].startswith("disc-mid"))
    if mid_rec["error"] == "abandoned" and mid in hit:
        assert "abandoned_prefix" in failed(mid)  # the abandoned run's tokens differ from it
    assert phase(m, "disconnect")["status"] == "pass"
    assert phase(m, "after-disconnect")["status"] == "fail"


@pytest.mark.engine
@pytest.mark.nightly  # by default: selftest's serve_from_original class, caught by parity in
# tests/test_selfproof.py::test_selftest_plans_core_and_family_passes_and_catches_them
def test_near_duplicate_served_from_original_is_caught(cpu_engine, tmp_path):
    fault = ServeFromOriginal()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "collide", "prefix_isolation")
    assert fault.resets >= 5  # the references ran on fresh caches, the double forgot each time
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    dups = records(m, "isolation-near-duplicates")
    assert len(fault.hits) == len(dups) == 4
    original = records(m, "isolation-original")[0]
    bad = [q for q in m["requests"] if is_problem(q)]
    assert {q["id"] for q in bad} == {q["id"] for q in dups}
    for q in dups:  # rule: prefix_isolation (the original's output, its own reference differs)
        assert "prefix_isolation" in failed(q)
        assert q["output_hash"] == original["output_hash"]
    rows = m["tables"]["prefix_isolation"]
    assert all(x["result"] == "original's output" for x in rows)
    # a near duplicate whose reference IDs differ also differs from its reference
    for q in dups:
        if q["reference_hash"] != original["output_hash"]:
            assert q["match"] is False


def test_metrics_gauge_and_label_helpers():
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0"} 2.0\n'
            '# TYPE vllm:request_success counter\n'
            'vllm:request_success_total{engine="0",finished_reason="length"} 3.0\n'
            'vllm:request_success_total{engine="0",finished_reason="abort"} 1.0\n')
    assert metrics.gauge(text, metrics.RUNNING) == 2.0
    assert metrics.gauge(text, metrics.WAITING) is None
    assert metrics.gauge(None, metrics.RUNNING) is None
    assert metrics.by_label(text, metrics.REQUEST_SUCCESS, "finished_reason") == \
        {"length": 3.0, "abort": 1.0}
    assert metrics.by_label("not prometheus {", metrics.REQUEST_SUCCESS, "x") == {}


def test_abandon_is_for_streams_only():
    from pleharness.engine.client import EngineClient
    c = EngineClient("http://127.0.0.1:9", "m")  # nothing listens: refused before any request
    try:
        for kw in ({"stream": False, "abandon_after_tokens": 1}, {"abandon_after_tokens": -1}):
            with pytest.raises(ValueError, match="abandon_after_tokens"):
                c.complete([1, 2], 4, **kw)
    finally:
        c.close()
