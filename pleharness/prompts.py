"""Prompt builders. Prompts are token-ID lists, never text the server re-tokenizes.

- :func:`seeded_prompts`: reproducible random token-ID prompts of varied lengths.
- :func:`pad_chat_prompt`: exact-length chat-shaped prompts (filler inserted before the
  generation-prompt tail).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .parity import token_hash


@dataclass(frozen=True)
class Prompt:
    """A prompt with a stable key (for references) and its token IDs.

    ``messages``: ((role, content), ...) when ``ids`` are exactly the chat template of these
    messages with the generation prompt (``/tokenize`` with them, nothing padded or cut): such a
    prompt can also go to ``/v1/chat/completions`` (``--api``, :mod:`pleharness.run.api`);
    None for token-ID prompts that have no message form (random IDs, padded templates). Not part
    of :attr:`hash` (the IDs are the prompt)."""

    key: str
    ids: tuple[int, ...]
    text: str | None = None  # the instruction, for display and expected-text checks
    why: str | None = None  # why this length was chosen (boundary scenarios)
    messages: tuple[tuple[str, str], ...] | None = None

    @property
    def hash(self) -> str:
        """SHA256 hex of the prompt's token IDs (:func:`pleharness.parity.token_hash`)."""
        return token_hash(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def seeded_prompts(seed: int, count: int, min_len: int, max_len: int,
                   id_low: int, id_high: int) -> list[Prompt]:
    """``count`` prompts of random IDs in [id_low, id_high), lengths spread over [min_len, max_len].

    Lengths are evenly spaced between the bounds (so both ends are always covered) and IDs come from
    ``random.Random(seed)``: the same arguments always give the same prompts.

    Raises ValueError for count < 1, min_len < 1, min_len > max_len or an empty ID range.
    """
    if count < 1 or min_len < 1 or min_len > max_len or id_low >= id_high:
        raise ValueError(f"bad prompt set: count={count} lengths=[{min_len}, {max_len}] "
                         f"ids=[{id_low}, {id_high})")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = min_len if count == 1 else min_len + round(i * (max_len - min_len) / (count - 1))
        ids = tuple(rng.randrange(id_low, id_high) for _ in range(n))
        out.append(Prompt(key=f"p{i}-len{n}", ids=ids))
    return out


def pad_chat_prompt(template_ids: list[int], filler_id: int, length: int, tail: int = 4) -> list[int]:
    """Insert ``filler_id`` before the last ``tail`` IDs until the prompt has exactly ``length`` IDs.

    ``template_ids`` is the chat-templated prompt (with the generation prompt); its last ``tail``
    tokens are the generation-prompt tail. Raises ValueError when ``length`` is shorter than the
    unpadded prompt or ``tail`` is out of range.
    """
    if not 0 <= tail <= len(template_ids):
        raise ValueError(f"tail {tail} out of range for a {len(template_ids)}-token prompt")
    if length < len(template_ids):
        raise ValueError(f"length {length} is shorter than the unpadded prompt "
                         f"({len(template_ids)} tokens)")
    cut = len(template_ids) - tail
    return template_ids[:cut] + [filler_id] * (length - len(template_ids)) + template_ids[cut:]


class ChatPromptBuilder:
    """Exact-length chat-shaped prompts through the engine's /tokenize endpoint.

    The messages are tokenized with the model's chat template (``add_generation_prompt``); the filler
    string (default " ") is tokenized without special tokens and must be exactly one token; filler
    tokens are inserted before the last ``tail`` template tokens (the generation-prompt tail, default
    4) until the prompt has exactly N tokens (shared/DESIGN.md, "Prompt builder").

    Raises ValueError naming the filler when it is not one token, and when N is shorter than the
    unpadded prompt.
    """

    def __init__(self, client, filler: str = " ", tail: int = 4):
        self.client = client
        self.tail = tail
        ids = client.tokenize(prompt=filler, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"filler string {filler!r} is {len(ids)} tokens ({ids}), not exactly "
                             "one; choose another filler")
        self.filler_id = ids[0]
        self._templates: dict[str, list[int]] = {}
        self._failed: dict[str, Exception] = {}

    def template(self, text: str) -> list[int]:
        """Token IDs of the chat template around user message ``text`` with the generation
        prompt (asked from the engine's /tokenize once per text; a failure, e.g. a model with
        no chat template, is kept and raised again without asking again)."""
        if text in self._failed:
            raise self._failed[text]
        if text not in self._templates:
            try:
                self._templates[text] = self.client.tokenize(
                    messages=[{"role": "user", "content": text}], add_generation_prompt=True)
            except Exception as exc:
                self._failed[text] = exc
                raise
        return self._templates[text]

    def prompt(self, text: str, key: str, why: str | None = None) -> Prompt:
        """The unpadded chat prompt of user message ``text``: :meth:`template`'s IDs, with
        ``messages`` set (it can also go to /v1/chat/completions). Raises EngineError when
        /tokenize cannot answer."""
        return Prompt(key=key, ids=tuple(self.template(text)), text=text, why=why,
                      messages=(("user", text),))

    def build(self, text: str, length: int, key: str | None = None, why: str | None = None) -> Prompt:
        """A chat prompt of exactly ``length`` tokens: the template of ``text`` padded with the
        filler before the last ``tail`` tokens (no ``messages``: an exact-length prompt is
        treated as token IDs, even where no filler was needed; :meth:`prompt` gives the message
        form). Raises ValueError when ``length`` is shorter than the template."""
        ids = pad_chat_prompt(self.template(text), self.filler_id, length, self.tail)
        return Prompt(key=key or f"chat-len{length}", ids=tuple(ids), text=text, why=why)
