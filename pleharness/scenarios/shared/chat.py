"""Exact-length chat prompts shared by the boundary, pairs, insert, sampled, stop_strings and
fuzz scenario kinds, and what they do on an engine that cannot make them: a model with no chat
template, or a filler that is not one token in its vocabulary, gets token-ID prompts of the
same lengths (no expected-text check), said once in the kind's notes; never an error."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from ...checks import DEFAULT_CHECKS
from ...engine.facts import as_facts
from ...errors import EngineError
from ...prompts import ChatPromptBuilder, Prompt, seeded_prompts
from ...request import RequestSpec
from ..base import Params, Scenario

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
    """Base of the kinds built on exact-length chat prompts."""

    def no_room(self, facts) -> str | None:
        """Why no prompt fits on this engine (``params.max_tokens`` is at least max_model_len:
        every phase is left out), or None. ``facts``: EngineFacts or a dict of values."""
        m = as_facts(facts).max_model_len
        mt = self.params.max_tokens
        if m is not None and mt >= int(m):
            return (f"params.max_tokens {mt} leaves no room for a prompt: max_model_len is {m}")
        return None


def chat_builder(ctx: "ScenarioContext", p) -> tuple[ChatPromptBuilder | None, str]:
    """(the context's prompt builder for ``p.filler`` / ``p.tail``, "") when this engine makes
    chat prompts of ``p.instruction`` (params without one: of "Hello."); (None, why not) when
    the filler is not one token of its vocabulary or /tokenize of a message fails (a model with
    no chat template). Never raises for either (the builder keeps a failed template: one
    /tokenize per text)."""
    try:
        b = ctx.prompt_builder(p.filler, p.tail)
    except ValueError as exc:
        return None, f"params.filler: {exc}"
    except EngineError as exc:
        return None, f"/tokenize failed: {str(exc)[:200]}"
    text = getattr(p, "instruction", None) or "Hello."
    try:
        tpl = b.template(text)
    except EngineError as exc:
        return None, ("/tokenize of a chat message failed (a model with no chat template?): "
                      f"{str(exc)[:200]}")
    if p.tail > len(tpl):
        return None, (f"params.tail {p.tail} is longer than this model's chat template of "
                      f"{text!r} ({len(tpl)} tokens)")
    return b, ""


def note_no_chat(ctx: "ScenarioContext", p: ChatParams, table: str) -> None:
    """Say once in ``table`` when this engine gets token-ID prompts instead of chat prompts
    (:func:`chat_builder`)."""
    b, why = chat_builder(ctx, p)
    if b is None:
        ctx.note(table, "chat-shaped prompts not made (token-ID prompts of the same lengths, "
                        f"no expected-text check): {why}", echo=True)


def boundary_spec(ctx: "ScenarioContext", p: ChatParams, length: int, why: str,
                  max_tokens: int | None = None) -> RequestSpec:
    """A request of exactly ``length`` prompt tokens.

    At least as long as the chat template: the instruction padded with filler, checked with
    ``expected_text``. Shorter, or on an engine without chat prompts (:func:`chat_builder`): a
    seeded random token-ID prompt (text checks do not apply).
    """
    b, no_chat = chat_builder(ctx, p)
    mt = max_tokens or p.max_tokens
    checks = {name: {} for name in DEFAULT_CHECKS}
    if b is not None and length >= len(b.template(p.instruction)):
        prompt = b.build(p.instruction, length, key=f"chat-len{length}", why=why)
        checks["expected_text"] = {"regex": p.expected_regex}
    else:
        vocab = ctx.facts.vocab_or()
        (raw,) = seeded_prompts(length, 1, length, length, 16, vocab)
        prompt = Prompt(key=f"raw-len{length}", ids=raw.ids,
                        why=why + (" (no chat prompt on this engine: random token IDs)" if no_chat
                                   else " (shorter than the chat template: random token IDs)"))
    return RequestSpec(prompt, mt, checks=checks, note=prompt.why)


def text_prompt(ctx: "ScenarioContext", p: ChatParams, text: str, key: str,
                why: str | None = None) -> Prompt:
    """User message ``text`` as a prompt: its chat template (with ``messages``, so it can also
    go to /v1/chat/completions) where the engine makes chat prompts, else the IDs /tokenize
    makes of the plain text. Raises EngineError when /tokenize cannot answer at all."""
    b, _ = chat_builder(ctx, p)
    if b is not None:
        try:
            return b.prompt(text, key, why=why)
        except EngineError:
            pass  # this message has no template here: its plain text, as below
    return Prompt(key=key, ids=tuple(int(t) for t in ctx.client.tokenize(prompt=text)),
                  text=text, why=why)


def max_prompt_len(ctx: "ScenarioContext", max_tokens: int) -> int | None:
    """The longest prompt (tokens) that leaves ``max_tokens`` in max_model_len; None when M is
    unknown."""
    m = ctx.facts.max_model_len
    return None if m is None else int(m) - max_tokens
