"""Engine doubles for fault injection (tests). The fault-injection proxy and its fault classes live
in the package (:mod:`pleharness.faults`, used by ``ple-harness selftest``) and are re-exported here
under their old names; the self-answering :class:`FakeEngine` (no model) and :class:`PromptRun`
stay here. Other topics' new doubles go in ``tests/faults_<topic>.py``, importing from this file.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pleharness.faults.proxy import FaultProxy  # noqa: F401
from pleharness.faults.rules import (Corrupt, CorruptConfident, CorruptInserted,  # noqa: F401
                                     CorruptWhenCrowded, Counted, EditTokens, Fault, FlipToken,
                                     RequestCtx, Reseed, SentinelLogprobs, StopAtBlock,
                                     TruncatePrompt, corrupt_if_selected, merge_chunks, set_top,
                                     top_first, top_of)
from pleharness.faults import builtin  # noqa: F401  (the selftest fault classes)


class PromptRun:
    """A FakeEngine ``behave`` keyed to a prompt and a phase, not to an arrival number (adding a
    request to a scenario must not silently move the fault): ``how`` for the ``run``-th request
    (1-based) of the ``prompt``-th distinct prompt (prompts numbered 0, 1, ... in order of first
    arrival), for each ``(prompt, run)`` in ``keys``.

    In the transitions schedule (a warm-up of W prompts, then every prompt's cold and warm
    single-request references one at a time, then the ladder), prompt W + i is the scenario's i-th
    prompt; its run 1 is the cold reference, run 2 the warm reference, run 3 its first load
    request, and for prompt W + 0 run 4 is the identical copy in flight with it in the first ladder
    phase at C >= 2. ``fired``: the arrival numbers it fired on."""

    def __init__(self, how: str, *keys: tuple[int, int]):
        self.how = how
        self.keys = set(keys)
        self.fired: list[int] = []
        self._lock = threading.Lock()
        self._index: dict[tuple, int] = {}
        self._runs: dict[tuple, int] = {}

    def __call__(self, n: int, body: dict) -> str | None:
        prompt = tuple(body["prompt"])
        with self._lock:
            idx = self._index.setdefault(prompt, len(self._index))
            self._runs[prompt] = run = self._runs.get(prompt, 0) + 1
            if (idx, run) in self.keys:
                self.fired.append(n)
                return self.how
        return None


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

    def __init__(self, behave=None, vocab: int = 600, token_s: float = 0.002):
        self.behave = behave or (lambda n, body: None)
        self.vocab = vocab
        self.token_s = token_s  # seconds between streamed tokens
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
                streaming = body.get("stream") is True  # OpenAI: false when omitted
                collected: list[dict] = []  # non-streamed: the chunks, merged into one answer
                if streaming:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                elif how == "malformed":
                    data = b'{"choices": [{"text": "x", "token_ids": [1'
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return

                def send(obj_or_text):
                    if not streaming:
                        if isinstance(obj_or_text, dict):
                            collected.append(obj_or_text)
                        return
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
                    time.sleep(eng.token_s)
                send({"choices": [], "usage": {"prompt_tokens": len(prompt),
                                               "completion_tokens": mt}})
                if not streaming:
                    return self._json(200, merge_chunks(collected))
                send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128  # listen backlog: 32 identical requests arrive at once

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
