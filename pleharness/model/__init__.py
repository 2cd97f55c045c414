"""The embedded default model: built locally (no hub download) and cached.

:func:`ensure_embedded_model` returns the path of the cached model folder, building it first with
``build_tiny.py`` run by the engine's Python (which has torch, transformers and tokenizers) when the
cache holds no complete build. The cache key is a hash of the build script, so any change to the
model or its training rebuilds it. Cache root: ``$PLE_HARNESS_CACHE`` or ``~/.cache/ple-harness``.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..engine.errors import HarnessError

BUILD_SCRIPT = Path(__file__).with_name("build_tiny.py")
SERVED_NAME = "ple-tiny-llama"


def cache_root() -> Path:
    return Path(os.environ.get("PLE_HARNESS_CACHE") or Path.home() / ".cache" / "ple-harness")


def embedded_model_dir() -> Path:
    digest = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:12]
    return cache_root() / "models" / f"tiny-llama-{digest}"


def ensure_embedded_model(python: str | None = None, log=print) -> Path:
    """Path of the embedded model, building it (about 5 minutes on 2 cores) when not cached.

    Raises HarnessError when the build fails (its output's last lines are in the message).
    """
    target = embedded_model_dir()
    if (target / "ple_harness_model.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "ple_harness_model.json").is_file():
            return target
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"building the embedded model into {target} (one time, a few minutes) ...")
        r = subprocess.run([python or sys.executable, str(BUILD_SCRIPT), str(tmp)],
                           capture_output=True, text=True)
        (tmp.parent / (target.name + ".build.log")).write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
            raise HarnessError(f"building the embedded model failed (exit {r.returncode}):\n{tail}")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target
