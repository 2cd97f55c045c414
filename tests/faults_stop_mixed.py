"""Fault doubles of issue 26 items 2 and 3 (stop strings, mixed per-request parameters), for a
:class:`doubles.FaultProxy` in front of the real CPU engine. The first three are the selftest's
family classes (:mod:`pleharness.faults.families`), re-exported here.

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
from pleharness.faults.families import (IdsAfterStop, PenaltyOnNeighbour,  # noqa: F401
                                        StopOnNeighbour, is_default)


class StopIdsIgnored(Fault):
    """See the module docstring. ``hits``: the numbers of the requests sent without their stop
    IDs."""

    def __init__(self):
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
