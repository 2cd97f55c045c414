"""Scenario kind ``kv_pressure``: more prompt + max_tokens in flight than the KV cache holds, so
the scheduler must preempt requests (free their KV blocks) and recompute them later; every output,
preempted or not, must equal its single-request reference.

Derivation (:func:`pressure_plan`; K = ``kv_cache_size_tokens`` (engine /metrics
``vllm:cache_config_info``, or num_gpu_blocks * B), M = max_model_len, T = max_tokens):

- short prompts, long generations: a request is admitted when its prompt fits, so short prompts
  get N requests running at once, and their decodes then outgrow the cache (long prompts would
  only wait in the queue, never be preempted). P = ``prompt_len`` (default 32);
- each request alone fits: T = min(M, K) - 1 - P unless ``max_tokens`` is given (so its solo
  reference runs without pressure);
- N = ceil(overcommit * K / (P + T)) requests, all in flight at once (at least 2): their total
  prompt + max_tokens is at least ``overcommit`` times the capacity;
- N is at most max_num_seqs (more would only queue, not press on the cache) and
  ``max_requests``; when that is not enough the phase is skipped with the reason (run the engine
  with a smaller KV cache: ``--num-gpu-blocks-override N`` or ``--kv-cache-memory-bytes``, on CPU
  also ``VLLM_CPU_KVCACHE_SPACE``).

Prompts are distinct seeded random IDs (no shared prefix: prefix caching cannot share their blocks).
The N requests go out as ONE completions request with N prompts (``send = "batched"``, the
default; OpenAI's batched ``prompt``): vLLM's API server hands them to the engine at once. Sent
as N separate requests (``send = "separate"``) they were seen to arrive one after another on an
overloaded 2-core host (CI, 2026-12-02: the first request had finished before the others
streamed a token; 0 preemptions); batched, 4 of 4 trials preempted (11 each) with 3 CPU hogs
beside the engine.
``vllm:num_preemptions_total`` is scraped before and after the phase: a rise passes the phase check
``preemptions``; none is a warning (a failure with ``require_preemption = true``): the phase then did
not test recomputation; no counter at /metrics is a skip with the reason. Table ``kv_pressure``:
the formula, K, P, T, N, in-flight tokens, preemptions, matched / compared.
"""
from __future__ import annotations

from ..engine.facts import as_facts

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..engine import metrics
from ..evidence import mark_vacuous
from ..manifest import CheckResult
from ..prompts import seeded_prompts
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


def pressure_plan(facts: dict, prompt_len: int = 32, max_tokens: int | None = None,
                  overcommit: float = 2.0, max_requests: int = 64) -> dict:
    """{"ok": True, n, prompt_len, max_tokens, capacity_tokens, in_flight_tokens, why, facts} or
    {"ok": False, reason, facts}. See the module docstring for the formulas."""
    facts = as_facts(facts)
    k = facts.kv_cache_size_tokens
    used = ["kv_cache_size_tokens", "max_model_len", "max_num_seqs"]
    if not k:
        return {"ok": False, "facts": used,
                "reason": "kv_cache_size_tokens unknown (no /metrics cache_config_info)"}
    k = int(k)
    m = (facts.max_model_len or k)
    room = min(m, k) - 1
    p = prompt_len
    t = max_tokens or room - p
    if t < 1 or p + t > room:
        return {"ok": False, "facts": used,
                "reason": f"prompt_len {p} + max_tokens {t} does not fit one request alone "
                          f"(min(M, K) - 1 = {room})"}
    n = max(2, math.ceil(overcommit * k / (p + t)))
    limit = min((facts.max_num_seqs or max_requests), max_requests)
    if n > limit:
        return {"ok": False, "facts": used,
                "reason": f"the KV cache ({k} tokens) needs {n} requests of {p + t} tokens in "
                          f"flight to overflow, more than {limit} (max_num_seqs / max_requests); "
                          "start the engine with a smaller KV cache (--num-gpu-blocks-override, "
                          "--kv-cache-memory-bytes)"}
    return {"ok": True, "n": n, "prompt_len": p, "max_tokens": t, "capacity_tokens": k,
            "in_flight_tokens": n * (p + t), "facts": used,
            "why": f"T = min(M, K) - 1 - P = {t}; N = ceil({overcommit} * K / (P + T)) = "
                   f"ceil({overcommit} * {k} / ({p} + {t})) = {n}; N * (P + T) = "
                   f"{n * (p + t)} > K = {k}"}


class KvPressureParams(Params):
    """Parameters of ``kv_pressure``: prompt length and max_tokens (default: as long as one
    request alone fits) of the requests that together overfill the KV cache."""

    prompt_len: int = Field(32, ge=1, le=10_000_000)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000,
                                   description="default: as long as one request alone fits")
    overcommit: float = Field(2.0, gt=1.0, le=100.0, description="in-flight tokens / capacity")
    max_requests: int = Field(64, ge=2, le=1024)
    require_preemption: bool = False
    send: Literal["batched", "separate"] = Field(
        "batched", description="batched: one completions request with every prompt (they reach "
        "the engine together); separate: one request each")
    seed: int = 20261130


class KvPressureRow(TableRow):
    """The phase (``tables.kv_pressure``): why these sizes, the facts used (value and source),
    the KV capacity, prompt and max_tokens, requests and tokens in flight (tokens), the
    preemptions counted (None: no counter), whether every request streamed together, how many
    outputs matched their references, the result."""

    why: Any
    facts: dict[str, str]
    capacity_tokens: Any
    prompt_len: Any
    max_tokens: Any
    requests: Any
    in_flight_tokens: Any
    preemptions: float | int | None
    all_streamed_together: bool | None
    matched: int
    compared: int
    result: str


class KvPressureSkipRow(TableRow):
    """``tables.kv_pressure`` when the phase was skipped: why, and the facts used."""

    result: str
    facts: dict[str, str]


@register
class KvPressure(Scenario):
    """Kind ``kv_pressure``: see the module docstring (one phase, check ``preemptions``)."""

    kind = "kv_pressure"
    summary = ("more prompt + max_tokens in flight than the KV cache holds: preemption and "
               "recomputation; every output vs its solo reference (vllm:num_preemptions)")
    Params = KvPressureParams

    phases = 1

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        plan = pressure_plan(ctx.facts, p.prompt_len, p.max_tokens, p.overcommit,
                             p.max_requests)
        facts = {n: f"{ctx.facts.get(n)} ({ctx.facts.sources.get(n, 'unknown')})"
                 for n in plan["facts"]}
        if not plan["ok"]:
            ctx.set_table("kv_pressure", [KvPressureSkipRow(result=f"skipped: {plan['reason']}",
                                                            facts=facts)])
            ctx.leave_out("kv-pressure", f"KV pressure not tested: {plan['reason']}")
            return
        hi = ctx.facts.vocab_or()
        prompts = seeded_prompts(p.seed, plan["n"], plan["prompt_len"], plan["prompt_len"], 16,
                                 hi)
        specs = [RequestSpec(pr, plan["max_tokens"], note=plan["why"]) for pr in prompts]
        ctx.take_references(specs)
        before = metrics.scrape(ctx.client)
        outs = ctx.run_phase("kv-pressure", plan["n"], specs, counts_for_throughput=False,
                             together=p.send == "batched")
        if not outs:  # nothing run here (the reference engine's collect-only pass)
            return
        pre = metrics.delta(before, metrics.scrape(ctx.client), metrics.PREEMPTIONS)
        ph = outs.phase
        together = _overlapped([o.completion for o in outs])
        if pre is None:
            chk = CheckResult(name="preemptions", status="skip",
                              detail=f"no {metrics.PREEMPTIONS}_total counter at /metrics")
        elif pre > 0:
            chk = CheckResult(name="preemptions", status="pass",
                              detail=f"{pre:.0f} preemption(s) during the phase")
        else:
            chk = CheckResult(name="preemptions",
                              status="fail" if p.require_preemption else "warn",
                              detail="no preemption: the phase did not test recomputation"
                              + ("" if together is not False else
                                 " (the requests did not all stream together: a request's "
                                 "first token came after another had finished; an overloaded "
                                 "host can serialize them)"))
        ctx.add_phase_check(ph, chk)
        if pre is not None and pre <= 0:
            mark_vacuous(ctx, ph, "0 preemptions: the KV cache never overflowed, so "
                         "recomputation after preemption was not tested")
        compared = [o.record for o in outs if o.record.match is not None]
        ctx.set_table("kv_pressure", [KvPressureRow(
            why=plan["why"], facts=facts, capacity_tokens=plan["capacity_tokens"],
            prompt_len=plan["prompt_len"], max_tokens=plan["max_tokens"],
            requests=plan["n"],
            in_flight_tokens=plan["in_flight_tokens"], preemptions=pre,
            all_streamed_together=together,
            matched=sum(1 for r in compared if r.match), compared=len(compared),
            result=f"{ph.status}; preemptions: {chk.status} ({chk.detail})")])


def _overlapped(completions) -> bool | None:
    """True when every request's first token came before the first request finished (all were
    decoding at once), False when not, None without timings."""
    firsts, ends = [], []
    for c in completions:
        if c.started_at is None or c.ttft_s is None or c.latency_s is None:
            return None
        firsts.append(c.started_at + c.ttft_s)
        ends.append(c.started_at + c.latency_s)
    return bool(firsts) and max(firsts) < min(ends)
