"""Exact-length chat prompts shared by the boundary, pairs, insert and fuzz scenario kinds."""
from __future__ import annotations

from ...engine.facts import as_facts

import re
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from ...checks import DEFAULT_CHECKS
from ...prompts import ChatPromptBuilder, Prompt, seeded_prompts
from ...request import RequestSpec
from ..base import Params, Scenario, ScenarioError

if TYPE_CHECKING:  # pragma: no cover
    from ...run.scenario_context import ScenarioContext


class ChatParams(Params):
    """Exact-length chat prompt settings shared by the boundary-style kinds."""

    instruction: str = Field("Reply with OK.", min_length=1)
    expected_regex: str = r"^\s*OK"
    filler: str = Field(" ", min_length=1, description="must tokenize to exactly one token")
    tail: int = Field(4, ge=0, le=64, description="generation-prompt tail tokens (filler goes before)")
    max_tokens: int = Field(8, ge=1, le=1_000_000)
    depth: int = Field(3, ge=1, le=64, description="N in n*B + q and n*C + q, n = 1..N")
    controls: bool = True
    extra_lengths: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)

    @field_validator("expected_regex")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return v


class ChatScenario(Scenario):
    """Base of the kinds built on exact-length chat prompts: checks max_tokens against M."""

    def validate_against(self, facts) -> None:
        """Raises ScenarioError when max_tokens (or count_to) leaves no room for a prompt in
        max_model_len."""
        facts = as_facts(facts)
        m = facts.max_model_len
        mt = max([self.params.max_tokens] + [getattr(self.params, "count_to", 0)])
        if m is not None and mt >= int(m):
            raise ScenarioError(f"{self.source}: params.max_tokens (or count_to) {mt} leaves no "
                                f"room for a prompt: max_model_len is {m}")


def builder(ctx: "ScenarioContext", p: ChatParams) -> ChatPromptBuilder:
    """The context's prompt builder for ``p.filler`` / ``p.tail``
    (:meth:`pleharness.run.context.RunContext.prompt_builder`).
    Raises ScenarioError (params.filler) when the filler is not exactly one token."""
    try:
        return ctx.prompt_builder(p.filler, p.tail)
    except ValueError as exc:
        raise ScenarioError(f"params.filler: {exc}") from None


def boundary_spec(ctx: "ScenarioContext", p: ChatParams, length: int, why: str,
                  max_tokens: int | None = None) -> RequestSpec:
    """A request of exactly ``length`` prompt tokens.

    At least as long as the chat template: the instruction padded with filler, checked with
    ``expected_text``. Shorter: a seeded random token-ID prompt (text checks do not apply).
    """
    b = builder(ctx, p)
    mt = max_tokens or p.max_tokens
    checks = {name: {} for name in DEFAULT_CHECKS}
    if length >= len(b.template(p.instruction)):
        try:
            prompt = b.build(p.instruction, length, key=f"chat-len{length}", why=why)
        except ValueError as exc:
            raise ScenarioError(f"params.tail / params.instruction: {exc}") from None
        checks["expected_text"] = {"regex": p.expected_regex}
    else:
        vocab = ctx.facts.vocab_or()
        (raw,) = seeded_prompts(length, 1, length, length, 16, vocab)
        prompt = Prompt(key=f"raw-len{length}", ids=raw.ids,
                        why=why + " (shorter than the chat template: random token IDs)")
    return RequestSpec(prompt, mt, checks=checks, note=prompt.why)


def max_prompt_len(ctx: "ScenarioContext", max_tokens: int) -> int | None:
    """The longest prompt (tokens) that leaves ``max_tokens`` in max_model_len; None when M is
    unknown."""
    m = ctx.facts.max_model_len
    return None if m is None else int(m) - max_tokens
