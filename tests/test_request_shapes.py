"""Issue 52 against the real CPU engine: the request shapes the suite did not send before, in
``mixed_params`` beside default greedy requests, on an engine without speculative decoding (as
the embedded default serves) with a tiny LoRA adapter built here with peft (no download):

- sampling parameters in one batch: seeded top_k / top_p / min_p samples beside greedy
  requests, each equal to its solo reference; a double that drops a sample's truncation while a
  greedy request is in flight (``TruncationLostBesideGreedy``) fails exactly those samples;
- stops with min_tokens: a stop string, a stop ID and a forced EOS held back by min_tokens; a
  double that drops min_tokens under load (``MinTokensLostUnderLoad``) fails ``stop_token``;
- special tokens: a forced EOS kept in the text (skip_special_tokens false) and the EOS named as
  a stop ID with ignore_eos; a double that drops skip_special_tokens under load
  (``SpecialTextSkippedUnderLoad``) fails ``special_tokens``;
- LoRA: a request for the adapter beside base requests; a double that gives base requests in
  flight beside it the adapter's effect (``AdapterOnBaseNeighbour``) fails their parity; an engine
  without adapters leaves the variant out with the reason (the session engine, cpu-ngram).

- stops in streams (``stop_strings``): a stop string whose tokens come in two streamed deltas;
  a double that matches stop strings in each delta's text alone (``StopMatchedPerDelta``) fails
  exactly the streamed requests of those stops (``stop_string``);
- several choices with seeds and logprobs (``choices``): each seeded choice's logprobs equal
  those of the n = 1 request of its derived seed (``logprob_parity``); a double that hands
  choice 1 choice 0's logprobs (``ChoiceLogprobsSwapped``) fails exactly those choices.

The clean engine passes each, and ``ple-harness selftest`` with the six family classes
detects each with 0 false alarms.
"""
import json

import pytest

from conftest import NO_GOLDEN, load_json, run_cli
from doubles import FaultProxy
from faults_request_shapes import (AdapterOnBaseNeighbour, ChoiceLogprobsSwapped,
                                   MinTokensLostUnderLoad, SpecialTextSkippedUnderLoad,
                                   StopMatchedPerDelta, TruncationLostBesideGreedy)

pytestmark = pytest.mark.engine

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "0"]
SEEDED = ("top-k", "top-p", "min-p")
MIN_TOKENS = ("min-tokens", "min-tokens-stop", "min-tokens-eos")


def stress(url, tmp_path, run_id, *scenarios, more=()):
    args = [a for s in scenarios for a in ("--scenario", s)] + list(more)
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                "--no-engine-probe", *FACTS, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def failed(q, name=None):
    return [c for c in q["checks"] if c["status"] == "fail" and (name is None or c["name"] == name)]


def variant_records(m, phase_end="mixed-c8"):
    """{variant name: its record in the phase ending with ``phase_end``}."""
    return {q["note"].split(" ", 1)[1]: q for q in m["requests"]
            if q["phase"].endswith(phase_end) and (q.get("note") or "").startswith("variant ")}


def test_clean_engine_passes_every_new_shape(plain_engine, tmp_path):
    r, out, m = stress(plain_engine.url, tmp_path, "clean", "mixed_params")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    rows = {row["variant"]: row for row in m["tables"]["mixed_params"]}
    assert not any(row["left_out"] for row in rows.values()), rows
    got = variant_records(m)
    for v in (*SEEDED, "adapter", *MIN_TOKENS, "special-text", "stop-eos-id"):
        assert rows[v]["compared"] and got[v]["match"] is True, (v, got[v])
    for v in (*SEEDED, "adapter", "min-tokens-eos", "special-text", "stop-eos-id"):
        assert rows[v]["differs_from_default"] is True, v  # each shape changed its output
    for v in SEEDED:  # one-token prompts, sampled with their seed and truncation
        q = got[v]
        assert q["prompt_len"] == 1 and q["seed"] is not None and q["temperature"] == 1.0
    assert got["top-k"]["top_k"] == 3 and got["top-p"]["top_p"] == 0.7
    assert got["min-p"]["params"]["min_p"] == 0.1
    assert got["adapter"]["params"]["model"] == "tiny-lora"
    # the stop string completes at position 2 of the default output: min_tokens held it back
    assert got["min-tokens-stop"]["params"]["stop"] and got["min-tokens-stop"]["output_len"] >= 6
    # min_tokens held each stop back: the forced EOS comes exactly at position 6
    eos = got["min-tokens-eos"]
    assert eos["output_len"] == 7 and eos["finish_reason"] == "stop"
    assert got["min-tokens-stop"]["output_len"] >= 6
    stop_eos = got["stop-eos-id"]  # the EOS named as a stop ID, with ignore_eos, after 3
    assert stop_eos["output_len"] == 4 and stop_eos["finish_reason"] == "stop"
    for v in (*MIN_TOKENS, "stop-eos-id"):
        assert [c["status"] for c in got[v]["checks"] if c["name"] == "stop_token"] == ["pass"]
    special = [c for c in got["special-text"]["checks"] if c["name"] == "special_tokens"]
    assert [c["status"] for c in special] == ["pass"] and "kept" in special[0]["detail"]
    # the default greedy requests beside them equal their solo references
    mixed = [q for q in m["requests"] if q["phase"].endswith("mixed-c8")]
    assert all(q["match"] for q in mixed if q["temperature"] == 0 and not q.get("params"))


def test_truncation_lost_beside_greedy_fails_the_seeded_samples(plain_engine, tmp_path):
    fault = TruncationLostBesideGreedy()
    with FaultProxy(plain_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "truncation", "mixed_params")
    assert fault.dropped
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if failed(q)]
    assert bad
    for q in bad:  # only the truncated samples under load, by parity with their solo runs
        assert q["phase"].endswith("mixed-c8") and q["temperature"] == 1.0, q
        assert q["match"] is False and failed(q, "parity")
        assert q["note"].split(" ", 1)[1] in SEEDED


def test_min_tokens_lost_under_load_fails_the_stop_token_floor(plain_engine, tmp_path):
    fault = MinTokensLostUnderLoad()
    with FaultProxy(plain_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "min-tokens", "mixed_params")
    assert fault.dropped
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    got = variant_records(m)
    (rule,) = failed(got["min-tokens-eos"], "stop_token")
    assert "min_tokens: stop ID 1 at position 0, before min_tokens 6" in rule["detail"]
    assert "fewer than min_tokens 6" in failed(got["min-tokens-stop"], "stop_token")[0]["detail"]
    bad = [q for q in m["requests"] if failed(q)]
    assert all(q["params"] and "min_tokens" in q["params"] for q in bad), bad


def test_special_tokens_skipped_under_load_fail_the_special_tokens_check(plain_engine, tmp_path):
    fault = SpecialTextSkippedUnderLoad()
    with FaultProxy(plain_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "special", "mixed_params")
    assert fault.dropped
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if failed(q)]
    assert [q["note"] for q in bad] == ["variant special-text"], bad
    (rule,) = failed(bad[0])
    assert rule["name"] == "special_tokens" and "skip_special_tokens false" in rule["detail"]
    assert bad[0]["match"] is True  # its IDs are right: only the text lost its </s>


def test_adapter_on_base_neighbours_fails_their_parity(plain_engine, tmp_path):
    fault = AdapterOnBaseNeighbour()
    with FaultProxy(plain_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "adapter", "mixed_params", more=[NO_GOLDEN])
    assert fault.changed and fault.base == "ple-tiny-llama"
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if failed(q)]
    assert bad
    for q in bad:  # base requests in flight beside the adapter's, by parity
        assert q["phase"].endswith("mixed-c8") and "model" not in (q.get("params") or {}), q
        assert q["match"] is False and failed(q, "parity")
    assert variant_records(m)["adapter"]["match"] is True


def test_stop_strings_straddling_deltas_pass_clean(plain_engine, tmp_path):
    r, out, m = stress(plain_engine.url, tmp_path, "straddle-clean", "stop_strings")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    rows = m["tables"]["stop_strings"]
    assert any(x["straddles"] for x in rows) and not all(x["straddles"] for x in rows)
    (ph,) = [p for p in m["phases"] if p["name"].endswith("stop-c8")]
    assert [c["status"] for c in ph["checks"] if c["name"] == "stop_straddles_deltas"] == \
        ["pass"]


def test_stop_matched_per_delta_fails_exactly_the_straddling_stops(plain_engine, tmp_path):
    fault = StopMatchedPerDelta()
    with FaultProxy(plain_engine.url, fault) as proxy:
        fault.proxy = proxy
        r, out, m = stress(proxy.url, tmp_path, "straddle", "stop_strings")
    assert fault.missed
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    straddling = {(x["prompt_key"], x["stop"]) for x in m["tables"]["stop_strings"]
                  if x["straddles"]}
    bad = [q for q in m["requests"] if failed(q)]
    assert bad
    for q in bad:  # only requests of a straddling stop
        assert (q["prompt_key"], q["params"]["stop"][0]) in straddling, q
        if q["stream"] and q.get("api") != "chat":  # ran on past the stop: stop_string
            assert failed(q, "stop_string"), q
            assert q["finish_reason"] == "length" and q["output_len"] == q["max_tokens"]
        else:  # stopped right, unlike its (streamed) reference: parity only
            assert {c["name"] for c in failed(q)} == {"parity"}, q
    streamed = {(q["prompt_key"], q["params"]["stop"][0]) for q in bad
                if q["stream"] and q.get("api") != "chat"}
    assert streamed == straddling
    others = [q for q in m["requests"] if (q.get("params") or {}).get("stop")
              and (q["prompt_key"], q["params"]["stop"][0]) not in straddling]
    assert others and all(q["finish_reason"] == "stop" for q in others)


def test_seeded_choices_report_their_derived_seeds_logprobs(plain_engine, tmp_path):
    r, out, m = stress(plain_engine.url, tmp_path, "choices-clean", "choices")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    seeded = [q for q in m["requests"] if q.get("n") and q["seed"] and q["phase"] == "choices-c4"]
    assert seeded and all(q["match"] for q in seeded)
    lp = [c for q in seeded for c in q["checks"] if c["name"] == "logprob_parity"]
    assert len(lp) == len(seeded) and {c["status"] for c in lp} == {"pass"}

    fault = ChoiceLogprobsSwapped()
    with FaultProxy(plain_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "choices-swapped", "choices")
    assert fault.changed
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if failed(q)]
    assert bad
    for q in bad:  # choice 1 of a seeded request under load: its IDs right, its logprobs not
        assert q["choice"] == 1 and q["seed"] and q["match"] is True, q
        assert [c["name"] for c in failed(q)] == ["logprob_parity"], q


@pytest.mark.nightly  # 70 s: each class's fault is caught by its rule in its own engine test above
def test_selftest_family_classes_of_issue_52_are_detected(plain_engine, tmp_path):
    faults = ("truncation_lost_beside_greedy", "min_tokens_lost_under_load",
              "special_text_skipped_under_load", "adapter_on_base_neighbour",
              "stop_matched_per_delta", "choice_logprobs_swapped")
    args = [a for f in faults for a in ("--fault", f)]
    r = run_cli("selftest", "--url", plain_engine.url, "--results-dir", str(tmp_path),
                "--run-id", "st", *args)
    data = json.loads((tmp_path / "st" / "selftest.json").read_text())
    assert r.returncode == 0, r.stdout[-4000:]
    assert data["headline"] == ("this suite on this engine catches 6/6 planted fault classes; "
                                "0 false alarms")
    rows = {p["name"]: p for p in data["passes"]}
    want = {"truncation_lost_beside_greedy": "parity", "min_tokens_lost_under_load": "stop_token",
            "special_text_skipped_under_load": "special_tokens",
            "adapter_on_base_neighbour": "parity", "stop_matched_per_delta": "stop_string",
            "choice_logprobs_swapped": "logprob_parity"}
    ran = {"stop_matched_per_delta": ["stop_strings"], "choice_logprobs_swapped": ["choices"]}
    for name, rule in want.items():
        assert rows[name]["outcome"] == "detected" and rows[name]["fired"] > 0, rows[name]
        assert rule in rows[name]["caught_by"], rows[name]
        assert rows[name]["ran"] == ran.get(name, ["mixed_params"])
