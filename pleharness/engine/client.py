"""HTTP client for the engine's OpenAI-compatible API (asyncio + aiohttp for completions).

Completions are requested as token-ID prompts with ``return_token_ids`` so that outputs are compared
as token IDs, never as re-tokenized text. Streaming (SSE) is the default, so that TTFT can be
measured; ``stream=False`` asks for one JSON response (the same fields, all at once), so the two
delivery paths of the server can be compared with each other.

Completions run as coroutines on one asyncio event loop per client (in its own daemon thread) over
one aiohttp connection pool with keep-alive: C requests in flight cost C coroutines, not C threads
contending for the GIL (benchmarks/client_overhead.py, BENCHMARKS.md). A token's arrival time is
the monotonic clock when the socket read that carried its SSE event was handed to the parser.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import json
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import requests

try:  # orjson: JSON decoding of the SSE events went from 25 % to 7.5 % of the client's profile
    from orjson import dumps as _orjson_dumps, loads as _loads

    def _dumps(obj: Any) -> str:
        return _orjson_dumps(obj).decode()
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library works too
    from json import loads as _loads

    _dumps = json.dumps

from ..errors import EngineError
from . import prompt_logprobs as prompt_scores


@dataclass
class Timeouts:
    """Per-request timeouts in seconds.

    connect_s: TCP connect; first_token_s: from send to the first streamed token; between_tokens_s:
    the longest gap between two streamed chunks; total_s: the whole request. A non-streamed request
    delivers its tokens at the end, so first_token_s bounds its whole answer.
    """

    connect_s: float = 10.0
    first_token_s: float = 300.0
    between_tokens_s: float = 120.0
    total_s: float = 1800.0


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


class _Active:
    """One request in flight, watched by the client's monitor (on the client's event loop)."""

    __slots__ = ("t0", "last", "tokens", "task", "reason")

    def __init__(self):
        self.t0 = time.monotonic()
        self.last = self.t0
        self.tokens = 0
        self.task: asyncio.Task | None = None  # the request's task; cancelled to cut it off
        self.reason: tuple[str, str] | None = None  # (error kind, detail) when cut off


class Batch:
    """Items running on the client's event loop, exactly ``concurrency`` at a time (a new one
    starts when one finishes), made by :meth:`EngineClient.run_batch`.

    ``results[i]`` is item i's :class:`Completion` once it has finished, else None.
    """

    def __init__(self, n: int):
        self.results: list[Completion | None] = [None] * n
        self.future: concurrent.futures.Future | None = None  # of the whole batch
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None  # sync jobs only

    def wait(self) -> list[Completion]:
        """Block until every item has finished; the completions in item order.

        Re-raises an exception raised by a job; interruptible by signals (the caller then
        :meth:`cancel` s)."""
        self.future.result()
        return list(self.results)  # type: ignore[arg-type]

    def finished(self) -> list[tuple[int, Completion]]:
        """(index, completion) of the items finished so far, in item order."""
        return [(i, c) for i, c in enumerate(self.results) if c is not None]

    def cancel(self) -> None:
        """Start no further item and abandon the ones in flight (their results stay None)."""
        if self.future is not None:
            self.future.cancel()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class _LoopThread:
    """An event loop running in a daemon thread, with the aiohttp session made on it. Holds no
    reference to its client, so a client that is dropped without ``close()`` is finalized and
    its loop closed; the ones left are closed at exit (no "Unclosed client session" warnings)."""

    live: "set[_LoopThread]" = set()

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.http: aiohttp.ClientSession | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="ple-client-loop")
        self.thread.start()
        _LoopThread.live.add(self)

    def close(self) -> None:
        _LoopThread.live.discard(self)
        loop = self.loop
        if loop.is_closed() or not self.thread.is_alive():
            return
        if threading.current_thread() is self.thread:  # finalized on its own loop: stop it only
            loop.stop()
            return

        async def shut():
            # requests still in flight (an interrupted run) and the monitor end here, quietly
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            if self.http is not None and not self.http.closed:
                await self.http.close()
            self.http = None
        try:
            asyncio.run_coroutine_threadsafe(shut(), loop).result(timeout=10)
        except Exception:  # noqa: BLE001 - best effort
            pass
        loop.call_soon_threadsafe(loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            loop.close()


@atexit.register
def _close_all() -> None:
    for lt in list(_LoopThread.live):
        lt.close()


class EngineClient:
    """Client for one engine base URL.

    Completions run on one asyncio event loop per client (a daemon thread, started on first use)
    over one aiohttp connection pool with keep-alive, so requests in flight cost no thread each and
    do not contend for the GIL. :meth:`acomplete` is the implementation (a coroutine on that loop);
    :meth:`complete` is its blocking facade for plain threads, and :meth:`run_batch` runs many
    with a fixed number in flight. The other endpoints (health, models, tokenize...) are plain
    blocking ``requests`` calls, usable from any thread (the watchdog polls /health while a phase
    runs on the loop).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (no trailing /v1).
        model: model name as listed in /v1/models.
        api_key: sent as ``Authorization: Bearer`` when given.
        timeouts: see :class:`Timeouts`.
    """

    # idle pooled connections are dropped after this many seconds: below uvicorn's (vLLM's API
    # server) default keep-alive timeout of 5 s, so the client never reuses a connection the server
    # is closing at that moment
    KEEPALIVE_S = 4.0

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeouts: Timeouts | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeouts = timeouts or Timeouts()
        self._local = threading.local()
        self._active: set[_Active] = set()
        self._lock = threading.Lock()
        self._lt: _LoopThread | None = None
        self._monitor: asyncio.Task | None = None
        # proxies are resolved once (the environment is not scanned per request)
        scheme = self.base_url.split(":", 1)[0].lower()
        self._proxy = requests.utils.get_environ_proxies(self.base_url).get(scheme)

    # -- event loop ------------------------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop (started on first use, in daemon thread ``ple-client-loop``)."""
        with self._lock:
            if self._lt is None:
                self._lt = _LoopThread()
                weakref.finalize(self, self._lt.close)
            return self._lt.loop

    def _run(self, coro):
        """Run ``coro`` on the client's loop from a plain thread and wait for its result (the
        coroutine is cancelled when the waiting thread is interrupted)."""
        loop = self.loop
        if threading.current_thread() is self._lt.thread:
            coro.close()
            raise RuntimeError("EngineClient: blocking call on the client's own event loop "
                               "(await the async method instead)")
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def close(self) -> None:
        """Close the connection pool and stop the loop (a later request starts them again)."""
        with self._lock:
            lt, self._lt = self._lt, None
        if lt is not None:
            lt.close()

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
                json_serialize=_dumps, trust_env=False)
        return lt.http

    # -- in-flight requests (on the loop) --------------------------------------------------------
    def _watch(self, a: _Active) -> None:
        with self._lock:
            self._active.add(a)
        if self._monitor is None:
            self._monitor = asyncio.get_running_loop().create_task(self._monitor_loop())

    def _unwatch(self, a: _Active) -> None:
        with self._lock:
            self._active.discard(a)

    def _cut(self, a: _Active, kind: str, detail: str) -> None:
        """Cut request ``a`` off (on the loop): its error becomes (kind, detail)."""
        if a.reason is None and a in self._active:
            a.reason = (kind, detail)
            if a.task is not None:
                a.task.cancel()

    async def _monitor_loop(self) -> None:
        """Enforce first-token, between-token and total timeouts on every request in flight."""
        t = self.timeouts
        try:
            while True:
                await asyncio.sleep(0.2)
                now = time.monotonic()
                with self._lock:
                    active = list(self._active)
                if not active:
                    return
                for a in active:
                    if now - a.t0 > t.total_s:
                        self._cut(a, "timeout",
                                  f"total time over {t.total_s:g} s after {a.tokens} tokens")
                    elif a.tokens == 0 and now - a.t0 > t.first_token_s:
                        self._cut(a, "timeout", f"no token within {t.first_token_s:g} s")
                    elif a.tokens and now - a.last > t.between_tokens_s:
                        self._cut(a, "timeout", f"stalled: no token for {t.between_tokens_s:g} s "
                                                f"after {a.tokens} tokens")
        finally:
            self._monitor = None

    def abort_all(self, reason: str) -> int:
        """Cut off every request in flight (recorded as error ``aborted``); returns how many.

        Callable from any thread; the requests are cut on the loop right after."""
        with self._lock:
            active = list(self._active)
            loop = self._lt.loop if self._lt is not None else None
        if active and loop is not None:
            def cut():
                for a in active:
                    self._cut(a, "aborted", reason)
            try:
                loop.call_soon_threadsafe(cut)
            except RuntimeError:  # loop closed
                pass
        return len(active)

    @property
    def session(self) -> requests.Session:
        """A ``requests.Session`` of the calling thread, for the simple (non-completion) endpoints."""
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.proxies = requests.utils.get_environ_proxies(self.base_url)
            s.trust_env = False
            if self.api_key:
                s.headers["Authorization"] = f"Bearer {self.api_key}"
            self._local.session = s
        return s

    # -- simple endpoints ------------------------------------------------------------------------
    def health(self, timeout: float = 5.0) -> bool:
        try:
            return self.session.get(self.base_url + "/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def models(self) -> list[dict]:
        r = self.session.get(self.base_url + "/v1/models", timeout=10)
        r.raise_for_status()
        return r.json().get("data", [])

    def resolve_model(self) -> str:
        """Set and return ``self.model`` (the first listed model when none was given).

        Raises EngineError when the server is unreachable or lists no (matching) model;
        UsageError naming ``--api-key-env`` when it answers 401 / 403.
        """
        try:
            names = [m["id"] for m in self.models()]
        except requests.HTTPError as exc:
            code = exc.response.status_code if exc.response is not None else None
            if code in (401, 403):
                from ..errors import UsageError
                from ..redact import redact_url
                raise UsageError(
                    f"{redact_url(self.base_url)}/v1/models answered {code}: "
                    + ("the API key was refused: check the variable --api-key-env names"
                       if self.api_key else "the server needs an API key: pass --api-key-env "
                       "NAME, NAME an environment variable that holds it (never the key "
                       "itself on the command line)")) from None
            from ..redact import redact_url
            raise EngineError(redact_url(f"cannot list models at {self.base_url}/v1/models: "
                                         f"{exc}")) from None
        except (requests.RequestException, ValueError, KeyError) as exc:
            from ..redact import redact_url
            raise EngineError(redact_url(f"cannot list models at {self.base_url}/v1/models: "
                                         f"{exc}")) from None
        if not names:
            from ..redact import redact_url
            raise EngineError(redact_url(f"{self.base_url}/v1/models lists no model"))
        if self.model is None:
            self.model = names[0]
        elif self.model not in names:
            from ..errors import UsageError
            from ..redact import redact_url
            raise UsageError(f"--served-model-name {self.model!r}: not served at "
                             f"{redact_url(self.base_url)} (served: {', '.join(names)})")
        return self.model

    def model_card(self) -> dict:
        for m in self.models():
            if m.get("id") == self.model:
                return m
        return {}

    def version(self) -> str | None:
        try:
            r = self.session.get(self.base_url + "/version", timeout=5)
            return r.json().get("version") if r.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None

    def metrics_text(self) -> str | None:
        try:
            r = self.session.get(self.base_url + "/metrics", timeout=10)
            return r.text if r.status_code == 200 else None
        except requests.RequestException:
            return None

    def reset_prefix_cache(self, attempts: int = 20, wait_s: float = 0.5) -> str | None:
        """``POST /reset_prefix_cache``: empty the engine's prefix cache, so that the next
        requests run on a fresh cache. vLLM serves it only with ``VLLM_SERVER_DEV_MODE=1`` (set
        on the engines the harness launches on a loopback address) and answers ``{"success":
        false}`` while blocks are still held (e.g. by a request being aborted): then it is asked
        again, up to ``attempts`` times ``wait_s`` seconds apart. Returns None once the engine
        reset its cache, else why not (e.g. ``"/reset_prefix_cache answered 404: ..."``); never
        raises."""
        why = "not tried"
        for i in range(max(1, attempts)):
            try:
                r = self.session.post(self.base_url + "/reset_prefix_cache",
                                             timeout=30)
            except requests.RequestException as exc:
                return f"/reset_prefix_cache failed: {exc.__class__.__name__}: {exc}"[:300]
            if r.status_code != 200:
                return f"/reset_prefix_cache answered {r.status_code}: {r.text[:160]}"
            try:
                ok = r.json().get("success", True) is not False
            except (ValueError, AttributeError):
                ok = True  # an older vLLM answers 200 with no body
            if ok:
                return None
            why = (f"/reset_prefix_cache answered success=false {i + 1} times (blocks still "
                   "held)")
            time.sleep(wait_s)
        return why

    def _post_json(self, path: str, body: dict) -> Any:
        """POST ``body`` to ``path`` and return the decoded JSON answer. Raises EngineError when
        the engine answers other than 200, cuts the connection or sends a body that is not JSON
        (an engine fault, never a harness bug)."""
        try:
            r = self.session.post(self.base_url + path, json=body, timeout=30)
            if r.status_code != 200:
                raise EngineError(f"{path} answered {r.status_code}: {r.text[:200]}")
            return r.json()
        except (requests.RequestException, ValueError) as exc:
            raise EngineError(f"{path} failed: {exc.__class__.__name__}: {exc}") from exc

    def tokenize(self, **payload: Any) -> list[int]:
        """POST /tokenize (``prompt=...`` or ``messages=...``); returns the token IDs. Raises
        EngineError when the engine cannot answer (an answer without a ``tokens`` list too)."""
        got = self._post_json("/tokenize", {"model": self.model, **payload})
        toks = got.get("tokens") if isinstance(got, dict) else None
        if not isinstance(toks, list):
            raise EngineError(f"/tokenize failed: an answer without a tokens list: "
                              f"{str(got)[:160]}")
        return list(toks)

    def detokenize(self, ids: list[int]) -> str:
        """POST /detokenize; returns the text of ``ids``. Raises EngineError when the engine
        cannot answer."""
        return self._post_json("/detokenize", {"model": self.model, "tokens": ids})["prompt"]

    # -- completions -----------------------------------------------------------------------------
    def complete(self, prompt_ids: list[int], max_tokens: int, **kwargs: Any) -> Completion:
        """Blocking form of :meth:`acomplete` (same arguments), for plain threads; runs the
        request on the client's event loop. Never raises for request failures."""
        return self._run(self.acomplete(prompt_ids, max_tokens, **kwargs))

    async def acomplete(self, prompt_ids: list[int], max_tokens: int, *, temperature: float = 0.0,
                        ignore_eos: bool = True, logprobs: int | None = None,
                        seed: int | None = None, stream: bool = True, on_token=None,
                        stop: Sequence[str] | None = None, keep_chunks: bool = False,
                        extra: dict | None = None,
                        abandon_after_tokens: int | None = None) -> Completion:
        """One completion for a token-ID prompt; never raises for request failures. A coroutine
        to run on :attr:`loop` (the connection pool and the monitor live there).

        Args:
            prompt_ids: prompt as token IDs.
            max_tokens: maximum number of output tokens.
            temperature: 0 for greedy.
            seed: per-request sampling seed (vLLM: the same seed gives the same sample), or None.
            stream: stream the answer (SSE); False: one JSON response (no TTFT, ``on_token`` is
                called once at the end).
            ignore_eos: keep decoding past EOS (vLLM extension), so lengths are fixed.
            stop: stop strings (OpenAI ``stop``): the engine ends the output before the first
                one its text reaches (finish_reason "stop"), or None.
            keep_chunks: record the streamed deltas in ``Completion.chunks``.
            logprobs: number of top logprobs per position (OpenAI ``logprobs``), or None.
            on_token: callback ``f(n_tokens_so_far)`` after each token-carrying chunk (called on
                the client's loop thread: it must not block).
            extra: further request fields.
            abandon_after_tokens: disconnect like a client that walks away: close the stream
                once this many output tokens have arrived (0: as soon as the response headers
                arrive, before the first token, e.g. while a long prompt is in prefill). The
                Completion then has ``error`` ``abandoned`` and the tokens that arrived (a chunk
                carries whole speculative steps, so there may be a few more than asked). Only
                for streamed requests (ValueError otherwise); None: read to the end.

        Returns a :class:`Completion`; failures are reported in ``error`` / ``error_detail``.
        Raises CancelledError only when the caller's task is cancelled.
        """
        if abandon_after_tokens is not None and (not stream or abandon_after_tokens < 0):
            raise ValueError("abandon_after_tokens: a number >= 0, for streamed requests only")
        body = self._body(list(prompt_ids), max_tokens, temperature=temperature,
                          ignore_eos=ignore_eos, logprobs=logprobs, seed=seed, stream=stream,
                          stop=stop, extra=extra)
        out = Completion(logprobs=[] if logprobs is not None else None,
                         token_logprobs=[] if logprobs is not None else None, streamed=stream,
                         chunks=[] if keep_chunks else None)
        echo = prompt_scores.asks_echo(body)
        if echo:
            out.echo_ids = []
        a = _Active()
        await self._watched(a, self._stream(body, out, a, on_token, abandon_after_tokens)
                            if stream else self._plain(body, out, a, on_token))
        if a.reason is not None:  # cut off by the monitor (timeout) or by abort_all
            out.error, out.error_detail = a.reason
        if echo:
            prompt_scores.split_echo(out, len(prompt_ids))
        out.latency_s = time.monotonic() - a.t0
        return out

    def chat(self, messages: Sequence[dict], max_tokens: int, **kwargs: Any) -> Completion:
        """Blocking form of :meth:`achat` (same arguments). Never raises for request failures."""
        return self._run(self.achat(messages, max_tokens, **kwargs))

    async def achat(self, messages: Sequence[dict], max_tokens: int, *,
                    temperature: float = 0.0, ignore_eos: bool = True,
                    logprobs: int | None = None, seed: int | None = None, on_token=None,
                    extra: dict | None = None, stop: Sequence[str] | None = None,
                    keep_chunks: bool = False) -> Completion:
        """One streamed ``/v1/chat/completions`` request (issue 35 item 1): the server applies
        the model's chat template to ``messages`` (OpenAI ``[{"role", "content"}, ...]``).
        Token IDs come from vLLM's ``return_token_ids`` (the prompt's, as the template made
        them, in ``Completion.prompt_token_ids``; each chunk's output IDs in the choice), the
        logprobs from ``logprobs`` / ``top_logprobs`` with ``return_tokens_as_token_ids``, so
        the Completion has the same shape as :meth:`acomplete`'s and is judged the same way.
        ``text`` is the content of the deltas (reasoning or tool-call deltas are not text).
        ``stop`` (OpenAI stop strings) and ``keep_chunks`` as in :meth:`acomplete`.

        Returns a :class:`Completion`; failures are recorded in ``error`` / ``error_detail``
        (a server without ``return_token_ids`` for chat fails with ``protocol``). Raises
        CancelledError only when the caller's task is cancelled."""
        body: dict[str, Any] = {
            "model": self.model, "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens, "temperature": temperature,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
        if ignore_eos:  # omitted at vLLM's default (false), as clients write it
            body["ignore_eos"] = True
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = list(stop)
        if logprobs is not None:
            body.update(logprobs=True, top_logprobs=logprobs, return_tokens_as_token_ids=True)
        if extra:
            body.update(extra)
        out = Completion(logprobs=[] if logprobs is not None else None,
                         token_logprobs=[] if logprobs is not None else None, streamed=True,
                         chunks=[] if keep_chunks else None)
        a = _Active()
        await self._watched(a, self._stream(body, out, a, on_token, path=CHAT_PATH))
        if a.reason is not None:
            out.error, out.error_detail = a.reason
        out.latency_s = time.monotonic() - a.t0
        return out

    async def acomplete_many(self, prompts: Sequence[Sequence[int]], max_tokens: int, *,
                             temperature: float = 0.0, ignore_eos: bool = True,
                             logprobs: int | None = None, seed: int | None = None,
                             stop: Sequence[str] | None = None,
                             extra: dict | None = None) -> list[Completion]:
        """Several token-ID prompts in ONE streamed completions request (the OpenAI batched
        ``prompt``: a list of prompts), one :class:`Completion` per prompt, in order; never
        raises for request failures (a failed request fails every prompt's Completion).

        vLLM's API server hands the prompts of one request to the engine one after another
        without parsing another HTTP request in between (``merge_async_iterators`` in
        vllm/entrypoints/openai/completion/serving.py), so they are in flight together even on an
        overloaded host where separate requests arrive seconds apart. Choices are matched to
        prompts by ``index`` (n = 1: index = prompt position); ``stream_options.
        continuous_usage_stats`` makes every chunk carry its own prompt's usage. TTFT is per
        prompt from the one send; ``latency_s`` is the time its finish_reason arrived. The other
        arguments are :meth:`acomplete`'s, applied to every prompt.
        """
        body = self._body([list(p) for p in prompts], max_tokens, temperature=temperature,
                          ignore_eos=ignore_eos, logprobs=logprobs, seed=seed, stream=True,
                          stop=stop, extra=extra)
        body["stream_options"]["continuous_usage_stats"] = True
        agg = Completion(streamed=True)
        a = _Active()
        many = []
        for _ in prompts:
            part = _Active()
            part.t0 = a.t0
            many.append((Completion(logprobs=[] if logprobs is not None else None,
                                    token_logprobs=[] if logprobs is not None else None),
                         part, []))
        await self._watched(a, self._stream(body, agg, a, None, many=many))
        if a.reason is not None:
            agg.error, agg.error_detail = a.reason
        end = time.monotonic() - a.t0
        outs = []
        for out, part, texts in many:
            out.text = "".join(texts)
            out.started_at, out.http_status = agg.started_at, agg.http_status
            if agg.error is not None:
                out.error, out.error_detail = agg.error, agg.error_detail
            elif out.finish_reason is None:
                _fail(out, "protocol", f"the stream ended without a finish_reason for this "
                      f"prompt after {len(out.token_ids)} tokens")
            if out.latency_s is None:
                out.latency_s = end
            outs.append(out)
        return outs

    async def _watched(self, a: _Active, coro) -> None:
        """Run request ``coro`` as ``a``'s task, watched by the monitor (timeouts, abort_all):
        a cut-off request returns with ``a.reason`` set; CancelledError only when the caller's
        own task is cancelled (the request's task is cancelled with it)."""
        a.task = asyncio.get_running_loop().create_task(coro)
        self._watch(a)
        try:
            await a.task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if a.reason is None or (me is not None and me.cancelling()):
                a.task.cancel()  # the caller was cancelled (not only this request cut off)
                raise
        finally:
            self._unwatch(a)

    def _body(self, prompt: list, max_tokens: int, *, temperature: float, ignore_eos: bool,
              logprobs: int | None, seed: int | None, stream: bool,
              stop: Sequence[str] | None, extra: dict | None) -> dict[str, Any]:
        """The /v1/completions request body (see :meth:`acomplete` for the fields). Optional
        fields are left out at the API's default (``ignore_eos`` false, no seed, stop or
        logprobs), as clients write them, so engine state that only a request without the
        field inherits is reached too; ``temperature`` is always sent (a model's
        generation_config may change the server's default)."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "stream": stream, "return_token_ids": True,
        }
        if ignore_eos:  # omitted at vLLM's default (false), as clients write it (issue 35.7)
            body["ignore_eos"] = True
        if stream:
            body["stream_options"] = {"include_usage": True}
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = list(stop)
        if logprobs is not None:
            body["logprobs"] = logprobs
            body["return_tokens_as_token_ids"] = True  # top_logprobs keyed "token_id:N"
        if extra:
            body.update(extra)
        return body

    def run_batch(self, items: Sequence[Any], concurrency: int, job: Callable[[Any], Any],
                  on_done: Callable[[int], None] | None = None) -> Batch:
        """Start ``job(item)`` for every item, exactly ``concurrency`` in flight (a new one starts
        when one finishes, in item order); returns at once with a :class:`Batch`.

        ``job``: a coroutine function returning a :class:`Completion` (run on the client's loop,
        e.g. one calling :meth:`acomplete`), or a plain function (run in a pool of
        ``concurrency`` threads; it may block and call :meth:`complete`). ``on_done(i)`` is called
        on the loop after item i finished.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        batch = Batch(len(items))
        is_async = inspect.iscoroutinefunction(job)
        if not is_async:
            batch.pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency,
                                                               thread_name_prefix="ple-req")
        order = iter(range(len(items)))
        results = batch.results

        async def worker():
            loop = asyncio.get_running_loop()
            for i in order:
                if is_async:
                    c = await job(items[i])
                else:
                    c = await loop.run_in_executor(batch.pool, job, items[i])
                results[i] = c
                if on_done is not None:
                    on_done(i)

        async def run_all():
            try:
                await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
            finally:
                if batch.pool is not None:
                    batch.pool.shutdown(wait=False)

        batch.future = asyncio.run_coroutine_threadsafe(run_all(), self.loop)
        return batch

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
            _fail(out, "timeout", f"no response: {_text(exc)}")
            return None
        except (aiohttp.ClientError, OSError) as exc:
            _fail(out, "connection", _text(exc, 300))
            return None
        out.http_status = resp.status
        return resp

    async def _stream(self, body: dict, out: Completion, a: _Active, on_token,
                      abandon_after: int | None = None, many: list | None = None,
                      path: str = "/v1/completions") -> None:
        """A streamed completion (SSE ``data:`` events, each read as it arrives): token IDs,
        TTFT and ITL (seconds, from ``a.t0``) into ``out``; ``abandon_after``: close the stream
        after that many tokens (0: before the first), the request recorded as ``abandoned``.
        ``many``: a batched prompt (:meth:`acomplete_many`): each choice goes to
        ``many[index]`` = (Completion, its _Active, its texts); ``out`` gets the failures and
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
                return _fail(out, "http", f"HTTP {resp.status}: "
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
                    got = _take_line(raw, now, out, a, on_token, texts, many, chat)
                    if got is _STOP:
                        return
                    if got is _DONE:
                        done = True  # read on to the end of the body so the connection is reused
                if abandon_after is not None and len(ids_out) >= abandon_after and not done \
                        and out.finish_reason is None:
                    return _abandon(resp, out, f"after {len(ids_out)} tokens")
                if not data:
                    break
            if not done:
                return _fail(out, "protocol", f"stream ended without [DONE] after "
                             f"{len(ids_out)} tokens")
        except TimeoutError as exc:
            return _fail(out, "timeout", f"{exc.__class__.__name__} after {len(ids_out)} tokens: "
                         f"{_text(exc)}")
        except (aiohttp.ClientError, OSError) as exc:
            kind = "timeout" if "timed out" in str(exc).lower() else "connection"
            return _fail(out, kind, f"{exc.__class__.__name__} after {len(ids_out)} tokens: "
                         f"{_text(exc)}")
        finally:
            out.text = "".join(texts)
            resp.release()  # back to the pool when the body was read to its end, else closed

    async def _plain(self, body: dict, out: Completion, a: _Active, on_token) -> None:
        """A non-streamed completion: one JSON body with choices[0] and usage."""
        out.started_at = time.time()
        # the monitor's first-token timeout covers the whole answer here (no token arrives
        # before the end)
        resp = await self._post(body, out)
        if resp is None:
            return
        try:
            got = await _json_answer(resp, out)
            if got is None:
                return
            data, raw = got
            choice = data["choices"][0]
            if not isinstance(choice, dict):
                return _fail(out, "protocol", f"response without choices: {raw[:200]!r}")
            usage = data.get("usage") or {}
            out.prompt_tokens = usage.get("prompt_tokens")
            out.completion_tokens = usage.get("completion_tokens")
            if choice.get("prompt_token_ids") is not None:
                out.prompt_token_ids = list(choice["prompt_token_ids"])
            ids = choice.get("token_ids")
            if ids is None:
                return _fail(out, "protocol", "response without token_ids (return_token_ids "
                             f"unsupported?): {raw[:200]!r}")
            out.token_ids = [int(i) for i in ids]
            a.tokens = len(out.token_ids)
            out.text = choice.get("text") or ""
            if out.chunks is not None:
                out.chunks.append((list(out.token_ids), out.text))
            _take_logprobs(choice, out)
            prompt_scores.take_prompt_logprobs(choice, out)
            out.finish_reason = choice.get("finish_reason")
            if on_token is not None and out.token_ids:
                on_token(len(out.token_ids))
        finally:
            resp.release()


_DONE, _STOP = object(), object()  # _take_line: [DONE] seen / the request failed (recorded)
CHAT_PATH = "/v1/chat/completions"  # EngineClient.achat


def _take_line(raw: bytes, now: float, out: Completion, a: _Active, on_token,
               texts: list[str], many: list | None = None, chat: bool = False):
    """One SSE line of a streamed completion arrived at ``now`` (monotonic s) taken into
    ``out`` (usage, then each choice by :func:`_take_choice`; with ``many``, see
    :meth:`EngineClient._stream`). Returns ``_DONE`` for ``data: [DONE]``, ``_STOP`` when the
    line failed the request (recorded by :func:`_fail`), else None (also for a line that is not
    a ``data:`` event)."""
    if raw[:5] != b"data:":
        return None
    payload = raw[5:].strip()
    if payload == b"[DONE]":
        return _DONE
    try:
        chunk = _loads(payload)
    except ValueError:
        _fail(out, "protocol", f"malformed stream chunk after "
              f"{len(out.token_ids)} tokens: {_show(payload)}")
        return _STOP
    if type(chunk) is not dict:
        _fail(out, "protocol", f"unexpected stream chunk: {_show(payload)}")
        return _STOP
    if chat:
        chunk = _from_chat(chunk, out)
    choices = chunk.get("choices")
    if "error" in chunk and not choices:
        _fail(out, "http", f"error in stream: {str(chunk['error'])[:300]}")
        return _STOP
    usage = chunk.get("usage")
    if many is not None and choices:
        return _take_many(choices, usage, payload, now, out, a, many)
    if usage:
        out.prompt_tokens = usage.get("prompt_tokens")
        out.completion_tokens = usage.get("completion_tokens")
    for choice in choices or ():
        if _take_choice(choice, payload, now, out, a, on_token, texts):
            return _STOP
    return None


def _take_many(choices: list, usage: dict | None, payload: bytes, now: float, out: Completion,
               a: _Active, many: list):
    """The choices of one chunk of a batched-prompt stream, each taken into its prompt's
    Completion (``many[index]``) with the chunk's (continuous, per-prompt) usage; ``a`` (the
    one request the monitor watches) gets the arrival. Returns ``_STOP`` (``out`` failed) for a
    choice index outside the prompts, else None."""
    for choice in choices:
        i = choice.get("index") if isinstance(choice, dict) else None
        if type(i) is not int or not 0 <= i < len(many):
            _fail(out, "protocol", f"stream choice index {i!r} outside the {len(many)} "
                  f"prompts: {_show(payload)}")
            return _STOP
        o, part, texts = many[i]
        if _take_choice(choice, payload, now, o, part, None, texts):
            out.error, out.error_detail = o.error, o.error_detail
            return _STOP
        if usage and len(choices) == 1:
            o.prompt_tokens = usage.get("prompt_tokens")
            o.completion_tokens = usage.get("completion_tokens")
        if o.finish_reason is not None and o.latency_s is None:
            o.latency_s = now - part.t0
    a.last, a.tokens = now, sum(len(m[0].token_ids) for m in many)
    return None


def _take_choice(choice: dict, payload: bytes, now: float, out: Completion, a: _Active,
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
            _fail(out, "protocol", "stream chunk without token_ids (return_token_ids "
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
        _take_logprobs(choice, out)
    if choice.get("finish_reason") is not None:
        out.finish_reason = choice["finish_reason"]
    return False


async def _json_answer(resp: aiohttp.ClientResponse,
                       out: Completion) -> tuple[dict, bytes] | None:
    """A non-streamed answer read whole: (its JSON object, whose ``choices`` is a non-empty
    list; the raw body), or None after recording in ``out`` why not (HTTP status, a transport
    error or timeout while reading, malformed JSON, no choices). The caller releases ``resp``."""
    try:
        raw = await resp.read()
    except TimeoutError as exc:
        return _fail(out, "timeout", f"{exc.__class__.__name__}: {_text(exc)}")
    except (aiohttp.ClientError, OSError) as exc:
        kind = "timeout" if "timed out" in str(exc).lower() else "connection"
        return _fail(out, kind, f"{exc.__class__.__name__}: {_text(exc)}")
    if resp.status != 200:
        return _fail(out, "http", f"HTTP {resp.status}: "
                     f"{raw[:300].decode('utf-8', errors='replace')}")
    try:
        data = _loads(raw)
    except ValueError:
        return _fail(out, "protocol", f"malformed JSON response: {raw[:200]!r}")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        return _fail(out, "protocol", f"response without choices: {raw[:200]!r}")
    return data, raw


def _text(exc: BaseException, n: int = 200) -> str:
    """An exception's message, cut to ``n`` characters (its class name when the message is empty,
    as for aiohttp's timeouts)."""
    return (str(exc) or exc.__class__.__name__)[:n]


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


def _take_logprobs(choice: dict, out: Completion) -> None:
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


def _abandon(resp: aiohttp.ClientResponse, out: Completion, when: str) -> None:
    """Close ``resp``'s connection (the server sees the client disconnect) and record the request
    as ``abandoned`` by the client ``when`` (e.g. "after 4 tokens")."""
    resp.close()
    _fail(out, "abandoned", f"client closed the stream {when} (a planned disconnect)")


def _fail(out: Completion, kind: str, detail: str) -> None:
    out.error = kind
    out.error_detail = detail
