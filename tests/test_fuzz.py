"""`ple-harness fuzz` (pleharness/scenarios/fuzz.py): schedule strategies, the reproducer file, the
search and shrink loop against engine doubles.

- unit: the schedule space derived from facts, the strategy's bounds, repro.toml round trip;
- FakeEngine (no model, fast): a fault that flips position 5 of every load run of the 260-token
  prompt (n*C + q); fuzz must find it, shrink it to exactly one request of that length with
  max_tokens 6 (the shortest output that reaches position 5), write a repro that fails when
  replayed, and a rerun with the same --db replays the failure first;
- engine (real CPU engine behind tests/doubles.py CorruptWhenCrowded): the planted combination
  (L = n*C + q while >= 3 in flight) is found and the clean engine passes, with small budgets.
"""
import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import load_json, run_cli
from doubles import CorruptWhenCrowded, FakeEngine, FaultProxy
from pleharness.scenarios import load_scenario_file
from pleharness.scenarios.fuzz import (FuzzParams, FuzzPhase, FuzzRequest, Schedule, build_space,
                                       concurrency_edges, schedules, write_repro)

FACTS = {"num_speculative_tokens": 3, "block_size": 32, "max_num_batched_tokens": 256,
         "max_model_len": 1024, "max_num_seqs": 8, "vocab_size": 793}
CLI_FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3",
             "--max-num-seqs", "8"]


def test_space_from_facts():
    sp = build_space(FACTS, FuzzParams(max_tokens=12, depth=2))
    lengths = [x for x, _ in sp.lengths]
    for want in (3, 4, 5, 35, 36, 37, 259, 260, 261, 515, 516, 517):
        assert want in lengths
    assert max(lengths) == 1024 - 12  # the M edge: prompt + max_tokens = M
    assert sp.max_len == 1012 and sp.q == 4
    assert sp.concurrency_edges == [1, 2, 8]


def test_concurrency_edges_follow_capture_sizes_and_q():
    edges = concurrency_edges({"num_speculative_tokens": 3, "max_num_seqs": 64,
                               "cudagraph_capture_sizes": [1, 2, 4, 8, 16]}, cap=16)
    # s and s + 1, s // q and s // q + 1 (c * q crosses s), max_num_seqs capped away
    for want in (1, 2, 3, 4, 5, 8, 9, 16):
        assert want in edges
    assert max(edges) == 16 and 17 not in edges


def test_no_room_for_a_prompt_is_a_usage_error():
    from pleharness.scenarios.base import ScenarioError
    with pytest.raises(ScenarioError, match="no room"):
        build_space({**FACTS, "max_model_len": 10}, FuzzParams(max_tokens=12))


SPACE = build_space(FACTS, FuzzParams(max_tokens=9, max_concurrency=6, max_phases=5))


@settings(max_examples=60, deadline=None, database=None)
@given(schedules(SPACE))
def test_schedules_stay_in_the_space(sched):
    assert 1 <= len(sched.phases) <= 5
    seen_new = set()
    for ph in sched.phases:
        assert 1 <= ph.concurrency <= 6 and len(ph.requests) == ph.concurrency
        in_phase = set()
        for r in ph.requests:
            assert 1 <= r.length <= SPACE.max_len and 1 <= r.max_tokens <= 9
            ident = (r.length, r.shape, r.seed)
            if r.source == "warm":
                assert ident in seen_new  # a repeat of an earlier phase's prompt
            if r.source == "copy":
                assert ident in in_phase  # a copy of a request already in this phase
            in_phase.add(ident)
        seen_new |= {(r.length, r.shape, r.seed) for r in ph.requests if r.source == "new"}


def test_strategy_reaches_every_residue_and_the_edges():
    from hypothesis import find
    for res in range(4):
        find(schedules(SPACE), lambda s, res=res: any(r.max_tokens % 4 == res
                                                     for p in s.phases for r in p.requests),
             settings=settings(database=None, max_examples=500))
    find(schedules(SPACE), lambda s: any(r.length == 260 for p in s.phases for r in p.requests),
         settings=settings(database=None, max_examples=500))
    find(schedules(SPACE), lambda s: any(r.source == "copy" for p in s.phases
                                         for r in p.requests),
         settings=settings(database=None, max_examples=500))


def test_repro_round_trips_as_a_replay_scenario(tmp_path):
    from pleharness.request import RequestSpec
    from pleharness.scenarios.replay import prompt_of
    sched = Schedule((FuzzPhase(3, (FuzzRequest("new", 5, "random", 0, 2, True, "q + 1"),) * 3),
                      FuzzPhase(1, (FuzzRequest("warm", 5, "random", 0, 7, False, 'a "q"'),))))
    specs = [[RequestSpec(prompt_of([20, 21, 22, 23, 24]), r.max_tokens) for r in ph.requests]
             for ph in sched.phases]
    path = tmp_path / "repro.toml"
    write_repro(specs, sched, path, "run1")
    sc = load_scenario_file(str(path))
    assert sc.kind == "replay"
    got = [(ph.concurrency, [(r.prompt, r.max_tokens, r.stream) for r in ph.requests])
           for ph in sc.params.phases]
    assert got == [(3, [([20, 21, 22, 23, 24], 2, True)] * 3),
                   (1, [([20, 21, 22, 23, 24], 7, False)])]
    assert sched.summary() == "C3[5+2,5+2,5+2] | C1[5wn+7]"


def test_usage_errors(tmp_path):
    r = run_cli("fuzz", "--url", "http://127.0.0.1:9", "--max-examples", "0")
    assert r.returncode == 2
    (tmp_path / "f").write_text("x")
    r = run_cli("fuzz", "--url", "http://127.0.0.1:9", "--db", str(tmp_path / "f"))
    assert r.returncode == 2 and "--db" in r.stderr
    r = run_cli("fuzz", "--url", "http://127.0.0.1:9", "--model", "x")
    assert r.returncode == 2 and "--url" in r.stderr


def flip_load_runs(length):
    """FakeEngine behaviour: flip position 5 (hard, 4 nats) of every run of a ``length``-token
    prompt after its two solo reference runs (occurrence >= 3)."""
    seen, lock = {}, threading.Lock()

    def behave(n, body):
        key = (tuple(body.get("prompt") or []), body.get("max_tokens"))
        with lock:
            seen[key] = seen.get(key, 0) + 1
            occ = seen[key]
        return "flip_hard" if len(key[0]) == length and occ >= 3 else None
    return behave


def fuzz_fake(eng, tmp_path, run_id, *args):
    r = run_cli("fuzz", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *CLI_FACTS, "--vocab-size", "600", "--max-tokens", "8", "--no-golden", *args,
                timeout=600)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def test_finds_and_shrinks_a_planted_length_fault(tmp_path):
    db = tmp_path / "db"
    with FakeEngine(flip_load_runs(260)) as eng:
        r, out, m = fuzz_fake(eng, tmp_path, "a", "--max-examples", "100", "--seed", "5",
                              "--db", str(db), "--max-phases", "4", "--max-concurrency", "4")
    assert r.returncode == 1, out[-3000:]
    t = m["tables"]
    s = t["fuzz_summary"][0]
    assert s["examples_to_failure"] is not None and s["confirmed"] is True
    # exactly the planted combination: one request, 260 tokens, the shortest max_tokens that
    # reaches the flipped position 5
    assert t["fuzz_failing"] == [{**t["fuzz_failing"][0], "phase": 1, "concurrency": 1,
                                  "prompt_len": 260, "max_tokens": 6}]
    assert s["minimal_schedule"] == "C1[260+6]"
    steps = t["fuzz_shrink_steps"]
    assert steps[-1]["schedule"] == "C1[260+6]" and steps[0]["requests"] >= steps[-1]["requests"]
    stages = {x["stage"] for x in t["fuzz_examples"]}
    assert {"search", "confirm"} <= stages
    assert stages <= {"search", "shrink", "delete", "delete-retry", "confirm"}
    assert len(t["fuzz_examples"]) == s["examples_run"] + 1  # + the confirming replay
    assert m["verdict"] == "fail" and m["exit_code"] == 1
    repro = tmp_path / "a" / "repro.toml"
    sc = load_scenario_file(str(repro))
    assert [len(r.prompt) for ph in sc.params.phases for r in ph.requests] == [260]
    # the repro fails when replayed (a fresh double: its solo runs are clean again) ...
    with FakeEngine(flip_load_runs(260)) as eng:
        r = run_cli("stress", "--url", eng.url, "--scenario", str(repro), "--results-dir",
                    str(tmp_path), "--run-id", "replay", *CLI_FACTS, "--vocab-size", "600",
                    "--no-golden", timeout=300)
    assert r.returncode == 1, (r.stdout + r.stderr)[-2000:]
    # ... and a rerun with the same database replays the failing example first
    with FakeEngine(flip_load_runs(260)) as eng:
        r, out, m2 = fuzz_fake(eng, tmp_path, "b", "--max-examples", "40", "--seed", "99",
                               "--db", str(db), "--max-phases", "4", "--max-concurrency", "4",
                               "--no-shrink")
    assert r.returncode == 1, out[-3000:]
    assert m2["tables"]["fuzz_summary"][0]["examples_to_failure"] == 1
    assert "260+6" in m2["tables"]["fuzz_examples"][0]["schedule"]


def test_clean_double_passes_within_its_budget(tmp_path):
    with FakeEngine() as eng:
        r, out, m = fuzz_fake(eng, tmp_path, "c", "--max-examples", "15", "--seed", "1")
    assert r.returncode == 0, out[-3000:]
    s = m["tables"]["fuzz_summary"][0]
    # distinct schedules run (hypothesis may draw one twice: the engine's answer is memoised)
    assert 0 < s["examples_run"] <= 15 and s["failing_examples"] == 0 and s["repro"] is None
    assert len(m["tables"]["fuzz_examples"]) == s["examples_run"]
    assert not (tmp_path / "c" / "repro.toml").exists()
    assert all(x["status"] == "pass" for x in m["tables"]["fuzz_examples"])
    assert m["summary"]["hashes_compared"] == m["summary"]["hashes_matched"] > 0


# -- the real CPU engine ----------------------------------------------------------------------
C, K, VOCAB = 256, 3, 793


@pytest.mark.engine
def test_engine_planted_crowded_fault_is_found(cpu_engine, tmp_path):
    """L = n*C + q corrupted only while >= 3 requests are in flight: found within 40 examples
    with seed 2 (--no-shrink: the first failing example is the repro), which names a 260-token
    request in a phase of >= 3; the repro replayed straight against the engine passes (the
    fault is the double's). Replaying through a fresh double: the FakeEngine test above and
    benchmarks/fuzz_find_rate.py."""
    fault = CorruptWhenCrowded(C + 1 + K, 3, VOCAB)
    proxy = FaultProxy(cpu_engine.url, fault)
    fault.proxy = proxy
    with proxy:
        r = run_cli("fuzz", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id", "f",
                    *CLI_FACTS, "--max-examples", "40", "--seed", "2", "--no-shrink",
                    "--max-tokens", "6", "--no-golden", timeout=900)
    out = r.stdout + r.stderr
    m = load_json(tmp_path / "f" / "manifest.json")
    assert fault.hits, "the double never corrupted a request"
    assert r.returncode == 1, out[-3000:]
    rows = m["tables"]["fuzz_failing"]
    assert any(x["prompt_len"] == C + 1 + K and x["concurrency"] >= 3 for x in rows)
    repro = tmp_path / "f" / "repro.toml"
    assert repro.exists()
    r = run_cli("stress", "--url", cpu_engine.url, "--scenario", str(repro), "--results-dir",
                str(tmp_path), "--run-id", "clean-replay", *CLI_FACTS, "--no-golden",
                timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]


@pytest.mark.engine
def test_engine_clean_fuzz_passes(cpu_engine, tmp_path):
    r = run_cli("fuzz", "--url", cpu_engine.url, "--results-dir", str(tmp_path), "--run-id", "c",
                *CLI_FACTS, "--max-examples", "8", "--seed", "5", "--max-tokens", "6",
                "--no-golden", timeout=900)
    m = load_json(tmp_path / "c" / "manifest.json")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    s = m["tables"]["fuzz_summary"][0]
    assert 0 < s["examples_run"] <= 8 and s["failing_examples"] == 0
    assert json.dumps(m["tables"]["fuzz_examples"])  # serialisable rows
