"""Build and load the native half of the probe (``csrc/ple_probe.cpp``).

The extension is compiled with PyTorch's extension tooling (``torch.utils.cpp_extension.load``)
on first use and cached under ``$PLE_HARNESS_CACHE/probe-build`` (default
``~/.cache/ple-harness/probe-build``), one folder per (source, torch, Python, cuda.h) combination,
so a changed source or a different PyTorch never loads a stale module.

The build needs a C++ compiler, ninja and the CUDA toolkit's ``cuda.h`` (found through
``$CUDA_HOME``/``$CUDA_PATH``, PyTorch's ``CUDA_HOME``, ``nvcc`` on ``PATH``, or ``/usr/local/cuda``).
It does not link ``libcuda``: the module reaches the driver at run time (``dlopen`` +
``cuGetProcAddress``), so it builds on machines without a driver and reports the missing driver
when called. Every failure to build or load raises :class:`ProbeUnavailable` with a one-line reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from ..files import cache_root

SOURCE_NAME = "ple_probe.cpp"

_lock = threading.Lock()
_module: ModuleType | None = None
_build_info: dict = {}


class ProbeUnavailable(Exception):
    """The probe cannot run here (no GPU, no CUDA build of torch, no toolkit, build failure).

    ``str(exc)`` is a one-line reason suitable for ``result["reason"]``.
    """


def one_line(text: object, limit: int = 240) -> str:
    """First non-empty line of ``text``, stripped and cut to ``limit`` characters."""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "\u2026"
    return type(text).__name__ if isinstance(text, BaseException) else ""


def build_root() -> Path:
    """Folder under which each build of the extension gets its own subfolder."""
    return cache_root() / "probe-build"


def find_source() -> Path:
    """Path of ``ple_probe.cpp``: the repository's ``csrc/``, or a copy shipped inside the package
    (``pleharness/probe/csrc/``). Raises :class:`ProbeUnavailable` when neither exists."""
    here = Path(__file__).resolve().parent
    for cand in (here / "csrc" / SOURCE_NAME, here.parent.parent / "csrc" / SOURCE_NAME):
        if cand.is_file():
            return cand
    raise ProbeUnavailable(f"probe source {SOURCE_NAME} not found (expected in csrc/ of the repository)")


def find_cuda_include() -> Path | None:
    """Directory holding the CUDA toolkit's ``cuda.h``, or None."""
    homes: list[str | None] = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    try:
        # lazy: torch (optional): only the GPU probe needs it
        from torch.utils.cpp_extension import CUDA_HOME as torch_cuda_home  # None on CPU-only torch

        homes.append(torch_cuda_home)
    except Exception:  # pragma: no cover - torch missing or broken
        pass
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parent.parent))
    homes.append("/usr/local/cuda")
    # pip-installed toolkits (nvidia-cuda-runtime / cuda-toolkit wheels)
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            homes.extend(str(p.parent) for p in sorted(Path(entry, "nvidia").glob("*/include")))
    for home in homes:
        if not home:
            continue
        base = Path(home)
        cands = [base / "include"] + sorted(base.glob("targets/*/include"))
        for inc in cands:
            if (inc / "cuda.h").is_file():
                return inc
    return None


def toolkit_version(include: Path | None) -> str | None:
    """CUDA toolkit version next to ``include`` (``version.json`` or ``cuda.h``'s CUDA_VERSION)."""
    if include is None:
        return None
    for vj in (include.parent / "version.json", include.parent.parent.parent / "version.json"):
        try:

            return json.loads(vj.read_text())["cuda"]["version"]
        except Exception:
            pass
    try:
        m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (include / "cuda.h").read_text(errors="replace"))
        if m:
            v = int(m.group(1))
            return f"{v // 1000}.{(v % 1000) // 10}"
    except OSError:
        pass
    return None


def build_info() -> dict:
    """Where and how the loaded module was built (empty before :func:`load_extension` succeeds)."""
    return dict(_build_info)


def load_extension(verbose: bool = False) -> ModuleType:
    """Build (first use) and import the native module; cached per process.

    Returns the module (``HostBuffer``, ``DeferredRowGraph``, ``selftest``, ...). Raises
    :class:`ProbeUnavailable` when PyTorch's extension tooling, ninja, a compiler or ``cuda.h`` is
    missing or the build fails; the compiler's output is then kept in ``build-error.log`` in the
    build folder, named in the reason.
    """
    global _module
    with _lock:
        if _module is not None:
            return _module
        src = find_source()
        try:
            # lazy: torch (optional): only the GPU probe needs it
            import torch
            import torch.utils.cpp_extension as ce
        except Exception as exc:
            raise ProbeUnavailable(f"PyTorch extension tooling not importable: {one_line(exc)}") from exc
        include = find_cuda_include()
        if include is None:
            raise ProbeUnavailable("CUDA toolkit not found (no cuda.h under $CUDA_HOME, nvcc's folder or "
                                   "/usr/local/cuda); the probe's native part needs the toolkit headers")
        if not ce.is_ninja_available():
            raise ProbeUnavailable("ninja not found; torch.utils.cpp_extension needs it to build the probe")
        digest = hashlib.sha256()
        digest.update(src.read_bytes())
        digest.update((include / "cuda.h").read_bytes()[:65536])
        digest.update(f"{torch.__version__}|{sys.version_info[:3]}|{sys.executable}".encode())
        name = f"ple_probe_{digest.hexdigest()[:12]}"
        build_dir = build_root() / name
        build_dir.mkdir(parents=True, exist_ok=True)

        t0 = time.monotonic()
        try:
            mod = ce.load(name=name, sources=[str(src)], extra_include_paths=[str(include)],
                          extra_cflags=["-O2", "-Wall"], extra_ldflags=["-ldl"],
                          build_directory=str(build_dir), with_cuda=False, verbose=verbose)
        except Exception as exc:
            log = build_dir / "build-error.log"
            try:
                log.write_text(str(exc))
            except OSError:
                pass
            lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower()]
            detail = lines[0] if lines else one_line(exc)
            raise ProbeUnavailable(f"probe extension failed to build ({one_line(detail, 160)}); "
                                   f"log: {log}") from exc
        _build_info.update(name=name, build_dir=str(build_dir), source=str(src), cuda_include=str(include),
                           toolkit=toolkit_version(include), load_s=round(time.monotonic() - t0, 3))
        _module = mod
        return mod
