"""Issue 35 item 3 (constrained output) against the real CPU engine (session engine: embedded
model, profiles/cpu-ngram.toml, ngram k = 3): scenario kind ``constrained`` passes on the clean
engine, every JSON / regex / choice output conforming and equal to its solo request's, streamed
and not, beside unconstrained neighbours that equal theirs; a double that breaks a constrained
output in flight with another request (tests/faults_constrained.py) fails exactly those
requests, naming rule ``constrained`` and parity."""
import pytest

import clean_scenarios
from clean_scenarios import checks_of
from conftest import NO_GOLDEN, load_json, run_cli
from doubles import FaultProxy
from faults_constrained import ConstrainedBrokenUnderLoad

pytestmark = pytest.mark.engine

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]
LOAD = ("constrained-c4", "constrained-c4-swapped")


def stress(url, tmp_path, run_id, *more):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                "--no-engine-probe", *FACTS, "--scenario", "constrained", *more)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def constrained(m):
    return [q for q in m["requests"] if "structured_outputs" in (q.get("params") or {})]


@pytest.mark.nightly  # default (issue 49): test_e2e_cpu.py::test_stress_default_suite_launch
# asserts clean_scenarios.constrained on the default suite's run
def test_clean_engine_passes_constrained_output(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "clean")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    clean_scenarios.constrained(m)


def test_constrained_output_broken_under_load_fails_the_request(cpu_engine, tmp_path):
    fault = ConstrainedBrokenUnderLoad()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "broken", NO_GOLDEN)
    assert fault.hits, "no constrained request was in flight with another"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if any(c["status"] == "fail" for c in q["checks"])
           or q["match"] is False]
    assert len(bad) == len(fault.hits), [(q["id"], q["checks"]) for q in bad]
    for q in bad:  # only constrained requests under load; each named by its rule and parity
        assert q["phase"] in LOAD and q in constrained(m), q
        (rule,) = checks_of(q, "constrained")
        assert rule["status"] == "fail", rule
        assert "does not match" in rule["detail"] or "is none of the" in rule["detail"] or \
            "does not parse as JSON" in rule["detail"], rule
        assert "'#" in rule["detail"]
        assert q["match"] is False and q["first_divergence"] == 0
    assert {next(iter(q["params"]["structured_outputs"])) for q in bad} <= {"json", "regex",
                                                                           "choice"}
    rows = [x for x in m["tables"]["constrained"] if x["rule"] == "fail"]
    assert len(rows) == len(bad) and all(x["text"].startswith("#") for x in rows)
    assert bad[0]["id"] in out and "constrained" in out
