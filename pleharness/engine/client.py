"""HTTP client for the engine's OpenAI-compatible API (requests; one session per thread).

Completions are requested as token-ID prompts with ``return_token_ids`` so that outputs are compared
as token IDs, never as re-tokenized text. Streaming (SSE) is the default, so that TTFT can be
measured; ``stream=False`` asks for one JSON response (the same fields, all at once), so the two
delivery paths of the server can be compared with each other.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from ..errors import EngineError


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
        error: None on success, else one of ``http``, ``timeout``, ``connection``, ``protocol``.
        error_detail: short text (HTTP status and a body excerpt, or the exception).
        http_status: HTTP status code, when a response arrived.
        prompt_token_ids: the prompt as the engine saw it, when returned.
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


class _Active:
    """One request in flight, watched by the client's monitor thread."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.last = self.t0
        self.tokens = 0
        self.resp = None
        self.reason: tuple[str, str] | None = None  # (error kind, detail) when cut off


def _shutdown(resp) -> None:
    """Wake a thread blocked reading ``resp`` by shutting its socket down (close alone may not)."""
    for path in (("raw", "_connection", "sock"), ("raw", "_fp", "fp", "raw", "_sock")):
        obj = resp
        try:
            for name in path:
                obj = getattr(obj, name)
        except AttributeError:
            continue
        if isinstance(obj, socket.socket):
            try:
                obj.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return


class EngineClient:
    """Client for one engine base URL.

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
        self._active: set[_Active] = set()
        self._lock = threading.Lock()
        self._monitor: threading.Thread | None = None

    # -- in-flight requests ----------------------------------------------------------------------
    def _watch(self, a: _Active) -> None:
        with self._lock:
            self._active.add(a)
            if self._monitor is None or not self._monitor.is_alive():
                self._monitor = threading.Thread(target=self._monitor_loop, daemon=True,
                                                 name="ple-request-monitor")
                self._monitor.start()

    def _unwatch(self, a: _Active) -> None:
        with self._lock:
            self._active.discard(a)

    def _cut(self, a: _Active, kind: str, detail: str) -> None:
        if a.reason is None:
            a.reason = (kind, detail)
            if a.resp is not None:
                _shutdown(a.resp)

    def _monitor_loop(self) -> None:
        """Enforce first-token, between-token and total timeouts on every request in flight."""
        t = self.timeouts
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            with self._lock:
                active = list(self._active)
                if not active:
                    self._monitor = None
                    return
            for a in active:
                if now - a.t0 > t.total_s:
                    self._cut(a, "timeout", f"total time over {t.total_s:g} s after {a.tokens} tokens")
                elif a.tokens == 0 and now - a.t0 > t.first_token_s:
                    self._cut(a, "timeout", f"no token within {t.first_token_s:g} s")
                elif a.tokens and now - a.last > t.between_tokens_s:
                    self._cut(a, "timeout", f"stalled: no token for {t.between_tokens_s:g} s after "
                                            f"{a.tokens} tokens")

    def abort_all(self, reason: str) -> int:
        """Cut off every request in flight (recorded as error ``aborted``); returns how many."""
        with self._lock:
            active = list(self._active)
        for a in active:
            self._cut(a, "aborted", reason)
        return len(active)

    @property
    def session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            # Proxies are resolved once: with trust_env every request re-scans the environment
            # (about 10% of the client's CPU, benchmarks/client_overhead.py).
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

        Raises EngineError when the server is unreachable or lists no (matching) model.
        """
        try:
            names = [m["id"] for m in self.models()]
        except (requests.RequestException, ValueError, KeyError) as exc:
            raise EngineError(f"cannot list models at {self.base_url}/v1/models: {exc}") from None
        if not names:
            raise EngineError(f"{self.base_url}/v1/models lists no model")
        if self.model is None:
            self.model = names[0]
        elif self.model not in names:
            from ..errors import UsageError
            raise UsageError(f"--served-model-name {self.model!r}: not served at {self.base_url} "
                             f"(served: {', '.join(names)})")
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

    def tokenize(self, **payload: Any) -> list[int]:
        """POST /tokenize (``prompt=...`` or ``messages=...``); returns the token IDs."""
        body = {"model": self.model, **payload}
        r = self.session.post(self.base_url + "/tokenize", json=body, timeout=30)
        if r.status_code != 200:
            raise EngineError(f"/tokenize answered {r.status_code}: {r.text[:200]}")
        return list(r.json()["tokens"])

    def detokenize(self, ids: list[int]) -> str:
        r = self.session.post(self.base_url + "/detokenize", json={"model": self.model,
                                                                   "tokens": ids}, timeout=30)
        if r.status_code != 200:
            raise EngineError(f"/detokenize answered {r.status_code}: {r.text[:200]}")
        return r.json()["prompt"]

    # -- completions -----------------------------------------------------------------------------
    def complete(self, prompt_ids: list[int], max_tokens: int, *, temperature: float = 0.0,
                 ignore_eos: bool = True, logprobs: int | None = None, seed: int | None = None,
                 stream: bool = True, on_token=None, extra: dict | None = None) -> Completion:
        """One completion for a token-ID prompt; never raises for request failures.

        Args:
            prompt_ids: prompt as token IDs.
            max_tokens: maximum number of output tokens.
            temperature: 0 for greedy.
            seed: per-request sampling seed (vLLM: the same seed gives the same sample), or None.
            stream: stream the answer (SSE); False: one JSON response (no TTFT, ``on_token`` is
                called once at the end).
            ignore_eos: keep decoding past EOS (vLLM extension), so lengths are fixed.
            logprobs: number of top logprobs per position (OpenAI ``logprobs``), or None.
            on_token: callback ``f(n_tokens_so_far)`` after each token-carrying chunk.
            extra: further request fields.

        Returns a :class:`Completion`; failures are reported in ``error`` / ``error_detail``.
        """
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt_ids), "max_tokens": max_tokens,
            "temperature": temperature, "ignore_eos": ignore_eos, "stream": stream,
            "return_token_ids": True,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if seed is not None:
            body["seed"] = seed
        if logprobs is not None:
            body["logprobs"] = logprobs
            body["return_tokens_as_token_ids"] = True  # top_logprobs keyed "token_id:N"
        if extra:
            body.update(extra)
        out = Completion(logprobs=[] if logprobs is not None else None,
                         token_logprobs=[] if logprobs is not None else None, streamed=stream)
        a = _Active()
        self._watch(a)
        try:
            (self._stream if stream else self._plain)(body, out, a, on_token)
        finally:
            self._unwatch(a)
        if a.reason is not None:  # cut off by the monitor (timeout) or by abort_all
            out.error, out.error_detail = a.reason
        out.latency_s = time.monotonic() - a.t0
        return out

    def _stream(self, body: dict, out: Completion, a: _Active, on_token) -> None:
        t = self.timeouts
        t0 = a.t0
        out.started_at = time.time()
        last = t0
        resp = self._post(body, out, a)
        if resp is None:
            return
        try:
            if resp.status_code != 200:
                return _fail(out, "http", f"HTTP {resp.status_code}: {resp.text[:300]}")
            done = False
            for raw in resp.iter_lines():
                now = time.monotonic()
                if a.reason is not None:
                    break
                if not raw:
                    continue
                line = raw.decode("utf-8", errors="replace")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True  # read on to the end of the body so the connection is reused
                    continue
                try:
                    chunk = json.loads(data)
                except ValueError:
                    return _fail(out, "protocol", f"malformed stream chunk after "
                                 f"{len(out.token_ids)} tokens: {data[:200]}")
                if not isinstance(chunk, dict):
                    return _fail(out, "protocol", f"unexpected stream chunk: {data[:200]}")
                if "error" in chunk and not chunk.get("choices"):
                    return _fail(out, "http", f"error in stream: {str(chunk['error'])[:300]}")
                usage = chunk.get("usage")
                if usage:
                    out.prompt_tokens = usage.get("prompt_tokens")
                    out.completion_tokens = usage.get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    if choice.get("prompt_token_ids") is not None:
                        out.prompt_token_ids = list(choice["prompt_token_ids"])
                    ids = choice.get("token_ids")
                    text = choice.get("text") or ""
                    if ids is None:
                        if text or choice.get("finish_reason") is None:
                            return _fail(out, "protocol",
                                         "stream chunk without token_ids (return_token_ids "
                                         f"unsupported?): {data[:200]}")
                        ids = []
                    if ids:
                        if out.ttft_s is None:
                            out.ttft_s = now - t0
                        else:
                            out.itl_s.append(now - last)
                        last = now
                        a.last, a.tokens = now, a.tokens + len(ids)
                        out.token_ids.extend(int(i) for i in ids)
                        if on_token is not None:
                            on_token(len(out.token_ids))
                    out.text += text
                    _take_logprobs(choice, out)
                    if choice.get("finish_reason") is not None:
                        out.finish_reason = choice["finish_reason"]
            if a.reason is None and not done:
                return _fail(out, "protocol", f"stream ended without [DONE] after "
                             f"{len(out.token_ids)} tokens")
        except requests.exceptions.ConnectionError as exc:
            kind = "timeout" if "timed out" in str(exc).lower() else "connection"
            return _fail(out, kind, f"{exc.__class__.__name__} after {len(out.token_ids)} tokens: "
                         f"{str(exc)[:200]}")
        except requests.RequestException as exc:
            return _fail(out, "connection", f"{exc.__class__.__name__} after "
                         f"{len(out.token_ids)} tokens: {str(exc)[:200]}")
        finally:
            resp.close()


    def _post(self, body: dict, out: Completion, a: _Active) -> requests.Response | None:
        """POST /v1/completions (streamed or not); the response, or None with ``out`` failed.

        The monitor thread enforces the token timeouts; the socket read timeout is the safety
        net behind it, and the only limit while no response headers have arrived (the monitor
        cannot cut a request that has no response yet), for both delivery modes.
        """
        t = self.timeouts
        try:
            resp = self.session.post(self.base_url + "/v1/completions", json=body, stream=True,
                                     timeout=(t.connect_s,
                                              max(t.first_token_s, t.between_tokens_s) * 1.5 + 1))
        except requests.Timeout as exc:
            _fail(out, "timeout", f"no response: {str(exc)[:200]}")
            return None
        except requests.RequestException as exc:
            _fail(out, "connection", str(exc)[:300])
            return None
        a.resp = resp
        out.http_status = resp.status_code
        return resp

    def _plain(self, body: dict, out: Completion, a: _Active, on_token) -> None:
        """A non-streamed completion: one JSON body with choices[0] and usage."""
        out.started_at = time.time()
        # the monitor's first-token timeout covers the whole answer here (no token arrives
        # before the end)
        resp = self._post(body, out, a)
        if resp is None:
            return
        try:
            raw = resp.content
            if a.reason is not None:
                return
            if resp.status_code != 200:
                return _fail(out, "http", f"HTTP {resp.status_code}: "
                             f"{raw[:300].decode('utf-8', errors='replace')}")
            try:
                data = json.loads(raw)
            except ValueError:
                return _fail(out, "protocol", f"malformed JSON response: {raw[:200]!r}")
            choices = data.get("choices") if isinstance(data, dict) else None
            if not choices or not isinstance(choices[0], dict):
                return _fail(out, "protocol", f"response without choices: {raw[:200]!r}")
            choice = choices[0]
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
            _take_logprobs(choice, out)
            out.finish_reason = choice.get("finish_reason")
            if on_token is not None and out.token_ids:
                on_token(len(out.token_ids))
        except requests.exceptions.ConnectionError as exc:
            kind = "timeout" if "timed out" in str(exc).lower() else "connection"
            return _fail(out, kind, f"{exc.__class__.__name__}: {str(exc)[:200]}")
        except requests.RequestException as exc:
            return _fail(out, "connection", f"{exc.__class__.__name__}: {str(exc)[:200]}")
        finally:
            resp.close()


def _take_logprobs(choice: dict, out: Completion) -> None:
    """Append a choice's ``logprobs`` (top candidates and the emitted tokens' logprobs)."""
    lp = choice.get("logprobs")
    if not lp or out.logprobs is None:
        return
    tops = lp.get("top_logprobs") or []
    for top in tops:
        out.logprobs.append(_parse_top(top))
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


def _fail(out: Completion, kind: str, detail: str) -> None:
    out.error = kind
    out.error_detail = detail
