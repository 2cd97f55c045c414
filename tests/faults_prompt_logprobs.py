"""Fault double of issue 35 item 4 (prompt logprobs and echo), for a :class:`doubles.FaultProxy`
in front of the real CPU engine.

:class:`ShiftedPromptLogprobs`: a request that asks for the prompt's scores (``prompt_logprobs``,
or ``echo`` with ``logprobs``) and arrives while another request is in flight gets them shifted
by one position: entry t holds what the engine gave for entry t - 1 (entry 1 none), the public
bug pattern (an off-by-one in the gather of the prompt's logits rows under batching). With
``relabel``, entry t holds entry t + 1's scores (the last entry kept) keyed as prompt token
t's: the IDs line up and every entry is complete and self-consistent, only the values are the
next position's (what a logits row taken one position off gives), so only the comparison with
the solo request can tell.
"""
from __future__ import annotations

import threading

from doubles import Fault


def asks_scores(body: dict) -> bool:
    """Whether a completions request body asks for the prompt's scores."""
    return body.get("prompt_logprobs") is not None or (
        bool(body.get("echo")) and body.get("logprobs") is not None)


class ShiftedPromptLogprobs(Fault):
    """See the module docstring. ``hits``: the numbers of the requests whose scores were
    shifted."""

    def __init__(self, relabel: bool = False):
        self.relabel = relabel
        self.hits: list[int] = []
        self.lock = threading.Lock()

    def request(self, ctx, body):
        if asks_scores(body) and ctx.in_flight >= 2:
            ctx.state["selected"] = True
            with self.lock:
                self.hits.append(ctx.number)
        return body

    def _shift(self, entries: list, prompt: list[int], key) -> list:
        if not self.relabel:
            return [entries[0], None] + list(entries[1:-1])
        out = list(entries)
        for t in range(1, len(out) - 1):  # entry t <- entry t + 1, keyed as token t's
            e = entries[t + 1]
            if e:
                old, new = key(prompt[t + 1]), key(prompt[t])
                out[t] = {(new if k == old else old if k == new else k): v
                          for k, v in e.items()}
        return out

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected") or ctx.state.get("done"):
            return chunk
        prompt = list(ctx.body.get("prompt") or [])
        for ch in chunk.get("choices") or []:
            if ch.get("prompt_logprobs"):  # prompt_logprobs (non-streamed)
                ch["prompt_logprobs"] = self._shift(ch["prompt_logprobs"], prompt, str)
                ctx.state["done"] = True
            lp = ch.get("logprobs") or {}
            tops = lp.get("top_logprobs")
            if ctx.body.get("echo") and tops and len(tops) >= len(prompt):  # echo: its head
                n = len(prompt)
                lp["top_logprobs"] = self._shift(tops[:n], prompt,
                                                 lambda t: f"token_id:{t}") + tops[n:]
                tl = lp.get("token_logprobs")
                if tl:
                    new = [lp["top_logprobs"][t].get(f"token_id:{prompt[t]}")
                           if lp["top_logprobs"][t] else None for t in range(n)]
                    lp["token_logprobs"] = new + tl[n:]
                ctx.state["done"] = True
        return chunk
