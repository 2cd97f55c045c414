"""Environment facts for the probe result: host, date, driver and CUDA versions. Never raises."""
from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def host_name() -> str:
    try:
        return socket.gethostname()
    except Exception:
        return "unknown"


def host_detail() -> dict:

    return {"name": host_name(), "platform": platform.platform(), "machine": platform.machine(),
            "python": platform.python_version(), "executable": sys.executable,
            "cpu_count": os.cpu_count()}


def nvidia_driver_version() -> str | None:
    """The kernel driver's version string (e.g. ``580.159.04``): NVML, then
    ``/proc/driver/nvidia/version``, then ``nvidia-smi``; None if none answers."""
    try:
        import pynvml  # lazy: optional pynvml (nvidia-ml-py)

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=15)
            line = out.stdout.strip().splitlines()
            if out.returncode == 0 and line:
                return line[0].strip()
        except Exception:
            pass
    return None


def cuda_runtime_version() -> str | None:
    """``cudaRuntimeGetVersion`` of the libcudart this process has loaded (PyTorch's), as
    ``major.minor``; None when no libcudart is mapped."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "libcudart" in ln and "/" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            v = ctypes.c_int(0)
            if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value:
                return fmt_cuda_version(v.value)
        except Exception:
            continue
    return None


def fmt_cuda_version(v: int | None) -> str | None:
    """1000*major + 10*minor (CUDA's encoding) -> ``"major.minor"``."""
    if not v:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"
