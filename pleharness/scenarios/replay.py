"""Scenario kind ``replay``: an explicit schedule, request by request (what ``ple-harness explain``
writes as a one-file reproducer, and what a maintainer can edit by hand).

Schedule: every distinct (prompt, max_tokens) alone first (single-request references, warm by
default like every scenario), then the phases in order, each at its concurrency with exactly its
requests. Every output is compared with its reference. File shape::

    kind = "replay"
    [[params.phases]]
    name = "C4-with-companions"
    concurrency = 4
    [[params.phases.requests]]
    prompt = [16, 402, ...]      # token IDs
    max_tokens = 32

Params: ``phases`` (list of {name, concurrency, requests: [{prompt, max_tokens, note, stream}]};
``stream`` defaults to true).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..prompts import Prompt
from ..request import RequestSpec
from .base import Params, Scenario, ScenarioError, register

if TYPE_CHECKING:  # pragma: no cover
    from ..runner import RunContext


class ReplayRequest(Params):
    """One request of a replayed phase: prompt token IDs, max_tokens, note, streamed or not."""

    prompt: list[int] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=1_000_000)
    note: str = ""
    stream: bool = True  # False: one JSON response (fuzz reproducers draw both)


class ReplayPhase(Params):
    """One replayed phase: its name, concurrency and requests, in order."""

    name: str = Field(min_length=1)
    concurrency: int = Field(ge=1, le=1024)
    requests: list[ReplayRequest] = Field(min_length=1)


class ReplayParams(Params):
    """Parameters of ``replay``: the phases to replay (names unique)."""

    phases: list[ReplayPhase] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self):
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError("phase names must be distinct")
        return self


def prompt_of(ids: list[int]) -> Prompt:
    """A :class:`~pleharness.prompts.Prompt` keyed by its length and hash prefix."""
    p = Prompt(key="", ids=tuple(ids))
    return Prompt(key=f"replay-len{len(ids)}-{p.hash[:8]}", ids=tuple(ids))


@register
class Replay(Scenario):
    """Kind ``replay``: see the module docstring (one phase per ``params.phases`` item)."""

    kind = "replay"
    summary = "an explicit schedule of phases and token-ID prompts (explain's reproducers)"
    Params = ReplayParams

    def planned_phases(self) -> int:
        return len(self.params.phases)

    def validate_against(self, facts) -> None:
        """Raises ScenarioError naming ``params.phases[i].requests[j]`` when a request does
        not fit in max_model_len or a prompt ID is outside [0, V)."""
        m, v = facts.get("max_model_len"), facts.get("vocab_size")
        for i, ph in enumerate(self.params.phases):
            for j, r in enumerate(ph.requests):
                where = f"{self.source}: params.phases[{i}].requests[{j}]"
                if m is not None and len(r.prompt) + r.max_tokens > int(m):
                    raise ScenarioError(f"{where}: prompt + max_tokens = "
                                        f"{len(r.prompt) + r.max_tokens} exceeds max_model_len {m}")
                if v is not None and any(not 0 <= t < int(v) for t in r.prompt):
                    raise ScenarioError(f"{where}.prompt: token IDs must be in [0, {v})")

    def run(self, ctx: "RunContext") -> None:
        phases = [[RequestSpec(prompt_of(r.prompt), r.max_tokens, note=r.note or None,
                               stream=r.stream)
                   for r in ph.requests] for ph in self.params.phases]
        ctx.take_references([s for specs in phases for s in specs],
                            phase_name="replay-references")
        for ph, specs in zip(self.params.phases, phases):
            ctx.run_phase(ph.name, ph.concurrency, specs)
