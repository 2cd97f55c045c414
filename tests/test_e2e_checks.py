"""Issue 24 on the real CPU engine (session fixture ``cpu_engine``: the embedded model with ngram
speculative decoding k = 3), through a FaultProxy (tests/faults_checks.py):

1. a model-behaviour miss (the model answers "Reply with OK." with OK, not with a count, and
   counts when asked to count, not "OK") is a note on the references (judged by the golden model)
   and on the load requests (judged by their references), and the run passes, while top_logprobs
   arrive with their keys reversed; the engine probe decides the seeded requests;
2. the same prompts with the right expectations, broken only under load, fail (expected_text and
   counting name the reference that passes), and a planted sentinel still fails logprob_sanity.
"""
import pytest
import requests

from conftest import NO_GOLDEN, load_json, run_cli
from doubles import Counted, FaultProxy, SentinelLogprobs
from faults_checks import BreakAnswerUnderLoad, Chain, ReverseTopLogprobs
from pleharness.model import SERVED_NAME

pytestmark = pytest.mark.engine

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]
OK_TEXT, COUNT_TEXT = "Reply with OK.", "Count from 1 to 8."
RELATIVE = ("expected_text", "counting")


def tokenize(url, **payload):
    r = requests.post(url + "/tokenize", json={"model": SERVED_NAME, **payload}, timeout=60)
    r.raise_for_status()
    return r.json()["tokens"]


def chat(url, text):
    return tokenize(url, messages=[{"role": "user", "content": text}], add_generation_prompt=True)


def replay(path, ok, count, ok_checks, count_checks):
    """A replay scenario: both prompts alone (C1), then together (C2; the count prompt
    non-streamed), 8 tokens each, with the given extra checks (TOML inline tables)."""
    lines = ['kind = "replay"']
    for name, c in (("C1", 1), ("C2", 2)):
        lines += ["[[params.phases]]", f'name = "{name}"', f"concurrency = {c}"]
        for ids, checks, stream in ((ok, ok_checks, True), (count, count_checks, c == 1)):
            lines += ["[[params.phases.requests]]", f"prompt = {ids}", "max_tokens = 8",
                      f"stream = {'true' if stream else 'false'}", f"checks = {checks}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def stress(url, tmp_path, run_id, *args):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                *FACTS, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def checks_named(m, name):
    return [(q, c) for q in m["requests"] for c in q["checks"] if c["name"] == name]


def test_model_behaviour_miss_is_a_note_and_reordered_logprobs_pass(cpu_engine, tmp_path):
    ok, count = chat(cpu_engine.url, OK_TEXT), chat(cpu_engine.url, COUNT_TEXT)
    miss = replay(tmp_path / "miss.toml", ok, count, "{ counting = { n = 3 } }",
                  "{ expected_text = { regex = '^\\s*OK' } }")
    ladder = tmp_path / "ladder.toml"
    ladder.write_text('kind = "transitions"\n[params]\nladder = [2]\nrepeats = 1\n'
                      'requests_per_slot = 1\nwarmup_requests = 0\nmax_tokens = 8\n'
                      'sampled_every = 2\n[params.prompts]\ncount = 4\nmin_len = 5\n'
                      'max_len = 40\n')
    fault = ReverseTopLogprobs()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "miss", "--scenario", str(miss),
                           "--scenario", str(ladder), "--engine-probe")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    assert fault.reordered > 100  # every position of every answer came in reverse key order
    # item 2: no check read the key order
    lp = checks_named(m, "logprob_sanity")
    assert len(lp) == len(m["requests"]) and all(c["status"] == "pass" for _, c in lp)
    assert m["summary"]["checks_failed"] == 0 and m["summary"]["hashes_matched"] == \
        m["summary"]["hashes_compared"]
    # item 1: every miss is a note, judged by the golden model (references) or the reference
    rel = [(q, c) for name in RELATIVE for q, c in checks_named(m, name)]
    assert len(rel) == 8  # 2 prompts x (cold reference, warm reference, C1, C2)
    for q, c in rel:
        assert c["status"] == "note", (q["phase"], c)
        if q["phase"].startswith("replay-references"):
            assert "(model behaviour: the golden model fails it too: " in c["detail"]
        else:
            assert q["phase"] in ("C1", "C2")
            assert "(model behaviour: the single-request reference fails it too: " in c["detail"]
    assert any("word 1 is 'OK', expected '1'" in c["detail"] for _, c in rel)
    assert any("does not match /^\\s*OK/" in c["detail"] for _, c in rel)
    notes = sum(1 for q in m["requests"] for c in q["checks"] if c["status"] == "note")
    assert m["summary"]["model_behaviour_notes"] == notes >= 8
    # item 4: the probe measured the engine and its measurement chose the seeded requests
    p = m["engine_probe"]
    assert p["status"] == "measured" and p["warnings"] == []
    ev = p["evidence"]["seeded_samples"]["prompts"]
    alone = all(len(set(e["output_hashes"])) == 1 for e in ev)
    # the batch (each seeded prompt once more, all in flight together) only after 12 equal pairs
    assert p["requests"] == 2 * len(ev) + 3 + (len(ev) if alone else 0)
    assert all(len(e["output_hashes"]) == 2 and len(e["prompt"]) == 1 for e in ev)
    assert p["seeded_samples_reproduce_alone"] is alone
    reproduce = alone and p["seeded_samples_reproduce_in_batch"] is True
    assert p["seeded_samples_reproduce"] is reproduce
    # it stops at the first pair that differs, else it tries 12
    assert len(ev) == 12 if alone else ev[-1]["first_divergence"] is not None
    assert p["greedy_repeats"] is True and p["warm_equals_cold"] is True
    seeded = [q for q in m["requests"] if q["temperature"] > 0]
    note = m["tables"]["transitions_notes"][0]["note"]
    if reproduce:
        assert seeded and all(q["match"] for q in seeded) and "probe measured" in note
    else:
        assert not seeded
        assert note.startswith("seeded sampled requests left out: the engine probe measured "
                               "that seeded samples do not reproduce "
                               + ("in a batch" if alone else "even alone"))
    assert f"engine probe ({p['requests']} requests" in out


def test_answer_broken_under_load_fails_and_a_sentinel_still_fails(cpu_engine, tmp_path):
    ok, count = chat(cpu_engine.url, OK_TEXT), chat(cpu_engine.url, COUNT_TEXT)
    (seven,) = tokenize(cpu_engine.url, prompt=" 7", add_special_tokens=False)
    sc = replay(tmp_path / "right.toml", ok, count,
                "{ expected_text = { regex = '^\\s*OK' } }", "{ counting = { n = 8 } }")
    occ = Counted()
    broken = BreakAnswerUnderLoad({tuple(ok): 0, tuple(count): 3}, seven, cpu_engine.url,
                                  SERVED_NAME, from_occurrence=4)  # 1, 2: references; 3: C1
    sentinel = SentinelLogprobs(lambda ctx: ctx.body["prompt"] == count
                                and occ.occurrence(ctx) == 3)
    with FaultProxy(cpu_engine.url, Chain(ReverseTopLogprobs(), broken, sentinel)) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "broken", NO_GOLDEN, "--scenario", str(sc))
    assert [h[2] for h in broken.hits] == [0, 3] or sorted(h[2] for h in broken.hits) == [0, 3]
    assert len(sentinel.hits) == 1
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    failing = {(q["phase"], q["prompt_len"], c["name"]): c["detail"]
               for q in m["requests"] for c in q["checks"] if c["status"] == "fail"}
    assert set(failing) == {("C2", len(ok), "expected_text"), ("C2", len(ok), "parity"),
                            ("C2", len(count), "counting"), ("C2", len(count), "parity"),
                            ("C1", len(count), "logprob_sanity")}
    assert failing[("C2", len(ok), "expected_text")].startswith("text ' 7")
    assert failing[("C2", len(ok), "expected_text")].endswith(
        "; the single-request reference passes it")
    assert failing[("C2", len(count), "counting")] == \
        "word 4 is '7', expected '4'; the single-request reference passes it"
    assert "sentinel/non-finite logprob in top candidates" in \
        failing[("C1", len(count), "logprob_sanity")]
    # the references and the C1 answers pass the relative checks: the model does answer
    rel = [(q, c) for name in RELATIVE for q, c in checks_named(m, name)]
    assert len(rel) == 8 and sum(c["status"] == "pass" for _, c in rel) == 6
    assert m["summary"]["model_behaviour_notes"] == 0
    assert m["engine_probe"] == {"status": "off (--no-engine-probe)"}
