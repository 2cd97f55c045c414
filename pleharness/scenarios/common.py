"""Prompt helpers shared by the boundary, pairs and insert scenario kinds."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ..checks import DEFAULT_CHECKS
from ..prompts import ChatPromptBuilder, Prompt, seeded_prompts
from .base import Params

if TYPE_CHECKING:  # pragma: no cover
    from ..runner import RequestSpec, RunContext


class ChatParams(Params):
    """Exact-length chat prompt settings shared by the boundary-style kinds."""

    instruction: str = "Reply with OK."
    expected_regex: str = r"^\s*OK"
    filler: str = " "
    tail: int = Field(4, ge=0, description="generation-prompt tail tokens (filler goes before)")
    max_tokens: int = Field(8, ge=1)
    depth: int = Field(3, ge=1, description="N in n*B + q and n*C + q, n = 1..N")
    controls: bool = True
    extra_lengths: list[int] = Field(default_factory=list)


def builder(ctx: "RunContext", p: ChatParams) -> ChatPromptBuilder:
    b = getattr(ctx, "_chat_builders", {}).get((p.filler, p.tail))
    if b is None:
        b = ChatPromptBuilder(ctx.client, p.filler, p.tail)
        ctx.__dict__.setdefault("_chat_builders", {})[(p.filler, p.tail)] = b
    return b


def boundary_spec(ctx: "RunContext", p: ChatParams, length: int, why: str,
                  max_tokens: int | None = None) -> "RequestSpec":
    """A request of exactly ``length`` prompt tokens.

    At least as long as the chat template: the instruction padded with filler, checked with
    ``expected_text``. Shorter: a seeded random token-ID prompt (text checks do not apply).
    """
    from ..runner import RequestSpec

    b = builder(ctx, p)
    mt = max_tokens or p.max_tokens
    checks = {name: {} for name in DEFAULT_CHECKS}
    if length >= len(b.template(p.instruction)):
        prompt = b.build(p.instruction, length, key=f"chat-len{length}", why=why)
        checks["expected_text"] = {"regex": p.expected_regex}
    else:
        vocab = int(ctx.facts.get("vocab_size") or 256)
        (raw,) = seeded_prompts(length, 1, length, length, 16, vocab)
        prompt = Prompt(key=f"raw-len{length}", ids=raw.ids,
                        why=why + " (shorter than the chat template: random token IDs)")
    return RequestSpec(prompt, mt, checks=checks, note=prompt.why)


def max_prompt_len(ctx: "RunContext", max_tokens: int) -> int | None:
    m = ctx.facts.get("max_model_len")
    return None if m is None else int(m) - max_tokens
