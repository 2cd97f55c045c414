"""Scenario kind ``transitions``: a concurrency ladder with transitions down and up.

Schedule: a warm-up phase (separate prompts, excluded from throughput and parity), then every prompt
alone once (single-request references), then the ladder (default C4 -> C3 -> C2 -> C1 -> C2 -> C3 ->
C4 -> C1) repeated ``repeats`` times. A phase at concurrency C issues ``C * requests_per_slot``
requests and keeps exactly C in flight; prompts are assigned round-robin across the whole run, so
every prompt meets several concurrencies. Every output's token hash must equal its reference's.
Catches: batch-size dependent dispatch (CUDA-graph capture sizes, padding) and state leaking across
concurrency transitions (shared/DESIGN.md, "Schedules worth running").
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from ..prompts import seeded_prompts
from .base import Params, Scenario, ScenarioError, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runner import RunContext


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
        return self


class TransitionsParams(Params):
    ladder: list[int] = Field(default_factory=lambda: [4, 3, 2, 1, 2, 3, 4, 1])
    repeats: int = Field(2, ge=1, le=10_000)
    requests_per_slot: int = Field(2, ge=1, le=10_000)
    max_tokens: int = Field(32, ge=1, le=1_000_000)
    warmup_requests: int = Field(4, ge=0, le=MAX_CONCURRENCY)
    prompts: PromptSet = Field(default_factory=PromptSet)

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


@register
class Transitions(Scenario):
    kind = "transitions"
    summary = "concurrency ladder C4->C3->C2->C1->C2->C3->C4->C1 (repeated); every output vs its solo reference"
    Params = TransitionsParams

    def _id_high(self, facts) -> int:
        p = self.params.prompts
        if p.id_high is not None:
            return p.id_high
        v = facts.get("vocab_size")
        if v is None:
            raise ScenarioError(f"{self.source}: params.prompts.id_high is needed: the vocabulary "
                                "size of the engine is unknown")
        return int(v)

    def validate_against(self, facts) -> None:
        p = self.params
        m = facts.get("max_model_len")
        if m is not None and p.prompts.max_len + p.max_tokens > m:
            raise ScenarioError(
                f"{self.source}: params.prompts.max_len + params.max_tokens = "
                f"{p.prompts.max_len + p.max_tokens} exceeds max_model_len {m}")
        hi = self._id_high(facts)
        v = facts.get("vocab_size")
        if v is not None and hi > v:
            raise ScenarioError(f"{self.source}: params.prompts.id_high {hi} exceeds the "
                                f"vocabulary size {v}")
        if p.prompts.id_low >= hi:
            raise ScenarioError(f"{self.source}: params.prompts.id_low must be < id_high ({hi})")

    def planned_phases(self) -> int:
        return len(self.params.ladder) * self.params.repeats

    def run(self, ctx: "RunContext") -> None:
        from ..runner import RequestSpec

        p = self.params
        hi = self._id_high(ctx.facts)
        prompts = seeded_prompts(p.prompts.seed, p.prompts.count, p.prompts.min_len,
                                 p.prompts.max_len, p.prompts.id_low, hi)
        if p.warmup_requests:
            warm = seeded_prompts(p.prompts.seed + 1, p.warmup_requests, p.prompts.min_len,
                                  p.prompts.max_len, p.prompts.id_low, hi)
            ctx.run_phase("warmup", max(p.ladder),
                          [RequestSpec(w, p.max_tokens, compare=False) for w in warm],
                          role="warmup")
        ctx.take_references([RequestSpec(pr, p.max_tokens) for pr in prompts])
        nxt = 0
        for rep in range(1, p.repeats + 1):
            for step, c in enumerate(p.ladder, 1):
                specs = []
                for _ in range(c * p.requests_per_slot):
                    specs.append(RequestSpec(prompts[nxt % len(prompts)], p.max_tokens))
                    nxt += 1
                ctx.run_phase(f"r{rep}-s{step}-C{c}", c, specs)
