"""The fault-injection proxy and its fault classes: an HTTP server that forwards to a real engine and
injects faults a healthy engine never produces (used by ``ple-harness selftest`` and by the tests;
``tests/doubles.py`` re-exports every name).

``FaultProxy(upstream, fault)`` forwards every request to ``upstream``; for streamed
``/v1/completions`` and ``/v1/chat/completions`` (:data:`COMPLETION_PATHS`; a chat chunk keeps
its own shape: ``choices[i].token_ids`` and ``delta``, the prompt IDs on the first chunk) it
passes each SSE chunk through ``fault.chunk(ctx, chunk)``, which may modify it. ``ctx`` tells the fault which completion request this is (1-based arrival order), the prompt,
how many tokens were already streamed, and how many identical prompts were in flight when it
arrived. A non-streamed answer goes through ``fault.chunk`` once, as one chunk that holds every
token (``tokens_so_far`` = 0) and the usage block; a streamed chunk may be dropped (None) or
replaced by a list of chunks, each sent as its own event. ``fault.request(ctx, body)`` may change the
request before it is forwarded (the engine then answers the changed request).
"""
from __future__ import annotations

import json
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")  # requests a fault sees


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


_NO_FAULT = Fault()  # what a chat request meets behind a fault that does not handle chat


class FaultProxy:
    """Forwarding HTTP server on 127.0.0.1 (a free port) with a fault hook; a context manager."""

    def __init__(self, upstream: str, fault: Fault | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        self.upstream = upstream.rstrip("/")
        self.fault = fault or Fault()
        if hasattr(self.fault, "proxy"):  # a fault that looks at the requests in flight
            self.fault.proxy = self
        self.lock = threading.Lock()
        self.count = 0
        self.in_flight = 0
        self.log: list[RequestCtx] = []
        self.active: list[RequestCtx] = []
        self.disconnects: list[int] = []  # numbers of the requests whose client went away
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                proxy.sweep()
                r = requests.get(proxy.upstream + self.path, timeout=30)
                content = r.content
                if self.path.split("?", 1)[0] == "/metrics" and r.status_code == 200 and \
                        type(proxy.fault).metrics is not Fault.metrics:  # else byte for byte
                    content = proxy.fault.metrics(r.text).encode()
                self._send(r.status_code, content, r.headers.get("content-type", "text/plain"))

            def do_POST(self):
                proxy.sweep()
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                if self.path.split("?", 1)[0] in getattr(proxy.fault, "refused", ()):
                    self._send(404, b'{"detail":"Not Found"}', "application/json")
                    return
                if self.path not in COMPLETION_PATHS:
                    r = requests.post(proxy.upstream + self.path, data=raw, timeout=60,
                                      headers={"content-type": "application/json"})
                    if self.path.split("?", 1)[0] == "/reset_prefix_cache" and \
                            r.status_code == 200:
                        proxy.fault.prefix_cache_reset()
                    self._send(r.status_code, r.content, r.headers.get("content-type", ""))
                    return
                body = json.loads(raw)
                with proxy.lock:
                    proxy.count += 1
                    proxy.in_flight += 1
                    ctx = RequestCtx(proxy.count, body, proxy.in_flight, sock=self.connection)
                    ctx.twins_in_flight = sum(1 for o in proxy.active
                                              if o.body.get("prompt") == body.get("prompt"))
                    proxy.active.append(ctx)
                    proxy.log.append(ctx)
                try:
                    ctx.chat = self.path == COMPLETION_PATHS[1]
                    new = proxy.fault_for(ctx).request(ctx, body)
                    if new is not body:
                        raw = json.dumps(new).encode()
                    proxy.handle_completion(self, ctx, raw, self.path)
                finally:
                    proxy.finish(ctx)

            def _send(self, code, content, ctype):
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # listen backlog: 16+ requests arrive at once (determinism)

            def handle_error(self, request, client_address):  # clients hang up: not news
                pass

        self.server = Server((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def fault_for(self, ctx: RequestCtx) -> Fault:
        """The fault that sees ``ctx``: the proxy's, or none for a chat request when the fault
        does not handle chat (:attr:`Fault.chat`)."""
        return self.fault if not ctx.chat or self.fault.chat else _NO_FAULT

    def check_gone(self, ctx: RequestCtx) -> bool:
        """Whether the client of ``ctx`` has closed its connection (end of file waiting on it
        while its answer is not finished); the first time, :meth:`Fault.disconnected` is called
        and the client's number appended to ``disconnects``."""
        if ctx.client_gone or ctx.sock is None:
            return ctx.client_gone
        try:
            readable, _, _ = select.select([ctx.sock], [], [], 0)
            gone = bool(readable) and ctx.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) \
                == b""
        except (OSError, ValueError):  # reset by the peer, or closed here
            gone = True
        if gone:
            with self.lock:
                if ctx.client_gone:
                    return True
                ctx.client_gone = True
                self.disconnects.append(ctx.number)
            self.fault_for(ctx).disconnected(ctx)
        return gone

    def sweep(self) -> None:
        """Notice every client that has gone while its completion streams (before a new request
        is handled: a disconnect that happened before a request arrived is seen by it)."""
        with self.lock:
            active = list(self.active)
        for ctx in active:
            if ctx.streamed:
                self.check_gone(ctx)

    def finish(self, ctx: RequestCtx) -> None:
        """Stop counting ``ctx`` in flight (once). Called before the last bytes of its answer are
        written: a fast client sends its next request as soon as it has read them, and that request
        must not find this one still counted (it did, at C1, with the asyncio client)."""
        with self.lock:
            if not ctx.done:
                ctx.done = True
                self.in_flight -= 1
                self.active.remove(ctx)

    def handle_completion(self, h: BaseHTTPRequestHandler, ctx: RequestCtx, raw: bytes,
                          path: str = "/v1/completions") -> None:
        r = requests.post(self.upstream + path, data=raw, stream=True, timeout=300,
                          headers={"content-type": "application/json"})
        if r.status_code != 200:
            content = r.content
            self.finish(ctx)
            h._send(r.status_code, content, r.headers.get("content-type", ""))
            return
        if not ctx.streamed:
            data = self.fault_for(ctx).chunk(ctx, r.json())
            self.finish(ctx)
            h._send(200, json.dumps(data).encode(), "application/json")
            return
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()

        def write(data: bytes) -> None:
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        # a client that walks away mid-stream: the upstream request is closed at once, so the
        # engine sees the disconnect (also before the first chunk, e.g. during a long prefill)
        ended = threading.Event()

        def watch() -> None:
            while not ended.wait(0.02):
                if self.check_gone(ctx):
                    r.close()
                    return
        threading.Thread(target=watch, daemon=True, name="fault-proxy-watch").start()
        try:
            for line in r.iter_lines():
                if not line:
                    continue
                text = line.decode()
                if text.startswith("data:") and text[5:].strip() == "[DONE]":
                    self.finish(ctx)
                if text.startswith("data:") and text[5:].strip() != "[DONE]":
                    chunk = json.loads(text[5:])
                    n_ids = sum(len(c.get("token_ids") or []) for c in chunk.get("choices") or [])
                    out = self.fault_for(ctx).chunk(ctx, chunk)
                    ctx.tokens_so_far += n_ids
                    for piece in out if isinstance(out, list) else [] if out is None else [out]:
                        write(((piece if isinstance(piece, str) else "data: " + json.dumps(piece))
                               + "\n\n").encode())
                    continue
                write((text + "\n\n").encode())
            write(b"")
        except (OSError, ValueError, requests.RequestException, AttributeError):
            # the client went away (a broken pipe here, or the watcher closed the upstream)
            self.check_gone(ctx)
            r.close()
        finally:
            ended.set()

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


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
        self.proxy: "FaultProxy | None" = None
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
        self.proxy: "FaultProxy | None" = None
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
