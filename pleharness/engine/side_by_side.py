"""Engines of one job side by side on one machine (issue 33, ``--parallel-engines N|auto``).

A job's further engines (explain's suspect configurations, the fresh engines that confirm a
reproducer) used to wait for each other: an engine start is 35-220 s on an H200, while the small
models a maintainer validates with need under 1 GiB of its 139 GiB. Two engines started side by
side on one GPU failed in vLLM's memory profiling ("No available memory for the cache blocks";
"Error in memory profiling ... other processes sharing the same container release GPU memory"):
the profiler reads the device's free memory while the neighbour is allocating.

What makes a start immune to its neighbours (measured on vLLM 0.26.0, H200, run n of
docs/gpu-runs/; docs/gpu-runs/README.md): a fixed KV cache size, ``--kv-cache-memory-bytes``,
makes vLLM skip the memory profiling ("skipped memory profiling" in its log), and a
``--gpu-memory-utilization`` share small enough that each engine's start-up check (free memory
>= share x total) holds with the others running; four engines started at once all came up (75-79
s each). So :func:`plan` gives every engine of a side-by-side job both flags (unless the launch
sets them); on the CPU an engine's KV cache is ``VLLM_CPU_KVCACHE_SPACE`` GiB and the plan only
checks that N engines fit in the machine's available memory.

``auto``: on GPUs, as many as fit in the free memory of the fullest GPU (model weights x 1.1 +
KV cache + 3 GiB of CUDA context, CUDA graphs and activations per engine), at most
:data:`MAX_AUTO`; on the CPU 1 (a CPU engine uses every core it is given: two side by side halve
each other's speed and save nothing).
"""
from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import UsageError
from .launch import cancel_threads

GIB = 1024 ** 3
MAX_AUTO = 4
GPU_KV_BYTES = 4 * GIB  # the KV cache each side-by-side GPU engine gets unless the launch says
GPU_OVERHEAD_BYTES = 3 * GIB  # CUDA context, CUDA graphs, activations (per engine, measured)
CPU_OVERHEAD_BYTES = 2 * GIB  # a CPU engine process besides weights and KV cache (measured: 1.6)
CPU_KV_DEFAULT_GIB = 4.0  # vLLM's VLLM_CPU_KVCACHE_SPACE default when unset


@dataclass
class SideBySide:
    """How many engines of a job run at once and what each gets.

    ``n``: engines at once (>= 1); ``add``: engine arguments appended to each side-by-side launch
    (empty for n = 1: a single engine is launched exactly as configured); ``why``: how ``n`` was
    chosen, in words (shown on the console and recorded)."""

    n: int = 1
    add: list[str] = field(default_factory=list)
    why: str = "one engine at a time"

    def record(self) -> dict[str, Any]:
        """The manifest / explain.json entry."""
        return {"parallel_engines": self.n, "engine_args_added": list(self.add), "why": self.why}


def parse_parallel(value: str | int | None) -> int | None:
    """``--parallel-engines`` as given: an integer >= 1, or None for ``auto``. Raises UsageError
    for anything else."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    text = str(value).strip()
    # ASCII digits only: int() would also read '1_0' as 10 and other scripts' digits
    n = int(text) if text.isascii() and text.isdigit() else 0
    if n < 1:
        raise UsageError(f"--parallel-engines {value!r}: expected a whole number >= 1 or 'auto'")
    return n


def model_bytes(model_path: str | os.PathLike | None) -> int | None:
    """Bytes of the weight files (``*.safetensors``, ``*.bin``) of a local model folder; None for
    a hub name, an unreadable folder or one without weights (also the golden model's size:
    :func:`pleharness.golden.weights_bytes`)."""
    if not model_path:
        return None
    p = Path(model_path)
    if not p.is_dir():
        return None
    try:
        return sum(f.stat().st_size for f in p.iterdir()
                   if f.suffix in (".safetensors", ".bin") and f.is_file()) or None
    except OSError:
        return None


def mem_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where unreadable: not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _arg(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def plan(wanted: int | None, *, gpus: list[dict] | None, model: int | None,
         engine_args: Sequence[str], engine_env: dict[str, str],
         available: int | None = None) -> SideBySide:
    """The side-by-side plan for ``wanted`` engines at once (None: auto).

    ``gpus``: :func:`pleharness.environment.gpu_inventory` (None or []: a CPU engine);
    ``model``: weight bytes (:func:`model_bytes`, None unknown); ``engine_args`` /
    ``engine_env``: the launch's; ``available``: the CPU's available memory, bytes (default
    :func:`mem_available_bytes`). Raises UsageError when ``wanted`` engines do not fit (the
    message gives the arithmetic)."""
    if wanted == 1:
        return SideBySide()
    weights = model or 0
    if not gpus:
        kv = float(engine_env.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KV_DEFAULT_GIB) * GIB
        need = weights + kv + CPU_OVERHEAD_BYTES
        if wanted is None:
            return SideBySide(why="auto on the CPU: one engine at a time (a CPU engine uses "
                              "every core it is given)")
        have = available if available is not None else mem_available_bytes()
        if have is not None and wanted * need > have:
            raise UsageError(
                f"--parallel-engines {wanted}: {wanted} CPU engines need about "
                f"{wanted * need / GIB:.1f} GiB ({kv / GIB:.1f} GiB KV cache "
                f"(VLLM_CPU_KVCACHE_SPACE) + {weights / GIB:.1f} GiB weights + "
                f"{CPU_OVERHEAD_BYTES / GIB:.0f} GiB per engine), this machine has "
                f"{have / GIB:.1f} GiB available: use --parallel-engines "
                f"{max(1, int(have // need))} or a smaller VLLM_CPU_KVCACHE_SPACE")
        return SideBySide(wanted, [], f"{wanted} CPU engines side by side (about "
                          f"{need / GIB:.1f} GiB each)")
    given_kv = _arg(engine_args, "--kv-cache-memory-bytes")
    kv = int(float(given_kv)) if given_kv else GPU_KV_BYTES
    need = int(weights * 1.1) + kv + GPU_OVERHEAD_BYTES
    free = min((g["memory_total_mib"] - g["memory_used_mib"]) * 2 ** 20 for g in gpus)
    total = min(g["memory_total_mib"] for g in gpus) * 2 ** 20
    fit = int(free // need)
    what = (f"{need / GIB:.1f} GiB each ({weights * 1.1 / GIB:.1f} GiB weights + "
            f"{kv / GIB:.1f} GiB KV cache + {GPU_OVERHEAD_BYTES / GIB:.0f} GiB), "
            f"{free / GIB:.0f} GiB free")
    if wanted is None:
        n = max(1, min(MAX_AUTO, fit))
        if n == 1:
            return SideBySide(why=f"auto: one engine at a time ({what})")
    else:
        if wanted > fit:
            raise UsageError(f"--parallel-engines {wanted}: {wanted} engines do not fit on the "
                             f"GPU: {what}; at most {max(fit, 1)} fit")
        n = wanted
    add: list[str] = []
    if not given_kv:
        add.append(f"--kv-cache-memory-bytes={kv}")
    if _arg(engine_args, "--gpu-memory-utilization") is None:
        # vLLM 0.26 reads the share only in its start-up check (free >= share x total) once
        # the KV cache size is fixed: the smallest share that covers one engine passes it with
        # the others running
        share = min(0.9, max(0.02, math.ceil(100 * need / total) / 100 + 0.01))
        add.append(f"--gpu-memory-utilization={share:.2f}")
    return SideBySide(n, add, f"{n} engines side by side ({what}); each with "
                      + " ".join(add or ["the launch's own KV cache size"]))


T = TypeVar("T")
_lock = threading.Lock()


def run_side_by_side(jobs: Sequence[Callable[[], T]], n: int,
                     on_done: Callable[[int, T | BaseException], Any] | None = None
                     ) -> list[T | BaseException]:
    """Run ``jobs`` (callables that start and stop their own engines) up to ``n`` at a time, in
    worker threads; return their results in order (an exception a job raised is its result).
    ``on_done(index, result)`` runs in the calling thread as each one ends (e.g. to save
    progress). With ``n`` = 1 the jobs run one after another in the calling thread.

    When the calling thread is interrupted (a signal handler raising, e.g.
    :class:`~pleharness.engine.session.Interrupted`): the workers are cancelled (an engine not
    yet launched is not launched; every engine a worker has running is killed with its process
    group, :func:`pleharness.engine.launch.cancel_threads`), the workers are waited for, and
    the exception is raised again."""
    results: list[Any] = [None] * len(jobs)
    if n <= 1:
        for i, job in enumerate(jobs):
            try:
                results[i] = job()
            except Exception as exc:  # noqa: BLE001  (the job's result)
                results[i] = exc
            if on_done:
                on_done(i, results[i])
        return results
    idents: set[int] = set()

    def wrap(i: int, job: Callable[[], T]) -> tuple[int, Any]:
        with _lock:
            idents.add(threading.get_ident())
        try:
            return i, job()
        except Exception as exc:  # noqa: BLE001
            return i, exc

    ex = ThreadPoolExecutor(max_workers=n, thread_name_prefix="side-by-side")
    futs: list = []
    try:
        futs = [ex.submit(wrap, i, job) for i, job in enumerate(jobs)]
        for f in as_completed(futs):
            i, res = f.result()
            results[i] = res
            if on_done:
                on_done(i, res)
    except BaseException:
        for f in futs:
            f.cancel()
        cancel_threads(idents)
        ex.shutdown(wait=True)
        cancel_threads(idents, undo=True)
        raise
    ex.shutdown(wait=True)
    return results
