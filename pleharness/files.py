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
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

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
