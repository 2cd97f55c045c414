"""Engine doubles for fault injection: small HTTP servers that forward to a real engine (or answer
themselves) and inject faults a healthy engine never produces.

``FaultProxy(upstream, fault)`` forwards every request to ``upstream``; for streamed
``/v1/completions`` it passes each SSE chunk through ``fault.chunk(ctx, chunk)``, which may modify
it. ``ctx`` tells the fault which completion request this is (1-based arrival order), the prompt,
and how many tokens were already streamed.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


@dataclass
class RequestCtx:
    number: int  # 1-based arrival order among completion requests
    body: dict
    in_flight: int  # completion requests in flight when this one arrived (itself included)
    tokens_so_far: int = 0
    state: dict = field(default_factory=dict)


class Fault:
    """Base fault: changes nothing."""

    def chunk(self, ctx: RequestCtx, chunk: dict) -> dict | None:
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

    def __init__(self, select, mutate, start: int = 0, stop: int | None = None):
        super().__init__()
        self.select = select
        self.mutate = mutate
        self.start = start
        self.stop = stop
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


class FaultProxy:
    """Forwarding HTTP server on 127.0.0.1 (a free port) with a fault hook; a context manager."""

    def __init__(self, upstream: str, fault: Fault | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        self.upstream = upstream.rstrip("/")
        self.fault = fault or Fault()
        self.lock = threading.Lock()
        self.count = 0
        self.in_flight = 0
        self.log: list[RequestCtx] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                r = requests.get(proxy.upstream + self.path, timeout=30)
                self._send(r.status_code, r.content, r.headers.get("content-type", "text/plain"))

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                if self.path != "/v1/completions":
                    r = requests.post(proxy.upstream + self.path, data=raw, timeout=60,
                                      headers={"content-type": "application/json"})
                    self._send(r.status_code, r.content, r.headers.get("content-type", ""))
                    return
                body = json.loads(raw)
                with proxy.lock:
                    proxy.count += 1
                    proxy.in_flight += 1
                    ctx = RequestCtx(proxy.count, body, proxy.in_flight)
                    proxy.log.append(ctx)
                try:
                    proxy.handle_completion(self, ctx, raw)
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1

            def _send(self, code, content, ctype):
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # clients hang up: not news
                pass

        self.server = Server((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def handle_completion(self, h: BaseHTTPRequestHandler, ctx: RequestCtx, raw: bytes) -> None:
        r = requests.post(self.upstream + "/v1/completions", data=raw, stream=True, timeout=300,
                          headers={"content-type": "application/json"})
        if r.status_code != 200:
            h._send(r.status_code, r.content, r.headers.get("content-type", ""))
            return
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()

        def write(data: bytes) -> None:
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        for line in r.iter_lines():
            if not line:
                continue
            text = line.decode()
            if text.startswith("data:") and text[5:].strip() != "[DONE]":
                chunk = json.loads(text[5:])
                n_ids = sum(len(c.get("token_ids") or []) for c in chunk.get("choices") or [])
                chunk = self.fault.chunk(ctx, chunk)
                ctx.tokens_so_far += n_ids
                if chunk is None:
                    continue
                text = "data: " + json.dumps(chunk)
            write((text + "\n\n").encode())
        write(b"")

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeEngine:
    """A self-answering OpenAI-compatible engine double (no model), for faults a real engine never
    produces. Outputs are a deterministic function of the prompt, so a healthy FakeEngine passes
    parity. ``behave(n, body) -> str | None`` picks a behaviour for the n-th completion request:

    - None: normal streaming;  "http500": a 500 JSON error;  "malformed": a broken JSON chunk;
    - "no_token_ids": chunks without token_ids;  "stall": 3 tokens, then silence;
    - "never": accept, read the request, never answer;  "die": the whole engine dies now
      (every open and later connection is cut, /health included);
    - "flip_tie": emit the runner-up token at position TIE_POS, where the top-1/top-2 logprob
      margin is tiny (0.01 nats); "flip_hard": the same at HARD_POS, where the margin is 4 nats.
    With ``logprobs`` requested, every position carries two candidates: the emitted token and
    token + 1.
    """

    TIE_POS, HARD_POS = 3, 5

    MODEL = "fake-model"

    def __init__(self, behave=None, vocab: int = 600):
        self.behave = behave or (lambda n, body: None)
        self.vocab = vocab
        self.count = 0
        self.lock = threading.Lock()
        self.dead = threading.Event()
        self.release = threading.Event()  # set on exit: stalled handlers end
        eng = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _cut(self):
                import socket as _s
                try:
                    self.connection.shutdown(_s.SHUT_RDWR)
                except OSError:
                    pass
                self.close_connection = True

            def _json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if eng.dead.is_set():
                    return self._cut()
                if self.path == "/health":
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                elif self.path == "/v1/models":
                    self._json(200, {"data": [{"id": eng.MODEL, "max_model_len": 4096}]})
                elif self.path == "/version":
                    self._json(200, {"version": "fake"})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                if eng.dead.is_set():
                    return self._cut()
                with eng.lock:
                    eng.count += 1
                    n = eng.count
                how = eng.behave(n, body)
                if how == "die":
                    eng.dead.set()
                    return self._cut()
                if how == "http500":
                    return self._json(500, {"error": {"message": "injected failure", "code": 500}})
                if how == "never":
                    eng.release.wait(120)
                    return self._cut()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

                def send(obj_or_text):
                    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
                    data = f"data: {text}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                prompt = body.get("prompt") or []
                mt = int(body.get("max_tokens") or 16)
                base = sum(prompt) * 31
                for i in range(mt):
                    if eng.dead.is_set():
                        return self._cut()
                    if how == "stall" and i == 3:
                        eng.release.wait(120)
                        return self._cut()
                    if how == "malformed" and i == 2:
                        send('{"choices": [{"text": "x", "token_ids": [1')
                        self.wfile.write(b"0\r\n\r\n")
                        return
                    tok = (base + i * 7) % (eng.vocab - 11) + 10
                    alt = tok + 1
                    margin = 0.01 if i == eng.TIE_POS else 4.0
                    if (how == "flip_tie" and i == eng.TIE_POS) or \
                            (how == "flip_hard" and i == eng.HARD_POS):
                        tok, alt = alt, tok
                    choice = {"index": 0, "text": f" t{tok}", "finish_reason":
                              "length" if i == mt - 1 else None}
                    if body.get("logprobs"):
                        choice["logprobs"] = {"top_logprobs": [
                            {f"token_id:{tok}": -0.05, f"token_id:{alt}": -0.05 - margin}]}
                    if how != "no_token_ids":
                        choice["token_ids"] = [tok]
                    send({"choices": [choice]})
                    time.sleep(0.002)
                send({"choices": [], "usage": {"prompt_tokens": len(prompt),
                                               "completion_tokens": mt}})
                send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeEngine":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
