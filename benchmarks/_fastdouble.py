"""A fast self-answering engine double for client benchmarks (asyncio, one process).

It answers the OpenAI-compatible endpoints the harness uses (/health, /v1/models, /version,
/metrics, streamed and non-streamed /v1/completions; /metrics reports the connections accepted and completion
requests served) as fast as it can: each completion is a pre-made, cached SSE
stream (vLLM's chunk layout: one HTTP chunk per SSE event, ``tokens_per_chunk`` token IDs per event,
a usage event, ``[DONE]``) written with one socket write, so the client is the bottleneck. Output
tokens are a deterministic function of the prompt (like tests/doubles.py FakeEngine), so a healthy
double passes the harness's parity comparison.

Run: ``python _fastdouble.py [--port 0] [--vocab 600]``; prints ``listening http://127.0.0.1:PORT``.
"""
from __future__ import annotations

import argparse
import asyncio
import json

MODEL = "fake-model"


def make_stream(prompt: list[int], max_tokens: int, vocab: int, per_chunk: int) -> bytes:
    base = sum(prompt) * 31
    toks = [(base + i * 7) % (vocab - 10) + 10 for i in range(max_tokens)]
    events = []
    created = 1764430000
    for start in range(0, max_tokens, per_chunk):
        ids = toks[start:start + per_chunk]
        last = start + per_chunk >= max_tokens
        choice = {"index": 0, "text": "".join(f" t{t}" for t in ids), "logprobs": None,
                  "finish_reason": "length" if last else None,
                  "stop_reason": None, "token_ids": ids,
                  "prompt_token_ids": list(prompt) if start == 0 else None}
        events.append({"id": "cmpl-0123456789abcdef0123456789abcdef", "object": "text_completion",
                       "created": created, "model": MODEL, "choices": [choice], "usage": None})
    events.append({"id": "cmpl-0123456789abcdef0123456789abcdef", "object": "text_completion",
                   "created": created, "model": MODEL, "choices": [],
                   "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + max_tokens,
                             "completion_tokens": max_tokens}})
    out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
           b"transfer-encoding: chunked\r\n\r\n"]
    for e in events + ["[DONE]"]:
        text = e if isinstance(e, str) else json.dumps(e, separators=(", ", ": "))
        data = f"data: {text}\n\n".encode()
        out.append(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def make_plain(prompt: list[int], max_tokens: int, vocab: int) -> bytes:
    """The non-streamed answer (``stream: false``): the same tokens in one JSON body."""
    base = sum(prompt) * 31
    toks = [(base + i * 7) % (vocab - 10) + 10 for i in range(max_tokens)]
    body = {"id": "cmpl-0123456789abcdef0123456789abcdef", "object": "text_completion",
            "created": 1764430000, "model": MODEL,
            "choices": [{"index": 0, "text": "".join(f" t{t}" for t in toks), "logprobs": None,
                         "finish_reason": "length", "stop_reason": None, "token_ids": toks,
                         "prompt_token_ids": list(prompt)}],
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + max_tokens,
                      "completion_tokens": max_tokens}}
    return plain(200, json.dumps(body).encode())


def plain(code: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(code, "OK")
    return (f"HTTP/1.1 {code} {reason}\r\ncontent-type: {ctype}\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def main(port: int, vocab: int, per_chunk: int) -> None:
    cache: dict[tuple, bytes] = {}
    models = plain(200, json.dumps({"object": "list", "data": [
        {"id": MODEL, "object": "model", "max_model_len": 4096, "root": None}]}).encode())

    stats = {"connections": 0, "completions": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stats["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                n = 0
                for ln in lines[1:]:
                    if ln[:15].lower() == "content-length:":
                        n = int(ln[15:].strip())
                body = await reader.readexactly(n) if n else b""
                if method == "GET":
                    if path == "/health":
                        writer.write(plain(200, b""))
                    elif path == "/v1/models":
                        writer.write(models)
                    elif path == "/version":
                        writer.write(plain(200, b'{"version": "fastdouble"}'))
                    elif path == "/metrics":
                        text = "".join(f"fastdouble_{k}_total {v}\n" for k, v in stats.items())
                        writer.write(plain(200, text.encode(), "text/plain"))
                    else:
                        writer.write(plain(404, b'{"error": "not found"}'))
                elif path == "/v1/completions":
                    stats["completions"] += 1
                    req = json.loads(body)
                    prompt = req.get("prompt") or []
                    stream = req.get("stream", True) is not False
                    key = (tuple(prompt), int(req.get("max_tokens") or 16), stream)
                    data = cache.get(key)
                    if data is None:
                        data = cache[key] = make_stream(prompt, key[1], vocab, per_chunk) \
                            if stream else make_plain(prompt, key[1], vocab)
                    writer.write(data)
                else:
                    writer.write(plain(404, b'{"error": "not found"}'))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print(f"listening http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=600)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    a = ap.parse_args()
    try:
        asyncio.run(main(a.port, a.vocab, a.tokens_per_chunk))
    except KeyboardInterrupt:
        pass
