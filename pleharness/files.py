"""The one permission rule for everything the harness writes (issue 37): folders 0700, files
0600, owner only. Run outputs hold prompts, engine logs with command lines and paths, and
answers; a shared GPU box has other users.

- :func:`private_dir`: create a folder (and its missing parents) 0700; an existing folder is
  left as it is (the user's ``results/`` or ``--json`` folder keeps its own mode).
- :func:`private_file`: open a file for writing, created 0600.
- :func:`write_private`: write a whole text file atomically (a temporary file in the same
  folder, then ``os.replace``), 0600.
- :func:`make_private`: set 0600 on a file a library wrote (a matplotlib image).
- :func:`cache_root`: the harness's per-user folder (built probe, engine registry).
- :func:`exclusive_lock`: one job at a time on a folder (two ``explain`` of one run).
- :func:`check_writable_folder`, :func:`check_json_path`, :func:`check_plot_path`,
  :func:`check_db_folder`: a path the user gave for the harness to write, checked before
  anything starts (usage errors naming the option).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` and its missing parents with mode 0700 (whatever the umask); return it.
    Raises OSError when it cannot be created."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(d, DIR_MODE)  # mkdir's mode is masked by the umask
    return path


def private_file(path: str | os.PathLike, mode: str = "w"):
    """Open ``path`` for writing (``mode`` "w", "a", "wb", "ab"), created 0600 (an existing
    file is set to 0600 too)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, mode)


def write_private(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a 0600 temporary file in the same folder, fsync,
    ``os.replace``): a reader sees the old file or the new one, never half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_private(path: str | os.PathLike) -> None:
    """Set 0600 on a file written by a library that does not take a mode."""
    os.chmod(path, FILE_MODE)


def cache_root() -> Path:
    """``$PLE_HARNESS_CACHE`` or ``~/.cache/ple-harness``: the harness's per-user folder (the
    built probe, the registry of launched engines)."""
    return Path(os.environ.get("PLE_HARNESS_CACHE") or Path.home() / ".cache" / "ple-harness")


class BusyError(Exception):
    """:func:`exclusive_lock`: another process holds the lock."""


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on ``path`` (created 0600) while the block
    runs; raises :class:`BusyError` at once when another process holds it. The lock goes with
    the process: a killed holder leaves no stale lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(str(path)) from None
        yield
    finally:
        os.close(fd)


def check_db_folder(db: str | None) -> None:
    """``fuzz --db``: a folder path (created when missing) where this user can write: checked
    now, before an engine starts (a path under a regular file, under /proc or in a read-only
    place would only fail once the search began); raises UsageError."""
    if db is None:
        return
    if not db.strip() or (Path(db).exists() and not Path(db).is_dir()):
        raise UsageError(f"--db {db!r}: expected a folder path (created when missing)")
    if (Path(db) / "manifest.json").is_file():
        raise UsageError(f"--db {db!r}: a run folder (it holds a manifest.json): the database "
                         "gets a folder of its own, e.g. --db ~/ple-db")
    try:
        p = Path(db).resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # a symlink loop: RuntimeError before Python 3.13
        raise UsageError(f"--db {db!r}: the path cannot be followed (a symlink loop?): "
                         f"{exc}") from None
    first = next((q for q in [p, *p.parents] if q.exists()), None)
    if first is None or not first.is_dir():
        raise UsageError(f"--db {db!r}: {first} is not a folder, so the database folder "
                         "cannot be created under it")
    if str(p).startswith(("/proc/", "/sys/")) or not os.access(first, os.W_OK | os.X_OK):
        raise UsageError(f"--db {db!r}: {first} is not writable, so the database folder "
                         "cannot be created there")


def check_plot_path(plot: str) -> Path:
    """``report --plot``: a PNG file path in an existing folder; raises UsageError."""
    p = Path(plot)
    if not plot.strip() or p.name in ("", ".", "..") or p.is_dir():
        raise UsageError(f"--plot {plot!r}: expected a PNG file path, e.g. --plot run.png")
    if not p.parent.is_dir():
        raise UsageError(f"--plot {plot!r}: folder {p.parent} does not exist")
    return p


def check_json_path(path: Path, flag: str = "--json") -> None:
    """A file path that can be written: not a folder, its folder not a file and writable.
    Checked before the job runs (usage error, exit 2)."""
    if str(path) in ("", ".") or path.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: is a folder; expected a file path, e.g. "
                         f"{flag} probe.json")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {str(path)!r}: {parent} is not a folder")
            break
    check_writable_folder(path.parent, flag, shown=str(path))


def check_writable_folder(folder: Path, flag: str, shown: str | None = None) -> None:
    """``folder`` (created when missing) can be written: its nearest existing ancestor is a
    writable folder (not on a read-only mount) and every name is UTF-8. Raises UsageError naming
    ``flag`` and ``shown`` (default: the folder), before anything starts."""
    shown = str(folder) if shown is None else shown
    try:
        str(folder).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{flag} {ascii(shown)}: holds bytes that are not UTF-8: use a UTF-8 "
                         "name") from None
    first = next((q for q in [Path(folder), *Path(folder).absolute().parents] if q.exists()),
                 None)
    if first is None or not first.is_dir():
        raise UsageError(f"{flag} {shown!r}: {first} is not a folder")
    if not os.access(first, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown!r}: {first} is not writable (read-only or not yours)")
