"""Issue 26 items 2 and 3 against the real CPU engine (session engine: embedded model,
profiles/cpu-ngram.toml, ngram k = 3): scenario kinds ``stop_strings`` and ``mixed_params`` pass
on the clean engine, and fail naming the request and the rule when a double plants the fault
(tests/faults_stop_mixed.py)."""
from collections import Counter

import pytest

import clean_scenarios
from conftest import NO_GOLDEN, load_json, run_cli
from doubles import FaultProxy
from faults_stop_mixed import (IdsAfterStop, PenaltyOnNeighbour, Rechunk, StopIdsIgnored,
                               StopOnNeighbour)

pytestmark = pytest.mark.engine

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]


def stress(url, tmp_path, run_id, *scenarios, more=()):
    args = [a for s in scenarios for a in ("--scenario", s)] + list(more)
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                "--no-engine-probe", *FACTS, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def failed(q, name=None):
    return [c for c in q["checks"] if c["status"] == "fail" and (name is None or c["name"] == name)]


@pytest.mark.nightly  # default (issue 49): test_e2e_cpu.py::test_stress_default_suite_launch
# asserts clean_scenarios.stop_strings and .mixed_params on the default suite's run
def test_clean_engine_passes_stop_strings_and_mixed_params(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "clean", "stop_strings", "mixed_params")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    clean_scenarios.stop_strings(m)
    clean_scenarios.mixed_params(m)


def test_ids_after_a_stop_string_fail_the_request(cpu_engine, tmp_path):
    # the first streamed stop request of the load phase: each stop request's third streamed run
    # (its warm references ran it alone twice before, untouched). Chosen by count, not by what
    # is in flight: on a fast machine a streamed stop request can finish before another arrives.
    runs: Counter = Counter()

    def third_run(ctx):
        key = (repr(ctx.body.get("prompt")), tuple(ctx.body["stop"]))
        runs[key] += 1
        return runs[key] == 3

    fault = IdsAfterStop(third_run)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "after-stop", "stop_strings")
    assert len(fault.hits) == 1, fault.hits
    assert r.returncode == 1, out[-3000:]
    assert m["verdict"] == "fail"
    bad = [q for q in m["requests"] if failed(q)]
    assert len(bad) == 1, [(q["id"], failed(q)) for q in bad]
    (q,) = bad
    assert q["phase"].endswith("stop-c8") and q["params"]["stop"]
    (rule,) = failed(q, "stop_string")
    assert "ids after the stop: 2 ID(s)" in rule["detail"]
    assert "expect_len" in rule["detail"]
    assert q["match"] is False  # and its IDs differ from the same request alone


def test_a_gateway_that_rechunks_the_stream_is_no_failure(cpu_engine, tmp_path):
    """Issue 35 item 7: a healthy engine behind a gateway that sends one ID a chunk (the text on
    the first piece), SSE comments and an extra field passes stop_strings; the check notes the
    re-chunked deltas instead of failing them (only the concatenations are promised)."""
    gateway = Rechunk()
    with FaultProxy(cpu_engine.url, gateway) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "gateway", "stop_strings")
    assert gateway.split > 0
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    stop_checks = [c for q in m["requests"] for c in q["checks"] if c["name"] == "stop_string"]
    assert stop_checks and {c["status"] for c in stop_checks} == {"pass"}
    assert any("deltas re-chunked" in c["detail"] for c in stop_checks)


def test_penalty_applied_to_a_neighbour_fails_the_default_requests(cpu_engine, tmp_path):
    fault = PenaltyOnNeighbour(start=2)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "neighbour", "mixed_params", more=[NO_GOLDEN])
    assert fault.hits
    assert r.returncode == 1, out[-3000:]
    assert m["verdict"] == "fail"
    bad = [q for q in m["requests"] if failed(q)]
    assert bad
    for q in bad:  # only default-params requests in flight with penalised ones
        assert q["phase"].endswith("mixed-c8") and not q.get("params"), q
        assert q["match"] is False and failed(q, "parity")
        assert q["first_divergence"] == 2
    before_after = [q for q in m["requests"] if q["phase"].endswith(("before-c8", "after-c8"))]
    assert before_after and all(q["match"] for q in before_after)


def test_stop_id_applied_to_a_neighbour_fails_the_default_requests(cpu_engine, tmp_path):
    """Issue 35 item 5: a neighbour's stop_token_ids applied to a default request's batch row
    (it ends early with "stop") fails that request's parity; the stop requests themselves pass."""
    fault = StopOnNeighbour(start=3)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "stop-neighbour", "mixed_params")
    assert fault.hits
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if failed(q, "parity")]
    assert bad and all(q["phase"].endswith("mixed-c8") and not q.get("params") for q in bad)
    assert all(q["output_len"] == 3 and q["finish_reason"] == "stop" for q in bad)
    stops = [q for q in m["requests"] if (q.get("params") or {}).get("stop_token_ids")]
    assert stops and not any(failed(q, "stop_token") for q in stops)


def test_stop_ids_lost_under_load_fail_the_stop_token_check(cpu_engine, tmp_path):
    """Issue 35 item 5: a request whose stop_token_ids the engine drops while other requests are
    in flight runs past its stop ID: the stop_token check names the rule and the position."""
    fault = StopIdsIgnored()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "stop-lost", "mixed_params")
    assert fault.hits
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    (q,) = [q for q in m["requests"] if q["phase"].endswith("mixed-c8")
            and list(q.get("params") or {}) == ["stop_token_ids"]]
    (rule,) = failed(q, "stop_token")
    assert "stops at the first: stop ID" in rule["detail"] and "more ID(s)" in rule["detail"]
    assert q["match"] is False and q["finish_reason"] == "length"
