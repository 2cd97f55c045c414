"""What scenarios hand to the run context and get back: a request to issue (:class:`RequestSpec`)
and what it gave (:class:`Outcome`). Kept apart from :mod:`pleharness.runner` so that scenario
kinds import it at the top, without the run machinery."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checks import DEFAULT_CHECKS
from .engine.client import Completion
from .manifest import RequestRecord
from .prompts import Prompt


@dataclass
class RequestSpec:
    """One request to issue: a prompt, its sampling, and what to compare it with.

    ``compare``: compare the output hash with the prompt's single-request reference.
    ``checks``: reference-free checks to run on the output, as {check name: params}.
    ``temperature`` / ``seed``: sampling (greedy by default); a seeded sampled request must
    reproduce its seed's sample, so the sampling is part of the reference key.
    ``top_p`` / ``top_k``: nucleus and top-k truncation of a sampled request (None: not sent,
    the engine's default, which is off), part of the reference key of a sampled request.
    ``stream``: streamed (SSE) or one JSON response; not part of the reference key (both
    deliveries must give the same IDs).
    """

    prompt: Prompt
    max_tokens: int
    compare: bool = True
    logprobs: int | None = None
    checks: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        name: {} for name in DEFAULT_CHECKS})
    note: str | None = None
    accept_4xx: bool = False  # a clean HTTP 4xx rejection is an acceptable answer (edge probes)
    temperature: float = 0.0
    seed: int | None = None
    stream: bool = True
    top_p: float | None = None
    top_k: int | None = None

    @property
    def ref_key(self) -> tuple:
        """The reference this request is compared with: (prompt hash, max_tokens) for greedy
        requests, plus (temperature, seed) for sampled ones, plus (top_p, top_k) when either
        is set."""
        if self.temperature == 0.0:
            return (self.prompt.hash, self.max_tokens)
        if self.top_p is None and self.top_k is None:
            return (self.prompt.hash, self.max_tokens, self.temperature, self.seed)
        return (self.prompt.hash, self.max_tokens, self.temperature, self.seed, self.top_p,
                self.top_k)


@dataclass
class Outcome:
    """What one issued request gave: its spec, the engine's completion and the manifest record
    made of it (parity and checks judged)."""

    spec: RequestSpec
    completion: Completion
    record: RequestRecord
