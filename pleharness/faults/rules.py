"""The fault rules of the fault-injection proxy (:class:`~pleharness.faults.proxy.FaultProxy`):
what a fault sees of a request (:class:`RequestCtx`), the hooks a fault may implement
(:class:`Fault`), the helpers that edit a chunk's tokens and top logprobs, and the fault classes
the tests plant (``tests/doubles.py`` re-exports every name)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestCtx:
    number: int  # 1-based arrival order among completion requests
    body: dict
    in_flight: int  # completion requests in flight when this one arrived (itself included)
    tokens_so_far: int = 0
    state: dict = field(default_factory=dict)
    twins_in_flight: int = 0  # other requests with the same prompt in flight when it arrived
    done: bool = False  # the proxy no longer counts it in flight
    sock: Any = None  # the client's connection
    client_gone: bool = False  # the client closed its connection before the answer ended
    chat: bool = False  # a /v1/chat/completions request (its chunks have the chat shape)

    @property
    def streamed(self) -> bool:
        """Whether the answer is streamed: OpenAI's ``stream``, false when omitted."""
        return self.body.get("stream") is True


def corrupt_if_selected(ctx: "RequestCtx", chunk: dict, vocab: int) -> dict:
    """Every token of ``chunk`` -> ``(id + 1) % vocab`` (text to match) when the fault selected
    ``ctx`` (``ctx.state["selected"]``); the chunk unchanged otherwise."""
    if ctx.state.get("selected"):
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                ids[i] = (ids[i] + 1) % vocab
            if ids:
                ch["text"] = "".join(f" t{t}" for t in ids)
    return chunk


class Fault:
    """Base fault: changes nothing. ``refused``: POST paths (e.g. ``/reset_prefix_cache``) the
    proxy answers 404 for, as an engine without ``VLLM_SERVER_DEV_MODE=1`` does. ``chat``:
    whether the fault also sees ``/v1/chat/completions`` requests and chunks (their shape
    differs); off, they pass through untouched (still counted in flight)."""

    refused: tuple[str, ...] = ()
    chat: bool = False

    def request(self, ctx: RequestCtx, body: dict) -> dict:
        return body

    def chunk(self, ctx: RequestCtx, chunk: dict) -> dict | list | None:
        """The streamed chunk as the client gets it: a dict, None (dropped), or a list of
        pieces sent in its place, each a chunk dict or a raw SSE line (e.g. a ``: comment``)."""
        return chunk

    def metrics(self, text: str) -> str:
        """The engine's Prometheus /metrics text as the proxy serves it (default: unchanged)."""
        return text

    def server_info(self, data: dict) -> dict:
        """The engine's ``/server_info`` JSON as the proxy serves it (default: unchanged)."""
        return data

    def disconnected(self, ctx: RequestCtx) -> None:
        """The client of ``ctx`` closed its connection before the answer ended (called once; the
        proxy then closes its upstream request, so the engine sees the disconnect too)."""

    def prefix_cache_reset(self) -> None:
        """The engine answered ``POST /reset_prefix_cache`` with 200 (forwarded by the proxy)."""


def merge_chunks(chunks: list[dict]) -> dict:
    """One non-streamed completion body from streamed chunks (vLLM's answer with stream=false)."""
    choice: dict = {"index": 0, "text": "", "token_ids": [], "finish_reason": None}
    usage = None
    for ch in chunks:
        usage = ch.get("usage") or usage
        for c in ch.get("choices") or []:
            choice["text"] += c.get("text") or ""
            choice["token_ids"] += c.get("token_ids") or []
            if c.get("finish_reason") is not None:
                choice["finish_reason"] = c["finish_reason"]
            lp = c.get("logprobs")
            if lp:
                acc = choice.setdefault("logprobs", {})
                for k, v in lp.items():
                    if isinstance(v, list):
                        acc.setdefault(k, []).extend(v)
    return {"object": "text_completion", "choices": [choice], "usage": usage}


class SentinelLogprobs(Fault):
    """For the requests ``select(ctx)`` picks, keep the first top_logprobs entry of every position
    and replace the others with -9999.0 (vLLM's -inf) on token ids 0, 1, 2, ... (issue 16, 2)."""

    def __init__(self, select):
        self.select = select
        self.hits: list[int] = []

    def chunk(self, ctx, chunk):
        if "selected" not in ctx.state:
            ctx.state["selected"] = bool(self.select(ctx))
            if ctx.state["selected"]:
                self.hits.append(ctx.number)
        if not ctx.state["selected"]:
            return chunk
        for ch in chunk.get("choices") or []:
            tops = (ch.get("logprobs") or {}).get("top_logprobs") or []
            for j, top in enumerate(tops):
                if top:
                    first = next(iter(top.items()))
                    new = dict([first])
                    for t in range(len(top) - 1):
                        new[f"token_id:{t}"] = -9999.0
                    tops[j] = new
        return chunk


class CorruptConfident(Fault):
    """Corrupt the requests ``select(ctx)`` picks from their first position >= ``start`` where the
    engine's own top-1/top-2 margin is at least ``margin`` nats (the answer carries logprobs), to
    the end: the divergence is then "hard" on any machine, whatever the model's exact tokens are
    (a near tie would only be a warning). ``hits``: (request number, first corrupted position)."""

    def __init__(self, select, start: int = 2, margin: float = 1.0):
        self.select = select
        self.start = start
        self.margin = margin
        self.hits: list[tuple[int, int]] = []

    def chunk(self, ctx, chunk):
        if "selected" not in ctx.state:
            ctx.state["selected"] = bool(self.select(ctx))
        if not ctx.state["selected"]:
            return chunk
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            tops = (ch.get("logprobs") or {}).get("top_logprobs") or []
            for i in range(len(ids)):
                if "from" not in ctx.state and pos + i >= self.start and i < len(tops):
                    vals = sorted(tops[i].values(), reverse=True)
                    if len(vals) >= 2 and vals[0] - vals[1] >= self.margin:
                        ctx.state["from"] = pos + i
                        self.hits.append((ctx.number, pos + i))
                if "from" in ctx.state:
                    ids[i] = ids[i] - 1 if ids[i] > 16 else ids[i] + 1
            pos += len(ids)
        return chunk


class TruncatePrompt(Fault):
    """Forward only the last ``keep(n)`` prompt tokens of the requests ``select(ctx)`` picks: the
    engine answers 200 for the front-cut prompt (issue 16 item 3)."""

    def __init__(self, select, keep):
        self.select = select
        self.keep = keep
        self.hits: list[int] = []

    def request(self, ctx, body):
        if self.select(ctx):
            self.hits.append(ctx.number)
            body = {**body, "prompt": list(body["prompt"])[-self.keep(len(body["prompt"])):]}
        return body


class Reseed(Fault):
    """Change the ``seed`` of the seeded requests that ``select(ctx)`` picks (a different sample
    than the same request alone gets; issue 16 item 5)."""

    def __init__(self, select):
        self.select = select
        self.hits: list[int] = []

    def request(self, ctx, body):
        if body.get("seed") is not None and self.select(ctx):
            self.hits.append(ctx.number)
            body = {**body, "seed": body["seed"] + 1}
        return body


class StopAtBlock(Fault):
    """Stop emitting at the last multiple of ``q`` below max_tokens (output, logprobs and usage
    consistent, finish_reason ``finish``): an engine that ends a request at a speculative-block
    boundary (issue 16 item 7). Invisible when max_tokens is a multiple of q."""

    def __init__(self, q: int, finish: str = "length"):
        self.q = q
        self.finish = finish
        self.hits: list[tuple[int, int, int]] = []

    def chunk(self, ctx, chunk):
        mt = int(ctx.body.get("max_tokens"))
        cut = mt - mt % self.q
        if cut == mt:
            return chunk
        if "hit" not in ctx.state:
            ctx.state["hit"] = True
            self.hits.append((ctx.number, mt, cut))
        if chunk.get("usage"):
            chunk["usage"]["completion_tokens"] = min(cut, chunk["usage"]["completion_tokens"])
            chunk["usage"]["total_tokens"] = (chunk["usage"].get("prompt_tokens") or 0) + \
                chunk["usage"]["completion_tokens"]
        kept = []
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            n = max(0, min(len(ids), cut - ctx.tokens_so_far))
            if n == 0 and (ids or ctx.tokens_so_far >= cut):
                continue  # wholly after the cut (tokens, or the engine's own finish)
            if n < len(ids):
                ch["token_ids"], ch["text"] = ids[:n], ""
                for k, v in (ch.get("logprobs") or {}).items():
                    if isinstance(v, list):
                        ch["logprobs"][k] = v[:n]
            if ctx.tokens_so_far + n == cut:
                ch["finish_reason"] = self.finish
            kept.append(ch)
        if not kept and not chunk.get("usage"):
            return None
        chunk["choices"] = kept
        return chunk


class FlipToken(Fault):
    """Flip the output token at position ``pos`` of the ``request_number``-th completion request."""

    def __init__(self, request_number: int, pos: int, vocab: int):
        self.request_number = request_number
        self.pos = pos
        self.vocab = vocab
        self.flipped: dict[str, Any] = {}

    def chunk(self, ctx, chunk):
        if ctx.number != self.request_number:
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                if ctx.tokens_so_far + i == self.pos:
                    old = ids[i]
                    ids[i] = (old + 1) % self.vocab
                    self.flipped = {"request": ctx.number, "pos": self.pos, "old": old,
                                    "new": ids[i], "in_flight": ctx.in_flight}
        return chunk


class Counted(Fault):
    """Base of the faults that pick requests by their prompt's occurrence (thread-safe)."""

    def __init__(self):
        self.seen: dict[tuple, int] = {}
        self.lock = threading.Lock()

    def occurrence(self, ctx) -> int:
        """1 for the first request with this (prompt, max_tokens), 2 for the second, ..."""
        if "occurrence" not in ctx.state:
            key = (tuple(ctx.body.get("prompt") or []), ctx.body.get("max_tokens"))
            with self.lock:
                self.seen[key] = self.seen.get(key, 0) + 1
                ctx.state["occurrence"] = self.seen[key]
        return ctx.state["occurrence"]


class Corrupt(Counted):
    """Corrupt the output of the requests that ``select(ctx)`` picks, at positions >= ``start``.

    ``mutate(token_id, pos) -> (new_id, new_text)`` gives the replacement for each corrupted
    position (the text changes too, as it would on a corrupting engine). ``hits`` lists the
    corrupted requests' (number, prompt length, max_tokens).
    """

    def __init__(self, select, mutate, start: int = 0, stop: int | None = None,
                 consistent: bool = False):
        super().__init__()
        self.select = select
        self.mutate = mutate
        self.start = start
        self.stop = stop
        self.consistent = consistent  # also make each new token its position's top-1 logprob
        self.hits: list[tuple[int, int, int]] = []

    def chunk(self, ctx, chunk):
        self.occurrence(ctx)
        if "selected" not in ctx.state:
            ctx.state["selected"] = bool(self.select(ctx))
            if ctx.state["selected"]:
                self.hits.append((ctx.number, len(ctx.body.get("prompt") or []),
                                  ctx.body.get("max_tokens")))
        if not ctx.state["selected"]:
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            texts = []
            for i in range(len(ids)):
                pos = ctx.tokens_so_far + i
                if pos >= self.start and (self.stop is None or pos < self.stop):
                    ids[i], t = self.mutate(ids[i], pos)
                    texts.append(t)
                    if self.consistent and top_of(ch, i):
                        set_top(ch, i, top_first(top_of(ch, i), ids[i]), ids[i])
            if texts:
                ch["text"] = "".join(texts)
        return chunk


class EditTokens(Counted):
    """Edit chosen positions of the requests that ``select(ctx)`` picks (decided once per request).

    ``edit(ctx, choice, i, pos)`` is called for every output token of a picked request (``i`` the
    index inside this chunk's ``token_ids``, ``pos`` the position in the whole output) and may
    change ``choice["token_ids"][i]`` and the matching ``choice["logprobs"]`` entries (helpers:
    :func:`top_of`, :func:`set_top`). ``hits`` lists the picked requests' numbers.
    """

    def __init__(self, select, edit):
        super().__init__()
        self.select = select
        self.edit = edit
        self.hits: list[int] = []

    def chunk(self, ctx, chunk):
        self.occurrence(ctx)
        if "selected" not in ctx.state:
            with self.lock:
                ctx.state["selected"] = bool(self.select(ctx))
                if ctx.state["selected"]:
                    self.hits.append(ctx.number)
        if ctx.state["selected"]:
            for ch in chunk.get("choices") or []:
                for i in range(len(ch.get("token_ids") or [])):
                    self.edit(ctx, ch, i, ctx.tokens_so_far + i)
        return chunk


def top_of(choice: dict, i: int) -> dict[int, float]:
    """{token id: logprob} of the i-th token's top_logprobs in a streamed choice (keys
    ``token_id:N``, as the harness asks with return_tokens_as_token_ids)."""
    tops = ((choice.get("logprobs") or {}).get("top_logprobs") or [])
    if i >= len(tops) or not tops[i]:
        return {}
    return {int(k.split(":", 1)[1]): v for k, v in tops[i].items()}


def top_first(top: dict[int, float], chosen: int) -> dict[int, float]:
    """``top`` as an engine that emitted ``chosen`` greedily would list it: ``chosen`` takes the
    best logprob, the other entries keep theirs, best first (the same number of entries)."""
    best = max(top.values())
    rest = sorted(((t, v) for t, v in top.items() if t != chosen), key=lambda kv: -kv[1])
    if chosen in top:  # swap: the emitted token and the former top-1 trade places
        rest = [(t, top[chosen] if v == best else v) for t, v in rest]
        rest.sort(key=lambda kv: -kv[1])
    return dict([(chosen, best)] + rest[:len(top) - 1])


def set_top(choice: dict, i: int, top: dict[int, float], chosen: int) -> None:
    """Replace the i-th token (id and text) and its logprobs with ``chosen`` / ``top``."""
    choice["token_ids"][i] = chosen
    lp = choice.get("logprobs")
    if lp:
        lp["top_logprobs"][i] = {f"token_id:{t}": v for t, v in top.items()}
        if lp.get("token_logprobs"):
            lp["token_logprobs"][i] = top.get(chosen, -30.0)
        if lp.get("tokens"):
            lp["tokens"][i] = f"token_id:{chosen}"


class CorruptWhenCrowded(Fault):
    """Corrupt (every token from position 0: ``(id + 1) % vocab``) the streamed completions whose
    prompt is exactly ``length`` tokens long while at least ``min_in_flight`` completion requests
    were in flight during the request's life so far: the ones in flight when it arrived (itself
    included) plus the ones that arrived after it. The fuzz target of tests/test_fuzz.py and
    benchmarks/fuzz_find_rate.py (one combination: L = n*C + q with >= 3 in flight). Set
    ``proxy`` to the FaultProxy after creating it. ``hits``: (request number, peak in flight)."""

    def __init__(self, length: int, min_in_flight: int, vocab: int):
        self.length = length
        self.min_in_flight = min_in_flight
        self.vocab = vocab
        self.proxy: Any = None  # the FaultProxy (pleharness.faults.proxy), once set
        self.hits: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def chunk(self, ctx, chunk):
        if len(ctx.body.get("prompt") or []) != self.length or not ctx.streamed:
            return chunk
        if not ctx.state.get("selected"):
            with self.proxy.lock:
                later = sum(1 for c in self.proxy.log if c.number > ctx.number)
            peak = ctx.in_flight + later
            if peak >= self.min_in_flight:
                ctx.state["selected"] = True
                with self.lock:
                    self.hits.append((ctx.number, peak))
        return corrupt_if_selected(ctx, chunk, self.vocab)


class CorruptInserted(Fault):
    """Corrupt (every token: ``(id + 1) % vocab``, streamed or not) the completion requests that
    arrive while another, streamed completion is in flight and has streamed at least
    ``after_tokens`` tokens through the proxy: a prefill inserted into a running decode past
    position N. The fuzz target of the insert tests (tests/test_fuzz.py) and
    benchmarks/fuzz_find_rate.py ``--fault insert``. Set ``proxy`` to the FaultProxy after
    creating it. ``hits``: (request number, the carrier's request number, its tokens then)."""

    def __init__(self, after_tokens: int, vocab: int):
        self.after_tokens = after_tokens
        self.vocab = vocab
        self.proxy: Any = None  # the FaultProxy (pleharness.faults.proxy), once set
        self.hits: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()

    def request(self, ctx, body):
        with self.proxy.lock:
            past = [o for o in self.proxy.active if o is not ctx and o.streamed
                    and o.tokens_so_far >= self.after_tokens]
        if past:
            ctx.state["selected"] = True
            with self.lock:
                self.hits.append((ctx.number, past[0].number, past[0].tokens_so_far))
        return body

    def chunk(self, ctx, chunk):
        return corrupt_if_selected(ctx, chunk, self.vocab)
