"""Fault injection against the real CPU engine through engine doubles (tests/doubles.py).

A session-scoped real engine (embedded model, profiles/cpu-ngram.toml: ngram speculative decoding
k = 3, block size 32, max_num_batched_tokens 256, prefix caching) sits behind a forwarding double
that corrupts chosen outputs; the harness attaches to the double with --url.
"""
import pytest

from conftest import load_json, run_cli
from doubles import Corrupt, FaultProxy, FlipToken

pytestmark = pytest.mark.engine

C, B, K = 256, 32, 3
Q = 1 + K
FACTS = ["--block-size", str(B), "--chunk-size", str(C), "--num-speculative-tokens", str(K)]


def stress_via(proxy, tmp_path, run_id, *args):
    r = run_cli("stress", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *FACTS, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def failing(m, check=None):
    return [q for q in m["requests"]
            if (check is None and (q["match"] is False or any(c["status"] == "fail" for c in q["checks"])))
            or (check is not None and any(c["name"] == check and c["status"] == "fail"
                                          for c in q["checks"]))]


def test_flipped_token_is_reported(cpu_engine, tmp_path):
    # warm-up 4 + references 8 cold + 8 warm = 20 requests; then C4 (21-28), then C3 (29-34).
    fault = FlipToken(request_number=30, pos=5, vocab=1024)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy, tmp_path, "flip", "--scenario", "transitions", "--repeats", "1")
    assert fault.flipped, "the double never flipped a token"
    assert r.returncode == 1, out[-3000:]
    assert m["verdict"] == "fail" and m["status"] == "complete"
    bad = [q for q in m["requests"] if q["match"] is False]
    assert len(bad) == 1
    assert bad[0]["concurrency"] == 3 and bad[0]["first_divergence"] == 5
    assert bad[0]["output_ids"][5] == fault.flipped["new"]
    d = bad[0]["divergence"]  # the trained model is far from a tie there: corruption
    assert d["class"] == "hard" and d["fails"] and d["margin_nats"] > 0.1
    assert d["observed_token"] == fault.flipped["new"] and d["reference_token"] == fault.flipped["old"]
    # 40 ladder requests + 8 warm references judged against the cold runs
    assert m["summary"]["hashes_matched"] == m["summary"]["hashes_compared"] - 1 == 47
    assert "failing requests" in out and bad[0]["id"] in out
    assert "8/8 phases completed; 47/48 token hashes matched" in out


def test_q_tail_corruption_is_pinned_to_its_lengths(cpu_engine, tmp_path):
    # Corrupt every output whose prompt length L has L mod C == q (chat-shaped lengths, L > C).
    def select(ctx):
        n = len(ctx.body["prompt"])
        return n > C and n % C == Q
    fault = Corrupt(select, lambda t, pos: ((t + 1) % 700, "#"))
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy, tmp_path, "qtail", "--scenario", "boundary")
    assert r.returncode == 1, out[-3000:]
    rows = {row["length"]: row for row in m["tables"]["boundary"]}
    failing_lengths = sorted(L for L, row in rows.items() if row["checks_failed"])
    assert failing_lengths == [C + Q, 2 * C + Q, 3 * C + Q]
    for L in failing_lengths:
        assert "expected_text" in rows[L]["checks_failed"]
        assert rows[L - 1]["checks_failed"] == [] and rows[L + 1]["checks_failed"] == []
        assert rows[L - 1]["cold"] == "ok" and rows[L + 1]["warm"] == "= cold"
    assert rows[B + Q]["checks_failed"] == []


def test_out_of_range_token_is_caught_by_vocab_range(cpu_engine, tmp_path):
    fault = Corrupt(lambda ctx: ctx.number == 3, lambda t, pos: (5000, "?"), start=2, stop=3)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy, tmp_path, "oor", "--scenario", "pairs")
    assert r.returncode == 1, out[-3000:]
    bad = failing(m, "vocab_range")
    assert len(bad) == 1 and "first: 5000 at position 2" in [c for c in bad[0]["checks"]
                                                             if c["name"] == "vocab_range"][0]["detail"]


def test_token_zero_run_is_caught_by_degeneration(cpu_engine, tmp_path):
    # the 21st request is the first of the C4 ladder phase; its output from position 4 on is 0s
    fault = Corrupt(lambda ctx: ctx.number == 21, lambda t, pos: (0, "!"), start=4)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy, tmp_path, "zeros", "--scenario", "transitions",
                               "--repeats", "1")
    assert r.returncode == 1, out[-3000:]
    bad = failing(m, "degeneration")
    assert len(bad) == 1
    detail = [c for c in bad[0]["checks"] if c["name"] == "degeneration"][0]["detail"]
    assert "run of 28 x token ID 0" in detail
    assert bad[0]["match"] is False and bad[0]["first_divergence"] == 4


def test_warm_run_differing_from_cold_is_caught(cpu_engine, tmp_path):
    target = B + Q  # the warm (second) run of L = B + q gets a different token at position 1
    fault = Corrupt(lambda ctx: len(ctx.body["prompt"]) == target and fault.occurrence(ctx) == 2,
                    lambda t, pos: ((t + 1) % 700, "#"), start=1, stop=2)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy, tmp_path, "warm", "--scenario", "boundary")
    assert r.returncode == 1, out[-3000:]
    rows = {row["length"]: row for row in m["tables"]["boundary"]}
    assert rows[target]["warm"].startswith("DIFFERS from cold at 1 (")
    assert all(row["warm"] == "= cold" for L, row in rows.items() if L != target)
    bad = [q for q in m["requests"] if q["match"] is False]
    assert len(bad) == 1 and bad[0]["phase"] == "boundary-warm" and bad[0]["prompt_len"] == target


def test_broken_counting_in_ongoing_decode(cpu_engine, tmp_path):
    # the decode is the only long request (max_tokens 3 x 300, capped by max_model_len); its
    # third run (after the cold and the warm reference: the insert phase) skips a number
    fault = Corrupt(lambda ctx: ctx.body.get("max_tokens") > 300 and fault.occurrence(ctx) == 3,
                    lambda t, pos: (t + 1, " 999"), start=100, stop=101)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress_via(proxy, tmp_path, "count", "--scenario", "insert")
    assert r.returncode == 1, out[-3000:]
    bad = failing(m, "counting")
    assert len(bad) == 1 and bad[0]["phase"] == "insert" and bad[0]["note"] == "ongoing decode"
    detail = [c for c in bad[0]["checks"] if c["name"] == "counting"][0]["detail"]
    assert detail == "word 101 is '999', expected '101'"
    assert bad[0]["match"] is False and bad[0]["first_divergence"] == 100
    others = [q for q in m["requests"] if q["phase"] == "insert" and q["id"] != bad[0]["id"]]
    assert others and all(q["match"] for q in others)
