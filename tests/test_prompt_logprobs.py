"""Issue 35 item 4 against the real CPU engine (session engine: embedded model,
profiles/cpu-ngram.toml: chunk budget C = 256, block size 32, prefix caching, ngram k = 3):
scenario kind ``prompt_logprobs`` passes on the clean engine, with the short prompt in one
prefill chunk and the long one in two; a double that shifts the prompt's scores by one position
under load (tests/faults_prompt_logprobs.py) fails exactly the shifted requests, naming the rule."""
import pytest

import clean_scenarios
from clean_scenarios import checks_of
from conftest import load_json, run_cli
from doubles import FaultProxy
from faults_prompt_logprobs import ShiftedPromptLogprobs

pytestmark = pytest.mark.engine

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]


def stress(url, tmp_path, run_id):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                "--no-engine-probe", *FACTS, "--scenario", "prompt_logprobs")
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def scored(m):
    return [q for q in m["requests"] if "prompt_logprobs" in (q.get("params") or {})
            or (q.get("params") or {}).get("echo")]


@pytest.mark.nightly  # default (issue 49): test_e2e_cpu.py::test_stress_default_suite_launch
# asserts clean_scenarios.prompt_logprobs on the default suite's run
def test_clean_engine_passes_prompt_logprobs(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "clean")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    clean_scenarios.prompt_logprobs(m)


@pytest.mark.parametrize("relabel", [False, True], ids=["shifted", "relabelled"])
def test_prompt_logprobs_shifted_under_load_fail_the_request(cpu_engine, tmp_path, relabel):
    fault = ShiftedPromptLogprobs(relabel=relabel)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "shifted")
    assert fault.hits, "no score request arrived beside another one"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if any(c["status"] == "fail" for c in q["checks"])]
    assert len(bad) == len(fault.hits), [(q["id"], q["checks"]) for q in bad]
    for q in bad:  # only score requests under load; their output IDs are untouched
        assert q["phase"] == "prompt-logprobs-c4" and q in scored(m), q
        assert q["match"] is True
        (par,) = checks_of(q, "prompt_logprobs_parity")
        assert par["status"] == "fail", par
        assert ("lack the prompt token's score that the solo request gives (first at "
                "position 1)" if not relabel else "differ from the solo request's by more "
                "than 0.01 nats") in par["detail"], par
        (rule,) = checks_of(q, "prompt_logprobs")
        if relabel:  # the IDs line up: only the solo comparison tells
            assert rule["status"] == "pass", rule
        else:
            assert rule["status"] == "fail", rule
            assert "entries: entry 1 missing" in rule["detail"]
            assert "holds prompt token: entry " in rule["detail"]  # entry 2 on, mostly
            assert "lacks prompt token" in rule["detail"]
    refs = [q for q in scored(m) if q["phase"].startswith("references")]
    assert len(refs) == 8 and all(
        checks_of(q, "prompt_logprobs")[0]["status"] == "pass" for q in refs)
