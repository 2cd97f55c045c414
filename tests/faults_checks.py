"""Fault doubles of issue 24 (checks that judge the engine, not the model or the wire format),
for a :class:`doubles.FaultProxy` in front of the real CPU engine.

- :class:`ReverseTopLogprobs`: every ``top_logprobs`` object re-emitted with its keys in reverse
  order, values unchanged (what a gateway or a JSON library may do: JSON objects are unordered);
  a healthy answer in another key order, so every check must still pass.
- :class:`BreakAnswerUnderLoad`: the n-th run (and later) of chosen prompts gets one output token
  replaced, with the text to match (asked from the engine's /detokenize) and logprobs that agree
  (the new token top-1): the answer is broken only under load, its solo references are right.
- :class:`Chain`: several faults on one proxy, each with its own per-request state.
"""
from __future__ import annotations

import requests

from doubles import Counted, Fault, set_top, top_first, top_of


class ReverseTopLogprobs(Fault):
    """Reverse the key order of every ``top_logprobs`` entry (streamed chunks and non-streamed
    bodies alike). ``reordered``: how many entries of two or more keys were re-emitted."""

    def __init__(self):
        self.reordered = 0

    def chunk(self, ctx, chunk):
        for ch in chunk.get("choices") or []:
            tops = (ch.get("logprobs") or {}).get("top_logprobs") or []
            for j, top in enumerate(tops):
                if top and len(top) >= 2:
                    tops[j] = {k: top[k] for k in reversed(list(top))}
                    self.reordered += 1
        return chunk


class BreakAnswerUnderLoad(Counted):
    """For a request whose prompt is in ``prompts`` ({prompt IDs tuple: output position}) and
    which is at least the ``from_occurrence``-th run of its (prompt, max_tokens) (the cold and
    the warm solo reference are runs 1 and 2), replace the output token at that position with
    ``token_id``; the chunk's text is re-decoded by the engine (``upstream`` /detokenize, model
    ``model``). ``hits``: (request number, prompt length, position)."""

    def __init__(self, prompts: dict[tuple, int], token_id: int, upstream: str, model: str,
                 from_occurrence: int = 3):
        super().__init__()
        self.prompts = prompts
        self.token_id = token_id
        self.upstream = upstream.rstrip("/")
        self.model = model
        self.from_occurrence = from_occurrence
        self.hits: list[tuple[int, int, int]] = []

    def chunk(self, ctx, chunk):
        prompt = tuple(ctx.body.get("prompt") or [])
        if prompt not in self.prompts or self.occurrence(ctx) < self.from_occurrence:
            return chunk
        pos = self.prompts[prompt]
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            i = pos - ctx.tokens_so_far
            if 0 <= i < len(ids):
                ids[i] = self.token_id
                if top_of(ch, i):  # the logprobs agree: the new token is its position's top-1
                    set_top(ch, i, top_first(top_of(ch, i), self.token_id), self.token_id)
                ch["text"] = requests.post(self.upstream + "/detokenize", timeout=30, json={
                    "model": self.model, "tokens": ids}).json()["prompt"]
                self.hits.append((ctx.number, len(prompt), pos))
        return chunk


class Chain(Fault):
    """Apply ``faults`` in order; each sees its own ``ctx.state`` (the doubles keep their
    per-request decisions there under the same keys)."""

    def __init__(self, *faults: Fault):
        self.faults = faults

    def request(self, ctx, body):
        for f in self.faults:
            body = self._as(f, ctx, lambda: f.request(ctx, body))
        return body

    def chunk(self, ctx, chunk):
        for f in self.faults:
            if chunk is None:
                return None
            chunk = self._as(f, ctx, lambda: f.chunk(ctx, chunk))
        return chunk

    @staticmethod
    def _as(f, ctx, call):
        own = ctx.state.setdefault(("chain", id(f)), {})
        outer, ctx.state = ctx.state, own
        try:
            return call()
        finally:
            ctx.state = outer
