"""HTTP client for the engine's OpenAI-compatible API (asyncio + aiohttp for completions).

Completions are requested as token-ID prompts with ``return_token_ids`` so that outputs are compared
as token IDs, never as re-tokenized text. Streaming (SSE) is the default, so that TTFT can be
measured; ``stream=False`` asks for one JSON response (the same fields, all at once), so the two
delivery paths of the server can be compared with each other.

Completions run as coroutines on one asyncio event loop per client (in its own daemon thread) over
one aiohttp connection pool with keep-alive: C requests in flight cost C coroutines, not C threads
contending for the GIL (benchmarks/client_overhead.py, BENCHMARKS.md). A token's arrival time is
the monotonic clock when the socket read that carried its SSE event was handed to the parser.

The room: this module is its face (:class:`EngineClient`: the endpoints, the completion and chat
requests and their bodies); :mod:`.completion` holds the :class:`~.completion.Completion` shape and
reads an answer's parts into it, :mod:`.streaming` reads answers off the wire (connection pool,
SSE), :mod:`.inflight` runs the event loop, the watchdog (:class:`~.inflight.Timeouts`,
``abort_all``) and batches.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import requests

from ..errors import EngineError, UsageError
from ..redact import redact_url
from . import prompt_logprobs as prompt_scores
from .completion import CHAT_PATH, ActiveRequest, Completion, record_failure
from .inflight import InFlight, LoopThread, Timeouts
from .streaming import Transport


class EngineClient(InFlight, Transport):
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

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeouts: Timeouts | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeouts = timeouts or Timeouts()
        self._local = threading.local()
        self._active: set[ActiveRequest] = set()
        self._lock = threading.Lock()
        self._lt: LoopThread | None = None
        self._monitor: asyncio.Task | None = None
        # proxies are resolved once (the environment is not scanned per request)
        scheme = self.base_url.split(":", 1)[0].lower()
        self._proxy = requests.utils.get_environ_proxies(self.base_url).get(scheme)

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
                raise UsageError(
                    f"{redact_url(self.base_url)}/v1/models answered {code}: "
                    + ("the API key was refused: check the variable --api-key-env names"
                       if self.api_key else "the server needs an API key: pass --api-key-env "
                       "NAME, NAME an environment variable that holds it (never the key "
                       "itself on the command line)")) from None
            raise EngineError(redact_url(f"cannot list models at {self.base_url}/v1/models: "
                                         f"{exc}")) from None
        except (requests.RequestException, ValueError, KeyError) as exc:
            raise EngineError(redact_url(f"cannot list models at {self.base_url}/v1/models: "
                                         f"{exc}")) from None
        if not names:
            raise EngineError(redact_url(f"{self.base_url}/v1/models lists no model"))
        if self.model is None:
            self.model = names[0]
        elif self.model not in names:
            raise UsageError(f"--served-model-name {self.model!r}: not served at "
                             f"{redact_url(self.base_url)} (served: {', '.join(names)})")
        return self.model

    def adapters(self) -> list[str]:
        """The LoRA adapters the server serves beside its base model (issue 52): the ids of the
        /v1/models entries whose ``parent`` names another model (vLLM lists each
        ``--lora-modules NAME=PATH`` so, ``parent`` = the base model), in the order listed;
        empty when there are none or /v1/models does not answer. Never raises."""
        try:
            cards = self.models()
        except (requests.RequestException, ValueError):
            return []
        return [str(m["id"]) for m in cards if isinstance(m, dict) and m.get("id")
                and m.get("parent") and m.get("parent") != m.get("id")]

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
        a = ActiveRequest()
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
        a = ActiveRequest()
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
        a = ActiveRequest()
        many = []
        for _ in prompts:
            part = ActiveRequest()
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
                record_failure(out, "protocol", "the stream ended without a finish_reason for "
                               f"this prompt after {len(out.token_ids)} tokens")
            if out.latency_s is None:
                out.latency_s = end
            outs.append(out)
        return outs

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
