"""A completion's answer: the :class:`Completion` it is read into, the per-request timing record
(:class:`ActiveRequest`, which the client's monitor watches too) and the reading of one answer's
parts into a Completion: an SSE line of a streamed completions or chat answer
(:func:`take_line`), its choices, logprobs, and a chat chunk in the completions chunk's shape
(:func:`_from_chat`).

What reads the answers off the wire is :mod:`.streaming`; the client that ties it together is
:class:`pleharness.engine.client.EngineClient`.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

try:  # orjson: JSON decoding of the SSE events went from 25 % to 7.5 % of the client's profile
    from orjson import dumps as _orjson_dumps, loads as json_loads  # lazy: optional orjson

    def json_dumps(obj: Any) -> str:
        """``obj`` as JSON text."""
        return _orjson_dumps(obj).decode()
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library works too
    from json import loads as json_loads  # lazy: optional orjson

    json_dumps = json.dumps

from . import prompt_logprobs as prompt_scores


@dataclass
class Completion:
    """Outcome of one completion request.

    Attributes:
        token_ids: output token IDs in order (possibly partial when ``error`` is set).
        text: concatenated output text (display only).
        finish_reason: as reported by the engine, or None.
        prompt_tokens / completion_tokens: from the usage block, or None when absent.
        ttft_s: seconds from sending to the first chunk carrying output tokens.
        latency_s: seconds from sending to the end of the response.
        itl_s: gaps between successive token-carrying chunks, seconds.
        logprobs: per output position, a dict {token_id: logprob} of the top candidates, when asked
            (in the engine's order).
        token_logprobs: per output position, the logprob of the emitted token (``token_logprobs``
            of the OpenAI completions API), when logprobs were asked.
        streamed: whether the response was streamed (SSE) or one JSON body.
        error: None on success, else one of ``http``, ``timeout``, ``connection``, ``protocol``,
            ``aborted`` (cut off by :meth:`EngineClient.abort_all`), or ``abandoned``: the client
            closed the stream on purpose (``abandon_after_tokens``: a client disconnect, not a
            failure of the engine; ``token_ids`` holds what arrived before it).
        error_detail: short text (HTTP status and a body excerpt, or the exception).
        http_status: HTTP status code, when a response arrived.
        prompt_token_ids: the prompt as the engine saw it, when returned.
        chunks: when asked (``keep_chunks``), the streamed choice deltas in arrival order, each
            ``(token_ids, text)`` (a delta with neither is left out); one entry holding every
            token for a non-streamed answer.
        prompt_logprobs / prompt_ranks / echo_ids: the prompt's scores, when asked (vLLM's
            ``prompt_logprobs``, or ``echo`` with ``logprobs``): see
            :mod:`pleharness.engine.prompt_logprobs` (None when not asked).
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    token_logprobs: list[float | None] | None = None
    streamed: bool = True
    top_logprobs_raw: list[Any] | None = None
    error: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    prompt_token_ids: list[int] | None = None
    started_at: float | None = None
    chunks: list[tuple[list[int], str]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_ranks: list[dict[int, int] | None] | None = None
    echo_ids: list[int] | None = None


class ActiveRequest:
    """One request in flight, watched by the client's monitor (on the client's event loop)."""

    __slots__ = ("t0", "last", "tokens", "task", "reason")

    def __init__(self):
        self.t0 = time.monotonic()
        self.last = self.t0
        self.tokens = 0
        self.task: asyncio.Task | None = None  # the request's task; cancelled to cut it off
        self.reason: tuple[str, str] | None = None  # (error kind, detail) when cut off


# take_line's answers: [DONE] seen / the request failed (recorded)
STREAM_DONE, STREAM_FAILED = object(), object()
CHAT_PATH = "/v1/chat/completions"  # EngineClient.achat


def take_line(raw: bytes, now: float, out: Completion, a: ActiveRequest, on_token,
              texts: list[str], many: list | None = None, chat: bool = False):
    """One SSE line of a streamed completion arrived at ``now`` (monotonic s) taken into
    ``out`` (usage, then each choice by :func:`_take_choice`; with ``many``, see
    :meth:`EngineClient._stream`). Returns ``STREAM_DONE`` for ``data: [DONE]``,
    ``STREAM_FAILED`` when the line failed the request (recorded by :func:`record_failure`), else
    None (also for a line that is not a ``data:`` event)."""
    if raw[:5] != b"data:":
        return None
    payload = raw[5:].strip()
    if payload == b"[DONE]":
        return STREAM_DONE
    try:
        chunk = json_loads(payload)
    except ValueError:
        record_failure(out, "protocol", f"malformed stream chunk after "
                       f"{len(out.token_ids)} tokens: {_show(payload)}")
        return STREAM_FAILED
    if type(chunk) is not dict:
        record_failure(out, "protocol", f"unexpected stream chunk: {_show(payload)}")
        return STREAM_FAILED
    if chat:
        chunk = _from_chat(chunk, out)
    choices = chunk.get("choices")
    if "error" in chunk and not choices:
        record_failure(out, "http", f"error in stream: {str(chunk['error'])[:300]}")
        return STREAM_FAILED
    usage = chunk.get("usage")
    if many is not None and choices:
        return _take_many(choices, usage, payload, now, out, a, many)
    if usage:
        out.prompt_tokens = usage.get("prompt_tokens")
        out.completion_tokens = usage.get("completion_tokens")
    for choice in choices or ():
        if _take_choice(choice, payload, now, out, a, on_token, texts):
            return STREAM_FAILED
    return None


def _take_many(choices: list, usage: dict | None, payload: bytes, now: float, out: Completion,
               a: ActiveRequest, many: list):
    """The choices of one chunk of a batched-prompt stream, each taken into its prompt's
    Completion (``many[index]``) with the chunk's (continuous, per-prompt) usage; ``a`` (the
    one request the monitor watches) gets the arrival. Returns ``STREAM_FAILED`` (``out`` failed)
    for a choice index outside the prompts, else None."""
    for choice in choices:
        i = choice.get("index") if isinstance(choice, dict) else None
        if type(i) is not int or not 0 <= i < len(many):
            record_failure(out, "protocol", f"stream choice index {i!r} outside the {len(many)} "
                           f"prompts: {_show(payload)}")
            return STREAM_FAILED
        o, part, texts = many[i]
        if _take_choice(choice, payload, now, o, part, None, texts):
            out.error, out.error_detail = o.error, o.error_detail
            return STREAM_FAILED
        if usage and len(choices) == 1:
            o.prompt_tokens = usage.get("prompt_tokens")
            o.completion_tokens = usage.get("completion_tokens")
        if o.finish_reason is not None and o.latency_s is None:
            o.latency_s = now - part.t0
    a.last, a.tokens = now, sum(len(m[0].token_ids) for m in many)
    return None


def _take_choice(choice: dict, payload: bytes, now: float, out: Completion, a: ActiveRequest,
                 on_token, texts: list[str]) -> bool:
    """One stream choice taken into ``out``: its token IDs (the first sets TTFT = ``now`` -
    ``a.t0``, each later one an ITL of ``now`` - ``a.last``, the previous arrival with tokens;
    ``on_token(total)`` called), text, chunk, logprobs and finish_reason. Returns True when it
    failed the request (a chunk without token_ids that is not a bare finish)."""
    if choice.get("prompt_token_ids") is not None:
        out.prompt_token_ids = list(choice["prompt_token_ids"])
    ids = choice.get("token_ids")
    text = choice.get("text") or ""
    if ids is None:
        if text or choice.get("finish_reason") is None:
            record_failure(out, "protocol", "stream chunk without token_ids (return_token_ids "
                           f"unsupported?): {_show(payload)}")
            return True
        ids = ()
    if ids:
        ids_out = out.token_ids
        if out.ttft_s is None:
            out.ttft_s = now - a.t0
        else:
            out.itl_s.append(now - a.last)
        ids_out.extend(map(int, ids))
        a.last, a.tokens = now, len(ids_out)
        if on_token is not None:
            on_token(len(ids_out))
    if text:
        texts.append(text)
    if out.chunks is not None and (ids or text):
        out.chunks.append(([int(i) for i in ids], text))
    if out.logprobs is not None:
        take_logprobs(choice, out)
    if choice.get("finish_reason") is not None:
        out.finish_reason = choice["finish_reason"]
    return False


def _show(payload: bytes) -> str:
    return payload[:200].decode("utf-8", errors="replace")


def _from_chat(chunk: dict, out: Completion) -> dict:
    """A ``/v1/chat/completions`` stream chunk in the completions chunk's shape: the chunk's
    ``prompt_token_ids`` (vLLM sends them with the first, role-only chunk) go to ``out``; each
    choice becomes ``{"text": delta content, "token_ids", "logprobs": {"tokens",
    "token_logprobs", "top_logprobs"}, "finish_reason"}``; a choice with neither token IDs nor a
    finish (the role chunk, an empty delta) is left out."""
    if chunk.get("prompt_token_ids") is not None:
        out.prompt_token_ids = list(chunk["prompt_token_ids"])
    choices = []
    for ch in chunk.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        ids, finish = ch.get("token_ids"), ch.get("finish_reason")
        delta = ch.get("delta") or {}
        if ids is None and finish is None:
            if delta.get("content"):  # text without IDs: return_token_ids not honoured
                choices.append({"index": ch.get("index", 0), "text": delta["content"]})
            continue
        new = {"index": ch.get("index", 0), "text": delta.get("content") or "",
               "token_ids": ids, "finish_reason": finish}
        content = (ch.get("logprobs") or {}).get("content")
        if content:
            new["logprobs"] = {
                "tokens": [e.get("token") for e in content],
                "token_logprobs": [e.get("logprob") for e in content],
                "top_logprobs": [{t.get("token"): t.get("logprob")
                                  for t in e.get("top_logprobs") or ()} for e in content]}
        choices.append(new)
    return {**{k: v for k, v in chunk.items() if k not in ("choices", "prompt_token_ids")},
            "choices": choices}


def take_logprobs(choice: dict, out: Completion) -> None:
    """Append a choice's ``logprobs`` (top candidates and the emitted tokens' logprobs)."""
    lp = choice.get("logprobs")
    if not lp or out.logprobs is None:
        return
    tops = lp.get("top_logprobs") or []
    for top in tops:
        out.logprobs.append(_parse_top(top))
    if out.echo_ids is not None:  # echo: the echoed prompt's IDs lead the tokens (split later)
        out.echo_ids.extend(prompt_scores.token_ids_of(lp.get("tokens") or ()))
    chosen = lp.get("token_logprobs")
    if out.token_logprobs is not None:
        if chosen is None:  # keep positions aligned with the top candidates
            chosen = [None] * len(tops)
        out.token_logprobs.extend(chosen)


def _parse_top(top: dict | None) -> dict[int, float]:
    """{token id: logprob} from a top_logprobs entry keyed ``token_id:N`` (return_tokens_as_token_ids)."""
    out = {}
    for k, v in (top or {}).items():
        if isinstance(k, str) and k.startswith("token_id:"):
            try:
                out[int(k[9:])] = v
                continue
            except ValueError:
                pass
        out[k] = v
    return out


def record_failure(out: Completion, kind: str, detail: str) -> None:
    """Record in ``out`` that the request failed: the error ``kind`` and its ``detail``."""
    out.error = kind
    out.error_detail = detail
