"""Issue 48 on the real CPU engine: the main job completes on any engine shape, with no usage
error once the engine runs.

- behind a fault double that cuts every output short (the session engine, profiles/cpu-ngram.toml,
  attached through :class:`doubles.FaultProxy`): FAIL (exit 1), every planned phase run or left
  out with its reason, mixed_params' variants that its short default outputs cannot build left
  out naming the finding (before: "usage error ... its prompt's default request gave no token at
  position 8", exit 2 after 32 of 41 phases);
- (nightly: it launches an engine of its own) the embedded default with ``--max-model-len 256``
  and a chunk budget of 512 above it: PASS, prompt_logprobs vacuous (no prompt is chunked),
  boundary's n*C + q family and the pairs that need a chunk named (before: exit 2, 0 phases).
"""
import pytest

from conftest import load_json, run_cli, scenario_variant
from doubles import FaultProxy
from pleharness.config import DEFAULT_SCENARIOS
from pleharness.faults.builtin import CutShort
from pleharness.planning import load_plan_facts, plan_suite
from pleharness.scenarios import load_scenarios

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3",
         "--max-num-seqs", "8"]


class CutEvery(CutShort):
    """CutShort on every completion request (half its max_tokens, consistent usage)."""

    every = 1


def accounted(m: dict) -> None:
    """Every planned load phase ran or was left out with its reason; no usage error."""
    s = m["summary"]
    load = [p for p in m["phases"] if p["role"] == "load"]
    assert s["phases_completed"] + s["phases_left_out"] == s["phases_planned"] == len(load), s
    assert all(p["status"] in ("pass", "fail", "skip") for p in load)
    assert all(p["vacuous"] for p in load if p["status"] == "skip")
    assert "usage error" not in (m.get("reason") or "")


@pytest.mark.engine
def test_an_engine_that_cuts_every_output_short_fails_and_runs_every_phase(cpu_engine,
                                                                           tmp_path):
    fault = CutEvery()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        # the scenarios whose outputs a cut feeds into later requests (mixed_params builds its
        # variants from its default requests' outputs: exit 2 here before issue 48), beside
        # short runs of the ladder and boundary (issue 49: the suite's time; every phase of the
        # default suite accounted for: test_a_short_context_..., nightly)
        r = run_cli("stress", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id",
                    "cut", *FACTS, "--scenario", "mixed_params", "--scenario", "stop_strings",
                    "--scenario", "prompt_logprobs", "--scenario", "transitions", "--ladder", "2",
                    "--repeats", "1", "--scenario",
                    scenario_variant(tmp_path, "boundary", depth=1, edges=False, q_solo_runs=3),
                    timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    m = load_json(tmp_path / "cut" / "manifest.json")
    assert m["status"] == "complete" and m["verdict"] == "fail", m.get("reason")
    accounted(m)
    assert m["summary"]["checks_failed"] > 0 and "usage error" not in out
    rows = {row["variant"]: row for row in m["tables"]["mixed_params"]}
    assert "cut short, a finding of the default request's checks: no token at position 8" in \
        rows["stop-token"]["left_out"]
    before = [q for q in m["requests"] if q["phase"].endswith("mixed-before-c8")]
    assert before and all(any(c["name"] == "usage" and c["status"] == "fail"
                              for c in q["checks"]) for q in before)


@pytest.mark.nightly
def test_a_short_context_with_a_chunk_budget_above_it_completes(tmp_path):
    r = run_cli("stress", "--engine-arg=--max-model-len=256",
                "--engine-arg=--max-num-batched-tokens=512", "--results-dir", str(tmp_path),
                "--run-id", "short", timeout=3600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    m = load_json(tmp_path / "short" / "manifest.json")
    assert m["status"] == "complete" and m["verdict"] == "pass"
    assert m["facts"]["max_model_len"]["value"] == 256
    accounted(m)
    vac = m["summary"]["vacuous"]
    assert any(v.startswith("phase prompt-logprobs-c4: chunked prefill not exercised: the chunk "
                            "budget C = 512 is not below max_model_len 256") for v in vac), vac
    assert any(v.startswith("phase boundary-cold: n*C + q lengths not tested") for v in vac)
    # the plan of `scenarios --facts RUN` is what the run did: the same phases left out and
    # vacuous, the same requests per phase (chat_api's conversations aside: the plan's
    # tokenizer is not the model's)
    facts, assume, _ = load_plan_facts(tmp_path / "short")
    plan = plan_suite(load_scenarios(list(DEFAULT_SCENARIOS), {}), facts, assume)
    planned = {ph.name: ph for p in plan.plans for ph in p.load}
    ran = {p["name"]: p for p in m["phases"] if p["role"] == "load"}
    assert set(planned) == set(ran)
    assert {n for n, ph in planned.items() if ph.vacuous} == {n for n, p in ran.items()
                                                               if p["vacuous"]}
    assert {n: ph.requests for n, ph in planned.items() if not n.startswith("chat-api")} == \
        {n: p["requests"] for n, p in ran.items() if not n.startswith("chat-api")}
