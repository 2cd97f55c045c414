"""The fault-injection proxy: an HTTP server that forwards to a real engine and injects faults a
healthy engine never produces (used by ``ple-harness selftest`` and by the tests); the fault
rules it applies (:class:`~pleharness.faults.rules.Fault`,
:class:`~pleharness.faults.rules.RequestCtx` and the fault classes the tests plant) are in
:mod:`pleharness.faults.rules`.

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from .rules import Fault, RequestCtx

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")  # requests a fault sees


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
                path = self.path.split("?", 1)[0]
                if path == "/metrics" and r.status_code == 200 and \
                        type(proxy.fault).metrics is not Fault.metrics:  # else byte for byte
                    content = proxy.fault.metrics(r.text).encode()
                if path == "/server_info" and r.status_code == 200 and \
                        type(proxy.fault).server_info is not Fault.server_info:
                    content = json.dumps(proxy.fault.server_info(r.json())).encode()
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
