"""Issue 26 item 1 on the real CPU engine (session fixture ``cpu_engine``: the embedded model with
ngram speculative decoding k = 3, block size 32, max_num_batched_tokens 256): the ``sampled``
scenario passes on the clean engine, and engine doubles in front of it plant, under load only
(two or more requests in flight), an out-of-vocabulary ID and ``!!!!`` runs in sampled answers,
and a shifted first token: the run fails naming the request and the rule, or the runs and the
degeneration rate, or the prompt and the distribution test."""
import pytest

import clean_scenarios
from conftest import load_json, run_cli
from doubles import Fault, FaultProxy
from pleharness.faults.families import FirstTokenUnderLoad, unseeded_sample

pytestmark = pytest.mark.engine

VOCAB = 793
FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]
BANG = 6  # token "!" of the embedded model's vocabulary


def stress(url, tmp_path, run_id, *extra):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *FACTS, "--scenario", "sampled", *extra)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def failed(m, check):
    return [q for q in m["requests"]
            if any(c["name"] == check and c["status"] == "fail" for c in q["checks"])]


class BadSampleUnderLoad(Fault):
    """The first unseeded sampled boundary request (16 tokens) that arrives with another request
    in flight gets ID VOCAB + 1000 at position 1; every later one "!" from position 2 on (the
    seeds' bug: a corruption under load that many samples show)."""

    def __init__(self):
        self.planted: dict[str, dict] = {}

    def chunk(self, ctx, chunk):
        if "kind" not in ctx.state:
            kind = None
            if unseeded_sample(ctx) and ctx.in_flight >= 2 and ctx.body["max_tokens"] == 16:
                kind = "bang" if "oov" in self.planted else "oov"
                self.planted.setdefault(kind, []).append(
                    {"number": ctx.number, "in_flight": ctx.in_flight,
                     "prompt_len": len(ctx.body["prompt"])})
            ctx.state["kind"] = kind
        kind = ctx.state["kind"]
        if kind is None:
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                pos = ctx.tokens_so_far + i
                if kind == "oov" and pos == 1:
                    ids[i] = VOCAB + 1000
                elif kind == "bang" and pos >= 2:
                    ids[i] = BANG
            if kind == "bang" and ids and ctx.tokens_so_far + len(ids) > 2:
                keep = max(0, 2 - ctx.tokens_so_far)
                ch["text"] = (ch.get("text") or "")[:keep] + "!" * (len(ids) - keep)
        return chunk


@pytest.mark.nightly  # default (issue 49): test_e2e_cpu.py::test_stress_default_suite_launch
# asserts clean_scenarios.sampled on the default suite's run
def test_clean_engine_passes_the_sampled_scenario(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "clean")
    assert r.returncode == 0, out[-3000:]
    clean_scenarios.sampled(m)


def test_invalid_id_and_bang_runs_under_load_fail_naming_the_request_and_the_rate(cpu_engine,
                                                                                 tmp_path):
    fault = BadSampleUnderLoad()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "bad")
        numbers = {ctx.number: ctx for ctx in proxy.log}
    assert len(fault.planted["oov"]) == 1 and len(fault.planted["bang"]) >= 6, fault.planted
    assert r.returncode == 1, out[-3000:]
    # the invalid ID fails its request
    (oov,) = failed(m, "vocab_range")
    assert oov["concurrency"] >= 2 and oov["temperature"] == 1.0
    assert oov["prompt_len"] == fault.planted["oov"][0]["prompt_len"] and oov["id"] in out
    assert "outside [0, 793)" in next(c["detail"] for c in oov["checks"]
                                      if c["name"] == "vocab_range")
    # each "!!!!" sample is a warning on its request; the rate against the solo samples of the
    # same prompts fails the last ladder phase, naming the runs
    bangs = [q for q in m["requests"] if any(
        c["name"] == "sampled_degeneration" and c["status"] == "warn" for c in q["checks"])]
    assert len(bangs) <= len(fault.planted["bang"])  # a sample that ended early is too short
    assert all(q["concurrency"] >= 2 and q["temperature"] == 1.0 for q in bangs)
    detail = next(c["detail"] for c in bangs[0]["checks"] if c["name"] == "sampled_degeneration")
    assert "run of 14 x token 6" in detail and "'!'" in detail
    (row,) = [x for x in m["tables"]["sampled_distribution"] if x["test"] == "degeneration"]
    assert row["verdict"] == "fail" and row["p_value"] <= row["threshold"], row
    assert f"{len(bangs)}/{row['load']} samples under load" in row["detail"]
    assert f"0/{row['solo']} alone" in row["detail"]
    named = [q["id"] for q in bangs if q["id"] in row["detail"]]  # the first 3 to finish
    assert len(named) == 3, row["detail"]
    ph = [c for p in m["phases"] for c in p["checks"] if c["name"] == "sampled_degeneration"]
    assert [c["status"] for c in ph] == ["fail"] and "sampled_degeneration" in out
    # nothing else failed: the solo samples and every other load sample are clean; a "!!!!"
    # sample fails logprob_sanity too, as the double changes its IDs and not its logprobs
    bad = {q["id"]: {c["name"] for c in q["checks"] if c["status"] == "fail"}
           for q in m["requests"] if any(c["status"] == "fail" for c in q["checks"])}
    assert set(bad) >= {oov["id"]} | {q["id"] for q in bangs}
    assert len(bad) <= 1 + len(fault.planted["bang"])
    assert all(names == {"logprob_sanity"} for i, names in bad.items() if i != oov["id"])
    assert len(numbers) == len(m["requests"])


def test_first_token_shift_under_load_is_caught_by_the_distribution_test(cpu_engine, tmp_path):
    fault = FirstTokenUnderLoad()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "shift")
    assert len(fault.hits) > 0
    assert r.returncode == 1, out[-3000:]
    rows = [x for x in m["tables"]["sampled_distribution"] if x["test"] == "first_tokens"]
    assert rows and all(x["verdict"] == "fail" and x["p_value"] <= x["threshold"] for x in rows)
    for x in rows:
        assert "token 17 at position 0" in x["detail"]
    ph = [p for p in m["phases"] if any(c["name"] == "sampled_distribution"
                                        and c["status"] == "fail" for c in p["checks"])]
    assert len(ph) == 1 and ph[0]["status"] == "fail"
    assert "sampled_distribution" in out and rows[0]["prompt_key"] in out
    # no request-level check failed: only the distribution says so
    assert not [q for q in m["requests"] if q["temperature"] > 0
                and any(c["status"] == "fail" for c in q["checks"])]
