"""Reading answers off the wire: the client's aiohttp connection pool, the POST of a completions
or chat request, the streamed (SSE) answer read event by event as it arrives (token arrival times
for TTFT and ITL) and the non-streamed answer read whole. Each part of an answer is taken into its
:class:`~.completion.Completion` by :mod:`.completion`.

:class:`Transport` is a mixin of :class:`pleharness.engine.client.EngineClient`, which sets the
attributes it uses (``base_url``, ``api_key``, ``timeouts``, ``_lt``, ``_proxy``).
"""
from __future__ import annotations

import time

import aiohttp

from . import prompt_logprobs as prompt_scores
from .completion import (CHAT_PATH, STREAM_DONE, STREAM_FAILED, ActiveRequest, Completion,
                         json_dumps, json_loads, record_failure, take_line, take_logprobs)


class Transport:
    """The connection pool and the reading of one completion's answer, for an
    :class:`~.client.EngineClient`."""

    # idle pooled connections are dropped after this many seconds: below uvicorn's (vLLM's API
    # server) default keep-alive timeout of 5 s, so the client never reuses a connection the server
    # is closing at that moment
    KEEPALIVE_S = 4.0

    def _session_async(self) -> aiohttp.ClientSession:
        lt = self._lt
        if lt.http is None or lt.http.closed:
            t = self.timeouts
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            lt.http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=self.KEEPALIVE_S),
                headers=headers,
                # the monitor enforces the token timeouts; the socket read timeout is the safety
                # net behind it
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s,
                                              sock_read=max(t.first_token_s,
                                                            t.between_tokens_s) * 1.5 + 1),
                json_serialize=json_dumps, trust_env=False)
        return lt.http

    async def _post(self, body: dict, out: Completion, path: str = "/v1/completions"
                    ) -> aiohttp.ClientResponse | None:
        """POST ``path`` (/v1/completions, or :data:`CHAT_PATH`; streamed or not); the response,
        or None with ``out`` failed.

        The monitor enforces the token timeouts (also while no response headers have arrived);
        the socket read timeout is the safety net behind it, for both delivery modes.
        """
        try:
            resp = await self._session_async().post(self.base_url + path, json=body,
                                                    proxy=self._proxy)
        except TimeoutError as exc:
            record_failure(out, "timeout", f"no response: {_text(exc)}")
            return None
        except (aiohttp.ClientError, OSError) as exc:
            record_failure(out, "connection", _text(exc, 300))
            return None
        out.http_status = resp.status
        return resp

    async def _stream(self, body: dict, out: Completion, a: ActiveRequest, on_token,
                      abandon_after: int | None = None, many: list | None = None,
                      path: str = "/v1/completions") -> None:
        """A streamed completion (SSE ``data:`` events, each read as it arrives): token IDs,
        TTFT and ITL (seconds, from ``a.t0``) into ``out``; ``abandon_after``: close the stream
        after that many tokens (0: before the first), the request recorded as ``abandoned``.
        ``many``: a batched prompt (:meth:`acomplete_many`): each choice goes to
        ``many[index]`` = (Completion, its ActiveRequest, its texts); ``out`` gets the failures and
        the final, summed usage. ``path``: :data:`CHAT_PATH` reads chat chunks
        (:func:`_from_chat`)."""
        out.started_at = time.time()
        resp = await self._post(body, out, path)
        chat = path == CHAT_PATH
        if resp is None:
            return
        ids_out = out.token_ids
        texts: list[str] = []
        try:
            if resp.status != 200:
                raw = await resp.read()
                return record_failure(out, "http", f"HTTP {resp.status}: "
                                      f"{raw[:300].decode('utf-8', errors='replace')}")
            if abandon_after == 0:  # the engine has the request; walk away before any token
                return _abandon(resp, out, "before the first token")
            done = False
            buf = b""
            content = resp.content
            while True:
                # one read per arrival (each SSE event arrives on its own from a real engine;
                # what arrives together has one arrival time)
                data = await content.readany()
                now = time.monotonic()
                if not data:
                    lines = [buf] if buf else []  # a last line without newline
                    buf = b""
                else:
                    if buf:
                        data = buf + data
                    lines = data.split(b"\n")
                    buf = lines.pop()
                for raw in lines:
                    got = take_line(raw, now, out, a, on_token, texts, many, chat)
                    if got is STREAM_FAILED:
                        return
                    if got is STREAM_DONE:
                        done = True  # read on to the end of the body so the connection is reused
                if abandon_after is not None and len(ids_out) >= abandon_after and not done \
                        and out.finish_reason is None:
                    return _abandon(resp, out, f"after {len(ids_out)} tokens")
                if not data:
                    break
            if not done:
                return record_failure(out, "protocol", f"stream ended without [DONE] after "
                                      f"{len(ids_out)} tokens")
        except TimeoutError as exc:
            return record_failure(out, "timeout", f"{exc.__class__.__name__} after "
                                  f"{len(ids_out)} tokens: {_text(exc)}")
        except (aiohttp.ClientError, OSError) as exc:
            kind = "timeout" if "timed out" in str(exc).lower() else "connection"
            return record_failure(out, kind, f"{exc.__class__.__name__} after "
                                  f"{len(ids_out)} tokens: {_text(exc)}")
        finally:
            out.text = "".join(texts)
            resp.release()  # back to the pool when the body was read to its end, else closed

    async def _plain(self, body: dict, out: Completion, a: ActiveRequest, on_token) -> None:
        """A non-streamed completion: one JSON body with choices[0] and usage."""
        out.started_at = time.time()
        # the monitor's first-token timeout covers the whole answer here (no token arrives
        # before the end)
        resp = await self._post(body, out)
        if resp is None:
            return
        try:
            got = await json_answer(resp, out)
            if got is None:
                return
            data, raw = got
            choice = data["choices"][0]
            if not isinstance(choice, dict):
                return record_failure(out, "protocol", f"response without choices: {raw[:200]!r}")
            usage = data.get("usage") or {}
            out.prompt_tokens = usage.get("prompt_tokens")
            out.completion_tokens = usage.get("completion_tokens")
            if choice.get("prompt_token_ids") is not None:
                out.prompt_token_ids = list(choice["prompt_token_ids"])
            ids = choice.get("token_ids")
            if ids is None:
                return record_failure(out, "protocol", "response without token_ids "
                                      f"(return_token_ids unsupported?): {raw[:200]!r}")
            out.token_ids = [int(i) for i in ids]
            a.tokens = len(out.token_ids)
            out.text = choice.get("text") or ""
            if out.chunks is not None:
                out.chunks.append((list(out.token_ids), out.text))
            take_logprobs(choice, out)
            prompt_scores.take_prompt_logprobs(choice, out)
            out.finish_reason = choice.get("finish_reason")
            if on_token is not None and out.token_ids:
                on_token(len(out.token_ids))
        finally:
            resp.release()


async def json_answer(resp: aiohttp.ClientResponse,
                      out: Completion) -> tuple[dict, bytes] | None:
    """A non-streamed answer read whole: (its JSON object, whose ``choices`` is a non-empty
    list; the raw body), or None after recording in ``out`` why not (HTTP status, a transport
    error or timeout while reading, malformed JSON, no choices). The caller releases ``resp``."""
    try:
        raw = await resp.read()
    except TimeoutError as exc:
        return record_failure(out, "timeout", f"{exc.__class__.__name__}: {_text(exc)}")
    except (aiohttp.ClientError, OSError) as exc:
        kind = "timeout" if "timed out" in str(exc).lower() else "connection"
        return record_failure(out, kind, f"{exc.__class__.__name__}: {_text(exc)}")
    if resp.status != 200:
        return record_failure(out, "http", f"HTTP {resp.status}: "
                              f"{raw[:300].decode('utf-8', errors='replace')}")
    try:
        data = json_loads(raw)
    except ValueError:
        return record_failure(out, "protocol", f"malformed JSON response: {raw[:200]!r}")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        return record_failure(out, "protocol", f"response without choices: {raw[:200]!r}")
    return data, raw


def _text(exc: BaseException, n: int = 200) -> str:
    """An exception's message, cut to ``n`` characters (its class name when the message is empty,
    as for aiohttp's timeouts)."""
    return (str(exc) or exc.__class__.__name__)[:n]


def _abandon(resp: aiohttp.ClientResponse, out: Completion, when: str) -> None:
    """Close ``resp``'s connection (the server sees the client disconnect) and record the request
    as ``abandoned`` by the client ``when`` (e.g. "after 4 tokens")."""
    resp.close()
    record_failure(out, "abandoned", f"client closed the stream {when} (a planned disconnect)")
