"""Fault doubles of issue 35 item 2 (requests for several choices, ``n`` > 1), for a
:class:`doubles.FaultProxy` in front of the real CPU engine. Each touches only requests with
``n`` > 1 that ``select(ctx)`` picks; streamed or not.

- :class:`ClonedChoices`: the request goes to the engine with n = 1 and its one choice comes
  back as every choice (index 0 .. n - 1), usage counting them all: every choice repeats
  choice 0 (the public bug pattern: the seed shared by every choice, vllm-project/vllm#11898).
- :class:`ChoiceTokenChanged`: the selftest's family class (choice ``index``'s IDs from position
  ``start`` on changed under load, text to match), re-exported here.
- :class:`UsageOneChoice`: the request's final usage counts choice 0's IDs only
  (``completion_tokens`` = choice 0's count).
"""
from __future__ import annotations

import copy
import threading

from doubles import Fault
from pleharness.faults.families import ChoiceTokenChanged  # noqa: F401


class _Selecting(Fault):
    def __init__(self, select):
        self.select = select
        self.hits: list[int] = []
        self.lock = threading.Lock()

    def picked(self, ctx, body) -> bool:
        if int(body.get("n") or 1) < 2 or not self.select(ctx):
            return False
        ctx.state["selected"] = True
        ctx.state["n"] = int(body["n"])
        with self.lock:
            self.hits.append(ctx.number)
        return True


class ClonedChoices(_Selecting):
    """See the module docstring. ``hits``: the request numbers changed."""

    def request(self, ctx, body):
        if not self.picked(ctx, body):
            return body
        return {**body, "n": 1}

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        n = ctx.state["n"]
        choices = []
        for ch in chunk.get("choices") or []:
            for i in range(n):
                c = copy.deepcopy(ch)
                c["index"] = i
                choices.append(c)
        if not ctx.streamed:  # one body: every choice, the request's usage
            chunk["choices"] = choices
            u = chunk.get("usage")
            if u:
                u["completion_tokens"] *= n
                u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
            return chunk
        if chunk.get("choices"):  # each copy as a chunk of its own (vLLM: one choice a chunk)
            return [{**chunk, "choices": [c]} for c in choices]
        if chunk.get("usage"):  # the final usage: every copy counted
            u = chunk["usage"]
            u["completion_tokens"] *= n
            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        return chunk


class UsageOneChoice(_Selecting):
    """See the module docstring. ``hits``: the request numbers changed."""

    def request(self, ctx, body):
        self.picked(ctx, body)
        return body

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        counts = ctx.state.setdefault("counts", {})
        for ch in chunk.get("choices") or []:
            i = ch.get("index", 0)
            counts[i] = counts.get(i, 0) + len(ch.get("token_ids") or [])
        u = chunk.get("usage")
        if u and (not ctx.streamed or not chunk.get("choices")):  # the request's usage
            u["completion_tokens"] = counts.get(0, 0)
            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        return chunk
