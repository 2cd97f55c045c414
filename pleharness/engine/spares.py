"""Engines started ahead of the replays that will use them (issue 49: fuzz to a confirmed
reproducer within 2 minutes on a GPU).

A reproducer is confirmed on freshly started engines, and on GPU run x (H100, warm compile cache)
fuzz spent 146 s to "reproduced 3/3": 37 s its engine, 16 s the search, 33 s the shrink, and a
wave of confirmation engines that only began to start once the shrink ended (~60 s, most of it
their start). An engine that has served no request is as fresh 40 s after its start as at once,
so :class:`SpareEngines` starts the replays' engines while the search runs, in background
threads, and each replay's engine session adopts one (:meth:`SpareEngines.take`, called by
:meth:`pleharness.engine.session.EngineSession.start`) instead of launching its own. A spare
whose launch does not equal the replay's (:class:`~pleharness.engine.launch.LaunchSpec`
equality: model, Python, arguments, environment, host, port, served name) is never taken; one
whose start failed is not taken either (the replay then launches its own and meets the same
error with its own log). Spares not taken are stopped when the pool closes (the job's exit
stack), as is a start still under way (its process group killed).

Who starts spares and when (the side-by-side plan lets the engine under test and the spares
run at once) is :func:`pleharness.pipeline.confirmation_spares`.
"""
from __future__ import annotations

import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from ..timeline import EngineStart
from .launch import (EngineServer, LaunchSpec, cancel_threads, check_cancelled, signal_group,
                     take_over)


class SpareEngines:
    """Engines of one launch spec each, started in the background; a context manager whose
    exit stops every spare not taken.

    ``specs``: one :class:`LaunchSpec` per spare; ``log_dir``: spare ``k`` logs to
    ``<log_dir>/spare-<k>/engine.log`` (and its launcher.log); ``start_timeout_s`` /
    ``api_key``: as :class:`EngineServer`'s. :meth:`start` launches them (each in its own
    thread); :meth:`take` hands one over; :attr:`starts` are the start records of the spares
    that became ready (:class:`~pleharness.timeline.EngineStart`, ``what`` ``spare-<k>``)."""

    def __init__(self, specs: list[LaunchSpec], log_dir: Path, *, start_timeout_s: float = 900.0,
                 api_key: str | None = None):
        self.specs = list(specs)
        self.log_dir = Path(log_dir)
        self.start_timeout_s = start_timeout_s
        self.api_key = api_key
        self.servers = [EngineServer(s, self.log_dir / f"spare-{k}", start_timeout_s,
                                     api_key=api_key) for k, s in enumerate(self.specs, 1)]
        self.starts: dict[int, EngineStart] = {}  # index -> its start, once ready
        self._futures: list[Future] = []
        self._taken: set[int] = set()
        self._idents: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> "SpareEngines":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "SpareEngines":
        """Launch every spare, each in a thread of its own; returns self at once."""
        if self._pool is None and self.servers:
            self._pool = ThreadPoolExecutor(max_workers=len(self.servers),
                                            thread_name_prefix="spare-engine")
            self._futures = [self._pool.submit(self._start_one, i)
                             for i in range(len(self.servers))]
        return self

    def _start_one(self, i: int) -> None:
        with self._lock:
            self._idents.add(threading.get_ident())
            if self._closed:  # closed before this thread began: launch nothing
                return
        srv = self.servers[i]
        srv.start()  # raises EngineError / Cancelled: the future keeps it; take() skips it
        self.starts[i] = EngineStart.measured(f"spare-{i + 1}", srv.ready_s, **srv.compile_cache)

    def _started(self, i: int) -> BaseException | None:
        """Wait for spare ``i``'s start to end: the exception it raised, None when it is up.
        Raises :class:`~pleharness.engine.launch.Cancelled` when the calling thread's
        side-by-side job was stopped meanwhile (and whatever a signal handler raises)."""
        while True:
            check_cancelled()
            try:
                return self._futures[i].exception(timeout=0.5)
            except FutureTimeout:
                continue

    def take(self, spec: LaunchSpec) -> tuple[EngineServer, EngineStart] | None:
        """A ready spare launched as ``spec``, no longer the pool's (the caller stops it), with
        its start record; waits for a spare of that spec still starting. None when no spare of
        ``spec`` is left or every one left failed to start (each stopped). The caller's thread
        becomes the server's owner (a side-by-side job cancelling that thread kills it:
        :func:`~pleharness.engine.launch.take_over`). Raises Cancelled or an interrupt while
        it waits; the spare then stays the pool's, stopped when it closes."""
        for i, srv in enumerate(self.servers):
            with self._lock:
                if self._closed or i in self._taken or srv.spec != spec or \
                        i >= len(self._futures):
                    continue
                self._taken.add(i)
            try:
                failed = self._started(i)
                if failed is not None or not srv.alive():  # failed, or died while it waited
                    srv.stop()  # idempotent: a start that failed after its launch leaves none
                    continue
                take_over(srv)
            except BaseException:
                with self._lock:  # the pool's again: close() stops it
                    self._taken.discard(i)
                raise
            return srv, self.starts[i]
        return None

    @property
    def waiting(self) -> int:
        """Spares not taken (started, starting or failed)."""
        return len(self.servers) - len(self._taken)

    def close(self) -> None:
        """Stop every spare not taken: a start under way is cancelled (its process group
        killed), a ready one stopped with its grace period; interrupted meanwhile, the rest are
        killed at once. Idempotent."""
        with self._lock:
            self._closed = True
            left = [i for i in range(len(self.servers)) if i not in self._taken]
            self._taken.update(left)
            pending = [i for i in left if i < len(self._futures) and not self._futures[i].done()]
            idents = set(self._idents)
        if pending:
            cancel_threads(idents)
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                cancel_threads(idents, undo=True)
            for i in left:
                self.servers[i].stop()
        except BaseException:
            for i in left:
                proc = self.servers[i].proc
                if proc is not None:
                    signal_group(proc.pid, signal.SIGKILL)
            raise


__all__ = ["SpareEngines"]
