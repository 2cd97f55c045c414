"""Issue 24 item 4: the engine probe measures seeded-sample reproducibility, greedy repeats and
warm = cold, and the seeded requests of transitions and fuzz follow the measurement, not the
configuration. Unit tests on constructed answers; on the real CPU engine:
tests/test_e2e_checks.py (ngram speculative decoding) and tests/test_invariants.py (without)."""
import itertools

import pytest

from pleharness.engine.client import Completion
from pleharness.engine.facts import EngineFacts
from pleharness.engine_probe import REPEATS, SEEDED_PROMPTS, run_probe, seeded_samples_decision
from pleharness.scenarios.base import load_scenario_file
from pleharness.scenarios.fuzz import FuzzParams, build_space


class ProbeCtx:
    """Answers each request with ``answer(spec, n)`` (n: how often this (prompt, max_tokens,
    seed) was asked before); records what was sent."""

    def __init__(self, answer, facts=None):
        self.facts = EngineFacts(facts or {"vocab_size": 500, "block_size": 32,
                                           "max_model_len": 1024}, {})
        self.answer = answer
        self.sent = []

    def issue(self, spec):
        key = (spec.prompt.ids, spec.max_tokens, spec.seed)
        n = sum(1 for k in self.sent if k == key)
        self.sent.append(key)
        out = self.answer(spec, n)
        if isinstance(out, str):
            return Completion(error="http", error_detail=out, http_status=500)
        return Completion(token_ids=list(out)[:spec.max_tokens], finish_reason="length")


def steady(spec, n):
    return [(sum(spec.prompt.ids) + i) % 97 for i in range(spec.max_tokens)]


def test_a_steady_engine_measures_true_and_is_cheap():
    ctx = ProbeCtx(steady)
    p = run_probe(ctx, prompt_seed=5)
    assert (p["seeded_samples_reproduce"], p["greedy_repeats"], p["warm_equals_cold"]) == \
        (True, True, True)
    assert p["requests"] == len(ctx.sent) == SEEDED_PROMPTS * REPEATS + 3 and p["warnings"] == []
    seeded = [k for k in ctx.sent if k[2] is not None]
    assert len(seeded) == 24 and all(len(k[0]) == 1 for k in seeded)  # one-token prompts
    greedy = [k for k in ctx.sent if k[2] is None]
    assert len(greedy[0][0]) == 32 + 8 and [k[1] for k in greedy] == [32, 32, 31]
    # no (prompt, max_tokens) is sent more than twice (engine doubles count occurrences)
    counts = {}
    for k in ctx.sent:
        counts[k[:2]] = counts.get(k[:2], 0) + 1
    assert max(counts.values()) == 2
    assert run_probe(ProbeCtx(steady), prompt_seed=5)["evidence"] == p["evidence"]
    assert run_probe(ProbeCtx(steady))["prompt_seed"] != run_probe(ProbeCtx(steady))["prompt_seed"]


def test_seeds_that_do_not_reproduce_are_measured_with_the_position():
    seen = []

    def sampler(spec, n):
        ids = steady(spec, n)
        if spec.seed is not None:
            if spec.prompt.ids not in seen:
                seen.append(spec.prompt.ids)
            if n == 1 and seen.index(spec.prompt.ids) == 2:
                ids[7] += 1  # the third seeded prompt's second solo run samples another token
        return ids
    p = run_probe(ProbeCtx(sampler), prompt_seed=1)
    ev = p["evidence"]["seeded_samples"]["prompts"]
    assert p["seeded_samples_reproduce"] is False and p["greedy_repeats"] is True
    # one differing pair settles it: the probe stops there
    assert [e["first_divergence"] for e in ev] == [None, None, 7] and p["requests"] == 6 + 3
    sent, why = seeded_samples_decision(p, q=1)  # even without speculative decoding
    assert not sent and "do not reproduce even alone (solo repeats diverged at position 7)" in why


def test_greedy_and_cold_warm_differences_are_warnings():
    def flaky(spec, n):
        ids = steady(spec, n)
        if spec.seed is None and n == 1:
            ids[3] += 1  # the warm run differs from the cold one, and from the third run
        return ids
    p = run_probe(ProbeCtx(flaky), prompt_seed=1)
    assert p["warm_equals_cold"] is False and p["greedy_repeats"] is False
    assert any("greedy outputs do not repeat alone" in w and "position 3" in w
               for w in p["warnings"])
    assert any("warm (prefix-cached) solo run differs from the cold one at position 3" in w
               for w in p["warnings"])


def test_a_failed_probe_request_leaves_the_property_unmeasured():
    p = run_probe(ProbeCtx(lambda spec, n: "boom" if spec.seed is not None else steady(spec, n)))
    assert p["seeded_samples_reproduce"] is None and p["greedy_repeats"] is True
    assert any("probe of seeded samples failed" in w for w in p["warnings"])
    # unmeasured: the configuration decides, as without a probe
    assert seeded_samples_decision(p, q=1)[0] and not seeded_samples_decision(p, q=4)[0]


@pytest.mark.parametrize("measured,q,forced,sent", [
    (True, 4, False, True), (False, 1, False, False), (None, 1, False, True),
    (None, 4, False, False), (None, None, False, False), (False, 4, True, True)])
def test_the_measurement_decides_not_the_configuration(measured, q, forced, sent):
    probe = None if measured is None else {"seeded_samples_reproduce": measured, "evidence": {
        "seeded_samples": {"prompts": [{"first_divergence": 9}]}}}
    ok, why = seeded_samples_decision(probe, q, forced)
    assert ok is sent and why.startswith("seeded sampled requests " + ("sent" if sent else
                                                                          "left out"))


class _Manifest:
    def __init__(self, probe):
        self.tables = {}
        self.engine_probe = probe


class LadderCtx:
    def __init__(self, k, probe):
        self.reference_mode = "solo"
        self.facts = EngineFacts({"vocab_size": 500, "max_model_len": 1024,
                                  "num_speculative_tokens": k}, {})
        self.references = {}
        self.phases = []
        self.manifest = _Manifest(probe)
        self.engine_probe = probe

    def note(self, table, texts, echo=False):
        texts = [texts] if isinstance(texts, str) else list(texts)
        self.manifest.tables.setdefault(table, []).extend({"note": t} for t in texts)

    def run_phase(self, name, c, specs, **kw):
        self.phases.append(list(specs))
        return []

    def take_references(self, specs, **kw):
        pass


@pytest.mark.parametrize("k,measured", [(3, True), (0, False)])
def test_transitions_and_fuzz_follow_the_probe(k, measured):
    probe = {"status": "measured", "seeded_samples_reproduce": measured,
             "evidence": {"seeded_samples": {"prompts": [{"first_divergence": 12}]}}}
    ctx = LadderCtx(k, probe)
    load_scenario_file("transitions").run(ctx)
    seeded = [s for s in itertools.chain(*ctx.phases) if s.temperature > 0]
    assert bool(seeded) is measured
    (note,) = ctx.manifest.tables["transitions_notes"]
    assert "engine probe measured" in note["note"]
    sp = build_space({"vocab_size": 500, "max_model_len": 1024, "block_size": 32,
                      "max_num_batched_tokens": 256, "num_speculative_tokens": k},
                     FuzzParams(max_tokens=9), probe)
    assert sp.sampled is measured and any("engine probe measured" in n for n in sp.notes)
