"""The engines the harness launched, findable after the harness is gone (issue 37).

Every launched engine gets a pid file in its run folder (``<log name>.pid``, JSON) and a copy in
the per-user registry (``<cache root>/engines/<process group>.json``, :func:`engine_registry`),
both removed once the engine's process group is gone (:meth:`EngineServer.stop
<pleharness.engine.launch.EngineServer.stop>`). The watchdog ends an engine within seconds of a
SIGKILL of its harness; when the watchdog is killed too (a SIGKILL of the harness's whole
process group, as CI runners send), the engine lives on, holding its port and (GPU) memory, and
the next job names it (:func:`leftover_engines`) before it launches its own.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..files import cache_root, private_dir, write_private


def register_engine(pid_path: Path, *, pid: int, watchdog: int | None, url: str,
                    command: list[str]) -> Path | None:
    """Write the pid file ``pid_path`` and the registry entry of an engine whose process group
    is ``pid``; returns the entry's path (None when the registry could not be written: best
    effort, only the naming is lost)."""
    rec = {"pid": pid, "process_group": pid, "watchdog": watchdog, "harness_pid": os.getpid(),
           "url": url, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
           "pid_file": str(Path(pid_path).resolve())}
    text = json.dumps(rec, indent=1) + "\n"
    try:
        write_private(pid_path, text)
        reg = engine_registry()
        private_dir(reg)
        entry = reg / f"{pid}.json"
        write_private(entry, text)
        return entry
    except OSError:
        return None


def unregister_engine(*paths: Path | None) -> None:
    """Remove an engine's pid file and registry entry (missing ones are fine)."""
    for path in paths:
        if path is not None:
            try:
                Path(path).unlink()
            except OSError:
                pass


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has any member (zombies included)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def engine_registry() -> Path:
    """The per-user registry of launched engines: ``<cache_root>/engines/<pgid>.json``, one per
    engine while it runs (:meth:`EngineServer._register`)."""
    return cache_root() / "engines"


def _group_has_live_member(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie (read from /proc; where
    there is no /proc: whether the group exists at all). A group id stays taken while any
    member lives, so a live member is one of the processes the engine's launch started."""
    if not group_alive(pgid):
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat")
    try:  # a zombie (exited, not reaped) is gone
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def leftover_engines(registry: Path | None = None) -> list[dict]:
    """Engines that outlived the harness that launched them (issue 37): registry entries
    (:func:`engine_registry`) whose harness process is gone while the engine's process group
    lives on (a member that is not a zombie: an engine core that outlived its API server counts).
    Entries whose engine is gone are removed. Each result is
    the entry (pid, process_group, url, started, command, pid_file: the run folder's copy).
    The watchdog (:func:`start_watchdog`) normally ends such engines within seconds; they are
    left when it was killed too (a SIGKILL of the harness's whole process group)."""
    reg = registry or engine_registry()
    found = []
    try:
        entries = sorted(reg.glob("*.json"))
    except OSError:
        return []
    for path in entries:
        try:
            rec = json.loads(path.read_text())
            pgid = int(rec["process_group"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _pid_alive(rec.get("harness_pid")):
            continue  # a live harness's own engine (this process's too)
        if not _group_has_live_member(pgid):
            try:  # the engine is gone: a stale entry
                path.unlink()
            except OSError:
                pass
            continue
        found.append(rec)
    return found


def leftover_text(rec: dict) -> str:
    """One line naming a leftover engine and how to stop it."""
    return (f"an engine left by an earlier ple-harness (gone, pid {rec.get('harness_pid')}) is "
            f"still running: process group {rec['process_group']}, {rec.get('url')}, started "
            f"{rec.get('started')} (its pid file: {rec.get('pid_file')}); it holds its port and "
            f"memory: stop it with `kill -- -{rec['process_group']}`")
