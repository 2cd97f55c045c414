"""Pre-flight probe for deferred PLE-row loading inside single-token FULL CUDA graphs.

An engine that offloads per-layer-embedding (PLE) tables to host memory can defer loading a
token's rows inside a captured graph::

    WAIT(flag == 1)  ->  WRITE(flag = 0)  ->  H2D copy(row -> staging)

The graph blocks on a host-visible 32-bit flag until a host thread has gathered the row into
pinned memory and set the flag; the graph then resets the flag and copies the row into a stable
device staging buffer. This needs the CUDA driver's stream memory operations on the device *and*
inside graph capture; where they are missing the engine must fall back to a synchronous path, and
a captured WAIT that is never signalled hangs its stream forever. This probe answers, before an
engine is started, whether the deferred path works here and what it costs.

Public API (the rest of the package is private):

* :func:`run_probe` — capability, graph self-test with a stranding guard, timings. The JSON of
  ``ple-harness probe``.
* :func:`capability_summary` — capability only (no self-test, no timings): for the stress
  manifest's environment section.
* :func:`render` — the result as rich tables.

Sources (CUDA driver API reference):

* cuStreamWaitValue32 / cuStreamWriteValue32 and the 64-bit forms, the device attributes that gate
  them (``CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`` = 122,
  ``CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR`` = 123; the deprecated ``*_V1`` IDs 92-94),
  and the warning that ordering through them is invisible to CUDA and can deadlock:
  https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEMOP.html
* V1 vs V2 memops (V1 needed the ``NVreg_EnableStreamMemOPs=1`` module parameter; the V2 entry
  points, CUDA 11.7+, are on by default):
  https://docs.nvidia.com/cuda/archive/11.8.0/cuda-driver-api/group__CUDA__MEMOP.html
* Graph capture (memops become ``CU_GRAPH_NODE_TYPE_BATCH_MEM_OP`` nodes; the legacy NULL stream
  cannot be captured; captured host memory must be pinned):
  https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GRAPH.html,
  https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__STREAM.html (cuStreamBeginCapture),
  https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-graphs
* Mapped pinned memory (cuMemHostAlloc with ``CU_MEMHOSTALLOC_DEVICEMAP``,
  cuMemHostGetDevicePointer): https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html

The native part (``csrc/ple_probe.cpp``) is built with ``torch.utils.cpp_extension.load`` on first
use and cached in ``$PLE_HARNESS_CACHE/probe-build`` (default ``~/.cache/ple-harness/probe-build``);
the first call therefore takes ~10-60 s (compile), later calls milliseconds to import.
"""
from __future__ import annotations

import time
import traceback
from typing import Any

from ._build import ProbeUnavailable, build_info, load_extension, one_line
from ._core import (TorchBackend, classify, graph_capture_trial, memops_capability, require_cuda_torch,
                    run_selftest, run_timings)
from ._env import cuda_runtime_version, fmt_cuda_version, host_detail, host_name, now_iso, nvidia_driver_version

__all__ = ["run_probe", "capability_summary"]

SCHEMA_VERSION = 1
MEMOP_FLAGS = ("wait_value_32", "write_value_32", "wait_value_64", "write_value_64", "64bit_attribute",
               "wait_value_nor", "can_map_host_memory")


def _skeleton(params: dict | None) -> dict:
    torch_cuda = None
    torch_version = None
    try:
        import torch  # lazy: torch (optional): only the GPU probe needs it

        torch_cuda = getattr(torch.version, "cuda", None)
        torch_version = torch.__version__
    except Exception:
        pass
    out: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "status": "unavailable",
        "reason": "",
        "device": None,
        "device_detail": None,
        "driver_version": None,
        "cuda_version": {"runtime": None, "torch": torch_cuda, "driver_api": None, "toolkit": None},
        "torch_version": torch_version,
        "memops": None,
        "graph_capture": None,
        "graph_capture_detail": None,
        "fallback": None,
        "date": now_iso(),
        "host": host_name(),
    }
    if params is not None:
        out.update({"selftest": {"status": "skipped", "reason": "not run", "replays": 0, "mismatches": 0,
                                 "stranding_guard": None},
                    "timings": None, "params": params})
    return out


def _prepare(result: dict):
    """Common start: CUDA torch, device, context, native module. Fills ``result``; returns
    (ext, backend). Raises ProbeUnavailable."""
    torch = require_cuda_torch()
    device = torch.cuda.current_device()
    torch.zeros(1, device=torch.device("cuda", device))  # create PyTorch's (primary) context first
    result["device"] = torch.cuda.get_device_name(device)
    result["cuda_version"]["runtime"] = cuda_runtime_version()
    result["driver_version"] = nvidia_driver_version()
    ext = load_extension()
    result["cuda_version"]["toolkit"] = build_info().get("toolkit")
    drv = ext.driver_status()
    if not drv["ok"]:
        raise ProbeUnavailable(drv["error"])
    return ext, TorchBackend(torch, device)


def _capability(ext, backend, result: dict):
    """Driver/device facts, memops capability and the graph capture trial into ``result``;
    returns (memops, graph)."""
    drv = ext.driver_status()
    result["cuda_version"]["driver_api"] = fmt_cuda_version(drv["version"])
    result["device_detail"] = dict(ext.device_info(backend.device))
    result["device"] = result["device"] or result["device_detail"]["name"]
    memops = memops_capability(ext, backend.device)
    result["memops"] = memops
    graph = None
    if memops["wait_value_32"] and memops["write_value_32"] and memops["can_map_host_memory"]:
        graph = graph_capture_trial(ext, backend)
        result["graph_capture"] = bool(graph["captured"])
        result["graph_capture_detail"] = graph
    return memops, graph


def _sections(ext, backend, result: dict, selftest: bool, timings: bool, replays: int) -> None:
    """Capability, self-test, timings and the verdict into ``result`` (any backend)."""
    memops, graph = _capability(ext, backend, result)
    status, reason, fallback = classify(memops, graph, None, None)
    if status == "ok" and selftest:
        result["selftest"] = run_selftest(ext, backend, replays)
    else:
        result["selftest"]["reason"] = "not requested" if not selftest else f"not run: {status}"
    st = result["selftest"] if result["selftest"]["status"] != "skipped" else None
    status, reason, fallback = classify(memops, graph, st, None)
    if timings and status in ("ok", "fallback"):
        iters = min(max(replays, 20), 2000)
        result["timings"] = run_timings(ext, backend, deferred=(status == "ok"), iters=iters)
    status, reason, fallback = classify(memops, graph, st, result["timings"])
    result.update(status=status, reason=reason, fallback=fallback)


def run_probe(selftest: bool = True, timings: bool = True, replays: int = 1000) -> dict:
    """Run the probe on the current CUDA device and return a JSON-serialisable dict.

    Never raises for a missing GPU, a CPU-only PyTorch, a missing toolkit/compiler/ninja or a
    failed build (``status == "unavailable"``), nor for a CUDA error during the probe
    (``status == "failed"``, with ``traceback``). Only KeyboardInterrupt/SystemExit propagate.

    Args:
        selftest: run the graph self-test (``replays`` replays at each of 256 B and 64 KiB, every
            replay's staging bytes and flag verified) and the stranding-guard test.
        timings: time the deferred path against the synchronous baseline at 256 B .. 64 KiB rows
            (``min(max(replays, 20), 2000)`` samples each) and measure H2D bandwidth (256 MiB).
        replays: self-test replays per row size (>= 1).

    Returns keys (units in names: ``_us`` microseconds, ``_bytes`` bytes, ``_gb_per_s`` 1e9 B/s):

    * ``status``: ``"ok"`` (deferred path works and verified), ``"fallback"`` (32-bit wait/write
      memops, mapped host memory or their graph capture missing: the engine must use the
      synchronous path), ``"failed"`` (a replay, the self-test, the stranding guard or a timed
      sample's verification went wrong), ``"unavailable"`` (no GPU / toolkit / build).
    * ``reason``: one line; empty for ``ok``.
    * ``device`` (name), ``device_detail`` {index, name, pci_bus_id, total_memory_bytes,
      compute_capability}, ``driver_version`` (kernel driver, e.g. ``"580.159.04"``),
      ``cuda_version`` {runtime (PyTorch's libcudart), torch (``torch.version.cuda``), driver_api
      (cuDriverGetVersion), toolkit (headers the probe was built with)}, ``torch_version``.
    * ``memops`` {wait_value_32, write_value_32, wait_value_64, write_value_64, 64bit_attribute,
      wait_value_nor, flush_remote_writes, can_map_host_memory: bool; api: "v2"|"v1";
      attributes: raw CU_DEVICE_ATTRIBUTE values; trial: per-operation CUresult names}.
    * ``graph_capture``: bool, or None when not tried (memops missing / unavailable);
      ``graph_capture_detail`` {captured, node_types, replay_ok, error}.
    * ``fallback``: ``"synchronous"`` when the deferred path is unusable, else None.
    * ``selftest`` {status "ok"|"failed"|"skipped", reason, replays (total), mismatches (total),
      runs: [{row_bytes, replays, mismatches, flag_not_reset, early_completions, timeouts,
      latency_us_median, latency_us_p99, ...}], python_check: [...], stranding_guard: {status,
      timeout_s, fired, released, blocked_us, release_us, replay_after_ok, device_usable, ...}}.
    * ``timings`` (None when not run) {rows: [{row_bytes, deferred_us_median, deferred_us_p99,
      deferred_signal_to_done_us_median/p99, sync_us_median, sync_us_p99,
      deferred_minus_sync_us_median, bandwidth_floor_us, iters, ...}], h2d_bandwidth_gb_per_s,
      h2d_bandwidth {gb_per_s, gb_per_s_max, bytes, reps, verified, method}, method, ...}.
    * ``date`` (ISO 8601 UTC), ``host`` (hostname), ``host_detail``, ``params``, ``probe``
      {build, duration_s}, and ``traceback`` for ``failed`` caused by an exception.
    """
    t0 = time.monotonic()
    replays = max(1, int(replays))
    result = _skeleton({"selftest": bool(selftest), "timings": bool(timings), "replays": replays})
    result["host_detail"] = host_detail()
    try:
        ext, backend = _prepare(result)
        try:
            _sections(ext, backend, result, selftest, timings, replays)
        finally:
            backend.close()
    except ProbeUnavailable as exc:
        result.update(status="unavailable", reason=one_line(exc))
    except Exception as exc:
        result.update(status="failed", reason=f"{type(exc).__name__}: {one_line(exc)}",
                      traceback=traceback.format_exc())
    result["probe"] = {"build": build_info() or None, "duration_s": round(time.monotonic() - t0, 3)}
    return result


def capability_summary() -> dict:
    """Capability only (no self-test, no timings), for the stress manifest's environment section.

    Returns ``{"status", "reason", "device", "driver_version", "cuda_version", "memops" (the bool
    flags of :func:`run_probe`'s ``memops``), "graph_capture", "fallback", "date", "host"}``;
    ``status`` is ``"ok"``, ``"fallback"``, ``"failed"`` (the one captured replay went wrong) or
    ``"unavailable"`` (with ``reason``: no GPU, CPU-only PyTorch, no toolkit, build failure).
    Costs one eager memop trial and one captured replay (milliseconds) after the extension is
    built; the first call in a fresh cache compiles it. Never raises (except KeyboardInterrupt).
    """
    result = _skeleton(None)
    try:
        ext, backend = _prepare(result)
        try:
            memops, graph = _capability(ext, backend, result)
        finally:
            backend.close()
        status, reason, fallback = classify(memops, graph, None, None)
        result.update(status=status, reason=reason, fallback=fallback)
    except ProbeUnavailable as exc:
        result.update(status="unavailable", reason=one_line(exc))
    except Exception as exc:
        result.update(status="failed", reason=f"{type(exc).__name__}: {one_line(exc)}")
    if isinstance(result.get("memops"), dict):
        result["memops"] = {k: bool(result["memops"].get(k)) for k in MEMOP_FLAGS}
    result.pop("device_detail", None)
    result.pop("graph_capture_detail", None)
    return result
