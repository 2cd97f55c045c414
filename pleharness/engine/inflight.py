"""The client's requests in flight: its event loop (one daemon thread per client), the watchdog
that enforces the :class:`Timeouts` and cuts requests off (:meth:`InFlight.abort_all`), and
batches run with a fixed number in flight (:meth:`InFlight.run_batch`, :class:`Batch`).

:class:`InFlight` is a mixin of :class:`pleharness.engine.client.EngineClient`, which sets the
attributes it uses (``timeouts``, ``_lock``, ``_active``, ``_lt``, ``_monitor``).
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import aiohttp

from ..defaults import (DEFAULT_BETWEEN_TOKENS_TIMEOUT_S, DEFAULT_CONNECT_TIMEOUT_S,
                        DEFAULT_FIRST_TOKEN_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S)
from ..option import P_TIME, Opt
from .completion import Completion, ActiveRequest


@dataclass
class Timeouts:
    """Per-request timeouts in seconds.

    connect_s: TCP connect; first_token_s: from send to the first streamed token; between_tokens_s:
    the longest gap between two streamed chunks; total_s: the whole request. A non-streamed request
    delivers its tokens at the end, so first_token_s bounds its whole answer. Each is an option
    of the run commands (``--connect-timeout`` ... ``--request-timeout``).
    """

    connect_s: Annotated[float, Opt(name="connect_timeout", panel=P_TIME, min=0.1, max=86400,
                                    help="Seconds to connect.")] = DEFAULT_CONNECT_TIMEOUT_S
    first_token_s: Annotated[float, Opt(
        name="first_token_timeout", panel=P_TIME, min=0.1, max=86400,
        help="Seconds from sending a request to its first token.")] = \
        DEFAULT_FIRST_TOKEN_TIMEOUT_S
    between_tokens_s: Annotated[float, Opt(
        name="between_tokens_timeout", panel=P_TIME, min=0.1, max=86400,
        help="Longest gap between two streamed tokens, seconds.")] = \
        DEFAULT_BETWEEN_TOKENS_TIMEOUT_S
    total_s: Annotated[float, Opt(name="request_timeout", panel=P_TIME, min=0.1, max=604800,
                                  help="Longest whole request, seconds.")] = \
        DEFAULT_REQUEST_TIMEOUT_S


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


class LoopThread:
    """An event loop running in a daemon thread, with the aiohttp session made on it. Holds no
    reference to its client, so a client that is dropped without ``close()`` is finalized and
    its loop closed; the ones left are closed at exit (no "Unclosed client session" warnings)."""

    live: "set[LoopThread]" = set()

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.http: aiohttp.ClientSession | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="ple-client-loop")
        self.thread.start()
        LoopThread.live.add(self)

    def close(self) -> None:
        LoopThread.live.discard(self)
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
    for lt in list(LoopThread.live):
        lt.close()


class InFlight:
    """The event loop, the watchdog and the batches of an :class:`~.client.EngineClient`."""

    # -- event loop ------------------------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop (started on first use, in daemon thread ``ple-client-loop``)."""
        with self._lock:
            if self._lt is None:
                self._lt = LoopThread()
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

    # -- in-flight requests (on the loop) --------------------------------------------------------
    def _watch(self, a: ActiveRequest) -> None:
        with self._lock:
            self._active.add(a)
        if self._monitor is None:
            self._monitor = asyncio.get_running_loop().create_task(self._monitor_loop())

    def _unwatch(self, a: ActiveRequest) -> None:
        with self._lock:
            self._active.discard(a)

    def _cut(self, a: ActiveRequest, kind: str, detail: str) -> None:
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

    async def _watched(self, a: ActiveRequest, coro) -> None:
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
