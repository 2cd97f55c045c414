"""Scenario kind ``prompt_logprobs``: the prompt's scores (vLLM's ``prompt_logprobs``, and the
OpenAI ``echo`` with ``logprobs``) alone and under load, for a prompt shorter than the
chunked-prefill budget C and one longer (chunked), after their prompts were prefix-cached
(issue 35 item 4).

Public reports show prompt logprobs shifted by one position, or wrong under batching, chunked
prefill or prefix caching (a cached prefix returning no or wrong scores). What vLLM 0.32 does
(:mod:`pleharness.engine.prompt_logprobs`; docs/prompt-logprobs.md): entry t scores prompt
token t, entry 0 is null; a request asking for prompt scores never reads the prefix cache
(``SamplingParams.skip_reading_prefix_cache``: the scores of a cached part would be missing),
but writes it; ``prompt_logprobs`` only non-streamed; echo's scores are the same.

1. Two prompts of seeded random IDs: ``short_len`` tokens, and C + ``over_chunk`` tokens (C:
   the engine's fact ``max_num_batched_tokens``; unknown: the long prompt is left out, noted in
   ``prompt_logprobs_notes``), plus ``neighbours`` prompts of 24..``short_len`` * 4 tokens.
2. References (each alone): the plain request of every prompt (so both prompts are in the
   prefix cache before any scores are asked), then per prompt a ``prompt_logprobs: k`` request
   (non-streamed) and an ``echo`` + ``logprobs: k`` request (streamed): their solo runs carry
   the reference scores (scores are part of the reference key, ``RequestSpec.params``).
3. Phase ``prompt-logprobs-c<C>``: the score requests, the plain ones and the neighbours
   interleaved, ``concurrency`` in flight. Each score request passes check ``prompt_logprobs``
   (reference-free: entries complete, entry t holds prompt token t, finite, ranks consistent
   with the top-k, echo echoes the prompt; the references are checked too) and
   ``prompt_logprobs_parity`` (each prompt token's logprob equals the solo request's within the
   run's near-tie threshold, nats, from the serving dtype; skipped when the references come
   from elsewhere). Output IDs are compared as for every request.

Table ``prompt_logprobs``: per score request of the load phase, the prompt, its length, the
prefill chunks it takes alone (ceil(P / C)), the way (``prompt_logprobs`` | ``echo``), k, the
rule check's status and the largest difference from the solo request (nats).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import Field

from ..checks import DEFAULT_CHECKS
from ..checks.prompt_logprobs import NAME, parity_measured
from ..divergence import is_half_precision
from ..prompts import seeded_prompts
from ..request import Outcome, RequestSpec
from ..engine.facts import as_facts
from ..evidence import mark_vacuous
from .base import Params, Scenario, TableRow, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext

MAX_K = 20  # vLLM's default --max-logprobs: a larger k is a 400


class PromptLogprobsParams(Params):
    """Parameters of ``prompt_logprobs``: the short prompt's length (tokens), how far the long
    one runs past the chunk budget C (tokens), ``k`` candidates per prompt position (1..20,
    vLLM's default ``max_logprobs``), ``max_tokens`` per request, ``neighbours`` (plain
    requests beside), ``concurrency`` of the load phase, ``seed`` of the prompts."""

    short_len: int = Field(40, ge=2, le=100_000)
    over_chunk: int = Field(37, ge=1, le=100_000)
    k: int = Field(5, ge=1, le=MAX_K)
    max_tokens: int = Field(8, ge=1, le=100_000)
    neighbours: int = Field(4, ge=0, le=256)
    concurrency: int = Field(4, ge=1, le=1024)
    seed: int = 44


class PromptLogprobsRow(TableRow):
    """One score request of the load phase: prompt key, length (tokens), prefill chunks alone
    (ceil(P / C); None when C is unknown), way (``prompt_logprobs`` | ``echo``), k, the
    ``prompt_logprobs`` check's status and the largest |logprob difference| from the solo
    request over the prompt positions (nats; None without a solo reference)."""

    prompt_key: str
    prompt_len: int
    chunks: int | None
    way: str
    k: int
    rules: str
    max_diff_nats: float | None


def _way(spec: RequestSpec) -> str:
    return "echo" if spec.echo else "prompt_logprobs"


@register
class PromptLogprobs(Scenario):
    """Kind ``prompt_logprobs``: see the module docstring (one load phase; checks
    ``prompt_logprobs`` and ``prompt_logprobs_parity``; table ``prompt_logprobs``)."""

    kind = "prompt_logprobs"
    summary = ("prompt logprobs and echo, short and chunked prompts, cached, alone and under "
               "load: entry t scores prompt token t, equal to the solo request's")
    Params = PromptLogprobsParams
    phases = 1
    tables = {"prompt_logprobs": PromptLogprobsRow}

    def lengths(self, facts) -> tuple[list[tuple[str, int]], int, list[str], str | None]:
        """What fits this engine (``facts``: EngineFacts or a dict of values): ([(what, prompt
        length)], the neighbours' longest prompt, notes, why the chunked prompt is left out or
        None). Lengths in tokens; every prompt + max_tokens fits max_model_len M. The short
        prompt is shortened to M - max_tokens where needed; the long one is C + over_chunk,
        shortened to M - max_tokens as long as that is still longer than C (it still takes two
        prefill chunks), else left out: with a chunk budget C at or above M - max_tokens (vLLM's
        default for a short context) no prompt is chunked. An empty list: nothing fits."""
        f = as_facts(facts)
        p, m, c = self.params, f.max_model_len, f.max_num_batched_tokens
        limit = None if m is None else int(m) - p.max_tokens
        notes: list[str] = []
        short = p.short_len if limit is None else min(p.short_len, limit)
        if limit is not None and limit < 2:
            return [], 0, notes, (f"max_tokens {p.max_tokens} leaves no room for a prompt of "
                                  f"2 tokens: max_model_len is {m}")
        if short < p.short_len:
            notes.append(f"short prompt shortened to {short} tokens (params.short_len "
                         f"{p.short_len} + max_tokens {p.max_tokens} exceeds max_model_len {m})")
        lens = [("short", short)]
        why_long = None
        if c:
            long = int(c) + p.over_chunk
            if limit is not None and long > limit:
                if limit > int(c):
                    notes.append(f"long prompt shortened to {limit} tokens (C {c} + over_chunk "
                                 f"{p.over_chunk} exceeds max_model_len {m} - max_tokens): "
                                 "still two prefill chunks")
                    long = limit
                else:
                    why_long = (f"chunked prefill not exercised: the chunk budget C = {c} is not "
                                f"below max_model_len {m} - max_tokens {p.max_tokens} = "
                                f"{limit}, so no prompt is chunked on this engine")
            if why_long is None:
                lens.append(("long", long))
        else:  # unknown, not impossible: said, not vacuous (as boundary's unknown families)
            notes.append("chunked prefill not exercised: the chunk budget "
                         "(max_num_batched_tokens) is unknown; pass --chunk-size")
        nb_max = max(24, p.short_len * 4) if limit is None else min(max(24, p.short_len * 4),
                                                                    limit)
        return lens, nb_max, notes, why_long

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        c_budget = ctx.facts.max_num_batched_tokens
        vocab = ctx.facts.vocab_or()
        lens, nb_max, notes, why_long = self.lengths(ctx.facts)
        name = f"prompt-logprobs-c{p.concurrency}"
        if not lens:
            self.leave_out_phases(ctx, [(name, p.concurrency)], why_long or "nothing fits")
            return
        ctx.note("prompt_logprobs_notes", notes + ([why_long] if why_long else []), echo=True)
        prompts = [replace(seeded_prompts(p.seed + i, 1, n, n, 16, vocab)[0],
                           key=f"plp-{what}-len{n}") for i, (what, n) in enumerate(lens)]
        nbs = [replace(q, key=f"plp-nb{i}-len{len(q)}") for i, q in enumerate(
            seeded_prompts(p.seed + 100, p.neighbours, min(24, nb_max), nb_max, 16, vocab)
        )] if p.neighbours else []
        checks = {**{n: {} for n in DEFAULT_CHECKS}, NAME: {}}
        plain = [RequestSpec(q, p.max_tokens) for q in prompts + nbs]
        scored: list[RequestSpec] = []
        for q in prompts:
            scored.append(RequestSpec(q, p.max_tokens, prompt_logprobs=p.k, stream=False,
                                      checks=checks, note="prompt_logprobs"))
            scored.append(RequestSpec(q, p.max_tokens, echo=True, logprobs=p.k, checks=checks,
                                      note="echo with logprobs"))
        ctx.take_references(plain)  # plain first: the prompts are prefix-cached from here on
        refs = ctx.take_references(scored)
        # the solo scores, kept across the suite's repeats (references are taken once)
        solo = self.__dict__.setdefault("_solo_scores", {})
        solo.update({o.spec.ref_key: o.completion for o in refs or ()
                     if o.completion.error is None})
        if any(s.ref_key not in solo for s in scored):
            ctx.note("prompt_logprobs_notes", "prompt_logprobs_parity not judged for some "
                     "requests: no solo run with prompt scores on this engine (references "
                     "from elsewhere, or the solo request failed)")
        threshold, why = ctx.near_tie_nats, "the run's near-tie threshold"
        # far-tail prompt positions are no evidence where rounding moves them by nats: on half
        # precision (bf16 logits of magnitude ~40 round by tenths of a nat each); a float32
        # engine's tail is exact and compared like any position
        tail_k = p.k if is_half_precision(ctx.facts.dtype) else None
        diffs: dict[int, float | None] = {}

        def judge(o: Outcome) -> None:
            if o.spec.prompt_logprobs is None and not o.spec.echo:
                return
            ids = [int(t) for t in o.spec.prompt.ids]
            ref = solo.get(o.spec.ref_key)
            result, measured = parity_measured(o.completion, ref, ids, threshold, why, tail_k)
            o.record.checks.append(result)
            if measured is not None:  # judged again at the run's measured envelope
                o.record.prompt_logprob_diffs = measured
                diffs[id(o)] = measured.max_nats if measured.compared else None

        mixed = _interleave(scored, plain)
        outs = ctx.run_phase(name, p.concurrency, mixed, on_outcome=judge)
        if not outs:
            return
        if why_long is not None:
            mark_vacuous(ctx, outs.phase, why_long)
        rows = []
        for o in outs:
            if o.spec.prompt_logprobs is None and not o.spec.echo:
                continue
            rule = next((c.status for c in o.record.checks if c.name == NAME), "not run")
            d = diffs.get(id(o))
            rows.append(PromptLogprobsRow(
                prompt_key=o.spec.prompt.key, prompt_len=len(o.spec.prompt),
                chunks=math.ceil(len(o.spec.prompt) / int(c_budget)) if c_budget else None,
                way=_way(o.spec), k=p.k, rules=rule,
                max_diff_nats=None if d is None else round(d, 6)))
        self.put_table(ctx, "prompt_logprobs", rows)

    @classmethod
    def markdown(cls, m) -> list[str]:
        return cls.markdown_table(m, "prompt_logprobs", "Prompt logprobs and echo", [
            ("prompt", "prompt_key"), ("tokens:", "prompt_len"), ("chunks:", "chunks"),
            ("way", "way"), ("k:", "k"), ("rules", "rules"),
            ("max diff vs solo (nats):", "max_diff_nats")])


def _interleave(scored: list[RequestSpec], plain: list[RequestSpec]) -> list[RequestSpec]:
    """``scored`` and ``plain`` alternating (the rest of the longer list at the end), so that
    every score request has plain neighbours in flight beside it."""
    out: list[RequestSpec] = []
    for i in range(max(len(scored), len(plain))):
        out += scored[i:i + 1] + plain[i:i + 1]
    return out

