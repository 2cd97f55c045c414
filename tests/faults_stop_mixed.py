"""Fault doubles of issue 26 items 2 and 3 (stop strings, mixed per-request parameters), for a
:class:`doubles.FaultProxy` in front of the real CPU engine.

- :class:`IdsAfterStop`: the first streamed request with a stop string that ``select(ctx)``
  picks gets ``extra`` more token IDs (and logprob entries) appended to its last delta, the one
  that finishes with "stop" (copies of the last ID seen: the finishing delta may carry no IDs
  of its own when the client reads behind the engine), and usage counting them; the text stays cut at the stop (the public
  bug pattern: a stop inside a multi-token speculative step, text cut, IDs kept).
- :class:`PenaltyOnNeighbour`: a request with default parameters that arrives while a
  request with a penalty (repetition / frequency / presence) or a logit bias is in flight gets
  its tokens from position ``start`` changed (``id - 1``, text to match: what a neighbour's
  penalty applied to its row does); the same request with no penalised neighbour is untouched.
- :class:`StopOnNeighbour` (issue 35 item 5): a request without per-request parameters that
  arrives while a request with ``stop_token_ids`` is in flight ends at position ``start`` with
  finish_reason "stop" (a neighbour's stop applied to its batch row).
- :class:`StopIdsIgnored`: a request with ``stop_token_ids`` that arrives while another request
  is in flight is sent without them (the stop rule lost for its row): it runs past its stop ID.
- :class:`Rechunk`: no fault, a gateway that re-chunks streams (one ID a piece, the text on the
  first, SSE comments, an extra field): a healthy engine behind it must still pass.
"""
from __future__ import annotations

import threading

from doubles import Fault

PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias")
STOP_IDS = ("stop_token_ids", "min_tokens")


class IdsAfterStop(Fault):
    """See the module docstring. ``hits``: (request number, IDs appended)."""

    def __init__(self, select, extra: int = 2):
        self.select = select
        self.extra = extra
        self.hits: list[tuple[int, int]] = []
        self.picked: list[int] = []
        self.lock = threading.Lock()

    def chunk(self, ctx, chunk):
        if not ctx.body.get("stop") or not ctx.streamed:
            return chunk
        if "selected" not in ctx.state:
            with self.lock:
                ctx.state["selected"] = not self.picked and bool(self.select(ctx))
                if ctx.state["selected"]:
                    self.picked.append(ctx.number)
        if not ctx.state["selected"]:
            return chunk
        keys = ("token_logprobs", "top_logprobs", "tokens", "text_offset")
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids")
            lp = ch.get("logprobs") or {}
            if ids:  # the last ID and logprob entries seen: the finishing delta may carry none
                ctx.state["last"] = (ids[-1], {k: lp[k][-1] for k in keys
                                               if isinstance(lp.get(k), list) and lp[k]})
            if ch.get("finish_reason") == "stop" and "last" in ctx.state:
                last_id, last_lp = ctx.state["last"]
                ch["token_ids"] = list(ids or []) + [last_id] * self.extra
                if last_lp:
                    if ch.get("logprobs") is None:
                        ch["logprobs"] = {}
                    lp = ch["logprobs"]
                    for k, v in last_lp.items():
                        lp[k] = list(lp.get(k) or []) + [v] * self.extra
                ctx.state["appended"] = True
                self.hits.append((ctx.number, self.extra))
        if ctx.state.get("appended") and chunk.get("usage"):
            u = chunk["usage"]
            u["completion_tokens"] += self.extra
            u["total_tokens"] = (u.get("prompt_tokens") or 0) + u["completion_tokens"]
        return chunk


def is_default(body) -> bool:
    """Whether a request body sets none of the per-request parameters mixed_params varies."""
    return not (any(k in body for k in (*PENALTIES, *STOP_IDS)) or body.get("stop")
                or not body.get("ignore_eos"))  # the eos variant omits it (vLLM: false)


def select_beside(fault, ctx, pred) -> None:
    """Mark ``ctx`` selected (and note it in ``fault.hits``) when another request in flight on
    ``fault.proxy`` satisfies ``pred``."""
    with fault.proxy.lock:
        beside = [o for o in fault.proxy.active if o is not ctx and pred(o)]
    if beside:
        ctx.state["selected"] = True
        with fault.lock:
            fault.hits.append(ctx.number)


class PenaltyOnNeighbour(Fault):
    """See the module docstring. Set ``proxy`` after creating the FaultProxy. ``hits``: the
    numbers of the changed requests."""

    def __init__(self, start: int = 2):
        self.start = start
        self.proxy = None
        self.hits: list[int] = []
        self.lock = threading.Lock()

    def request(self, ctx, body):
        if not is_default(body):
            return body  # only default requests are changed
        select_beside(self, ctx, lambda o: any(k in o.body for k in PENALTIES))
        return body

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            changed = False
            for i in range(len(ids)):
                if ctx.tokens_so_far + i >= self.start:
                    ids[i] = ids[i] - 1 if ids[i] > 16 else ids[i] + 1
                    changed = True
            if changed:
                ch["text"] = "".join(f" t{t}" for t in ids)
        return chunk


class StopOnNeighbour(Fault):
    """See the module docstring. Set ``proxy`` after creating the FaultProxy. ``hits``: the
    numbers of the cut requests."""

    LP_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")

    def __init__(self, start: int = 3):
        self.start = start
        self.proxy = None
        self.hits: list[int] = []
        self.lock = threading.Lock()

    def request(self, ctx, body):
        if not is_default(body):
            return body  # only default requests are cut (a variant is no neighbour here)
        if ctx.streamed:
            select_beside(self, ctx, lambda o: bool(o.body.get("stop_token_ids")))
        return body

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        if ctx.state.get("cut"):  # after the cut: only the finish and the usage go through
            done = [ch for ch in chunk.get("choices") or [] if ch.get("finish_reason")]
            if not done and not chunk.get("usage"):
                return None
            for ch in done:
                ch.update(token_ids=[], text="", logprobs=None, finish_reason="stop")
            chunk["choices"] = done
            if chunk.get("usage"):
                u = chunk["usage"]
                u["completion_tokens"] = self.start
                u["total_tokens"] = (u.get("prompt_tokens") or 0) + self.start
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            keep = self.start - ctx.tokens_so_far
            if 0 <= keep < len(ids):
                ch["token_ids"] = ids[:keep]
                lp = ch.get("logprobs") or {}
                for k in self.LP_KEYS:
                    if isinstance(lp.get(k), list):
                        lp[k] = lp[k][:keep]
                ch["finish_reason"] = ch.get("finish_reason") and "stop"
                ctx.state["cut"] = True
        return chunk


class StopIdsIgnored(Fault):
    """See the module docstring. Set ``proxy`` after creating the FaultProxy. ``hits``: the
    numbers of the requests sent without their stop IDs."""

    def __init__(self):
        self.proxy = None
        self.hits: list[int] = []
        self.lock = threading.Lock()

    def request(self, ctx, body):
        if not body.get("stop_token_ids") or ctx.in_flight < 2:
            return body
        with self.lock:
            self.hits.append(ctx.number)
        return {k: v for k, v in body.items() if k != "stop_token_ids"}


class Rechunk(Fault):
    """Not a fault: a gateway in front of a healthy engine (issue 35 item 7). Every streamed
    completions chunk with several token IDs is sent as one piece per ID, the whole text on the
    first piece, each logprobs list split with its IDs, finish_reason and usage on the last; an
    SSE comment line goes before each chunk and every piece carries an extra field. The OpenAI
    protocol allows all of it: only the concatenations of text and IDs are promised.
    ``split``: chunks split so far."""

    def __init__(self):
        self.split = 0

    def chunk(self, ctx, chunk):
        if not ctx.streamed:
            return dict(chunk, gateway="x")  # one JSON answer: nothing to re-chunk
        if len(chunk.get("choices") or []) != 1:
            return [": gateway keep-alive", dict(chunk, gateway="x")]
        (c,) = chunk["choices"]
        ids = c.get("token_ids") or []
        if len(ids) < 2:
            return [": gateway keep-alive", dict(chunk, gateway="x")]
        self.split += 1
        lp = c.get("logprobs") or None
        pieces: list = [": gateway keep-alive"]
        for j, tid in enumerate(ids):
            last = j == len(ids) - 1
            piece = dict(c, token_ids=[tid], text=c.get("text") or "" if j == 0 else "",
                         finish_reason=c.get("finish_reason") if last else None)
            if lp:
                piece["logprobs"] = {k: v[j:j + 1] if isinstance(v, list) else v
                                     for k, v in lp.items()}
            pieces.append(dict(chunk, choices=[piece], gateway="x",
                               usage=chunk.get("usage") if last else None))
        return pieces
