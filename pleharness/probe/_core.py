"""Probe orchestration: capability, graph self-test, stranding guard, timings, verdict.

Everything here talks to the native module (:mod:`._build`) through a *backend* that supplies a
stream, device staging buffers and the H2D bandwidth reference. :class:`TorchBackend` is the real
one (PyTorch's streams and caching allocator, so the probe exercises the same objects an engine
does); :class:`NativeBackend` uses only the native module (a private stream, mapped host memory as
"staging") and exists so the orchestration can be tested against the simulated driver in
``csrc/testing/fake_libcuda.cpp`` on machines without a GPU.
"""
from __future__ import annotations

import math
import os
import statistics
from typing import Any, Sequence

from ._build import ProbeUnavailable, one_line

# Row sizes timed (bytes): 256 B .. 64 KiB, a PLE row of a few hundred to tens of thousands of bytes.
ROW_SIZES: tuple[int, ...] = (256, 1024, 4096, 16384, 65536)
# Row sizes the self-test replays at (smallest and largest timed size).
SELFTEST_ROW_SIZES: tuple[int, ...] = (256, 65536)
SEED = 0x5EED
POISON = 0xA5
GUARD_TIMEOUT_S = 2.0      # a signalled replay that takes longer than this is a failure
STRANDING_TIMEOUT_S = 0.25  # the deliberately unsignalled replay
BANDWIDTH_BYTES = 256 << 20
BANDWIDTH_REPS = 10


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------

def percentile(samples: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``samples``; None when empty."""
    if not samples:
        return None
    data = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(data)))
    return float(data[min(rank, len(data)) - 1])


def summarize_us(samples: Sequence[float]) -> dict:
    """``{"median", "p99", "min", "max", "n"}`` of microsecond samples, rounded to 0.01 us."""
    if not samples:
        return {"median": None, "p99": None, "min": None, "max": None, "n": 0}
    r = lambda x: round(float(x), 2)  # noqa: E731
    return {"median": r(statistics.median(samples)), "p99": r(percentile(samples, 99)),
            "min": r(min(samples)), "max": r(max(samples)), "n": len(samples)}


# ------------------------------------------------------------------------------------------------
# Backends
# ------------------------------------------------------------------------------------------------

class TorchBackend:
    """Streams and staging tensors from PyTorch on ``cuda:<device>``."""

    def __init__(self, torch, device: int):
        self.torch = torch
        self.device = device
        self.dev = torch.device("cuda", device)
        self._stream = torch.cuda.Stream(device=self.dev)

    @property
    def stream(self) -> int:
        return int(self._stream.cuda_stream)

    def staging(self, nbytes: int):
        """(device pointer, owner) of a fresh uint8 tensor of ``nbytes`` on the device."""
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)
        return int(t.data_ptr()), t

    def read(self, owner) -> bytes:
        t = owner.cpu()
        try:
            return t.numpy().tobytes()
        except Exception:  # numpy missing
            return bytes(t.tolist())

    def usable(self) -> bool:
        """A trivial device computation completes and is right (after a stranding test)."""
        t = self.torch.arange(1024, device=self.dev, dtype=self.torch.float32)
        ok = float(t.sum().item()) == 1023 * 1024 / 2
        self.torch.cuda.synchronize(self.dev)
        return ok

    def h2d_bandwidth(self, nbytes: int = BANDWIDTH_BYTES, reps: int = BANDWIDTH_REPS) -> dict:
        """Pinned host -> device copy of ``nbytes``, timed with CUDA events; median of ``reps``."""
        torch = self.torch
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        src.fill_(0x5A)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=self.dev)
        times_ms = []
        with torch.cuda.stream(self._stream):
            for i in range(reps + 2):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                dst.copy_(src, non_blocking=True)
                b.record()
                b.synchronize()
                if i >= 2:
                    times_ms.append(a.elapsed_time(b))
        ok = bool(torch.equal(dst[:4096].cpu(), src[:4096]))
        med = statistics.median(times_ms)
        return {"gb_per_s": round(nbytes / (med / 1e3) / 1e9, 2),
                "gb_per_s_max": round(nbytes / (min(times_ms) / 1e3) / 1e9, 2),
                "bytes": nbytes, "reps": reps, "verified": ok,
                "method": "torch: pinned uint8 tensor -> device tensor, copy_(non_blocking=True) on a "
                          "side stream, CUDA events; median of reps after 2 warm-ups; GB = 1e9 bytes"}

    def close(self) -> None:
        self.torch.cuda.synchronize(self.dev)


class NativeBackend:
    """Only the native module: a private stream and mapped host memory as staging (tests)."""

    def __init__(self, ext, device: int = 0):
        self.ext = ext
        self.device = device
        self._stream = ext.stream_create(device)
        self._owned: list = []

    @property
    def stream(self) -> int:
        return self._stream

    def staging(self, nbytes: int):
        buf = self.ext.HostBuffer(nbytes, self.device)
        self._owned.append(buf)
        return int(buf.device_ptr), buf

    def read(self, owner) -> bytes:
        return owner.read()

    def usable(self) -> bool:
        return self.ext.guarded_wait(self._stream, None, 1.0)["completed"]

    def h2d_bandwidth(self, nbytes: int = BANDWIDTH_BYTES, reps: int = BANDWIDTH_REPS) -> dict | None:
        return None

    def close(self) -> None:
        self.ext.stream_destroy(self._stream, self.device)
        for b in self._owned:
            try:
                b.free()
            except Exception:
                pass


# ------------------------------------------------------------------------------------------------
# Capability
# ------------------------------------------------------------------------------------------------

def _attr(attrs: dict, new: str, old: str, driver_version: int) -> bool:
    """V2 attribute on drivers >= 12.0 (IDs 122/123), the V1 one on older drivers."""
    if driver_version >= 12000 and attrs.get(new) is not None:
        return bool(attrs[new])
    return bool(attrs.get(old))


def memops_capability(ext, device: int) -> dict:
    """Attributes plus an eager functional trial of the 32-bit (and, where the attribute says so,
    64-bit) stream wait/write operations; see ``memop_trial`` in ``csrc/ple_probe.cpp``."""
    drv = ext.driver_status()
    v = int(drv.get("version") or 0)
    attrs = ext.memop_attributes(device)
    attr64 = _attr(attrs, "CAN_USE_64_BIT_STREAM_MEM_OPS", "CAN_USE_64_BIT_STREAM_MEM_OPS_V1", v)
    nor = _attr(attrs, "CAN_USE_STREAM_WAIT_VALUE_NOR", "CAN_USE_STREAM_WAIT_VALUE_NOR_V1", v)
    trial = ext.memop_trial(device, bool(attr64), GUARD_TIMEOUT_S)
    ok32 = bool(trial.get("ok_32"))
    ok64 = bool(trial.get("ok_64", False))
    return {
        "wait_value_32": ok32 and trial.get("wait_value_32") == "CUDA_SUCCESS",
        "write_value_32": ok32 and trial.get("write_value_32") == "CUDA_SUCCESS",
        "wait_value_64": attr64 and ok64,
        "write_value_64": attr64 and ok64,
        "64bit_attribute": attr64,
        "wait_value_nor": nor,
        "flush_remote_writes": bool(attrs.get("CAN_FLUSH_REMOTE_WRITES")),
        "can_map_host_memory": bool(attrs.get("CAN_MAP_HOST_MEMORY")),
        "api": "v2" if v >= 11070 else "v1",
        "v1_module_parameter_enabled": attrs.get("CAN_USE_STREAM_MEM_OPS_V1"),
        "attributes": attrs,
        "trial": {k: trial[k] for k in trial if not k.startswith("guard_")},
        "trial_guard_fired": any(trial[k]["guard_fired"] for k in trial if k.startswith("guard_")),
    }


def graph_capture_trial(ext, backend, nbytes: int = 256) -> dict:
    """Capture WAIT(flag==1) -> WRITE(flag=0) -> H2D(row->staging) on the backend's stream,
    instantiate, replay once with a host signal, verify. Never raises for CUDA errors."""
    out: dict[str, Any] = {"captured": False, "node_types": None, "replay_ok": None, "error": None}
    flag = row = g = None
    try:
        flag = ext.HostBuffer(64, backend.device)
        row = ext.HostBuffer(nbytes, backend.device)
        ptr, owner = backend.staging(nbytes)
        try:
            g = ext.DeferredRowGraph(flag, row, ptr, owner, nbytes, backend.stream)
        except RuntimeError as exc:
            out["error"] = one_line(exc)
            return out
        out["captured"] = True
        out["node_types"] = list(g.node_types)
        row.fill_pattern(SEED, 7)
        g.launch()
        flag.store_u32(0, 1)
        w = g.wait(GUARD_TIMEOUT_S)
        got = backend.read(owner)
        out["replay_ok"] = bool(w["completed"] and got == ext.pattern(SEED, 7, nbytes)
                                and flag.load_u32(0) == 0)
        if not out["replay_ok"]:
            out["error"] = ("replay did not complete (stranding guard released it)" if not w["completed"]
                            else "replay completed but staging bytes or flag were wrong")
        return out
    finally:
        if g is not None:
            g.destroy()
        for b in (flag, row):
            if b is not None:
                b.free()


# ------------------------------------------------------------------------------------------------
# Self-test and stranding guard
# ------------------------------------------------------------------------------------------------

def _python_replays(ext, backend, g, flag, row, owner, nbytes: int, count: int) -> dict:
    """Replays verified from Python (independent of the native comparison): random bytes per replay."""
    bad = 0
    done = 0
    for _ in range(count):
        data = os.urandom(nbytes)
        g.launch()
        row.write(data)
        flag.store_u32(0, 1)
        w = g.wait(GUARD_TIMEOUT_S)
        if not w["completed"]:
            return {"replays": done, "mismatches": bad, "error": "replay needed the stranding guard"}
        if backend.read(owner) != data or flag.load_u32(0) != 0:
            bad += 1
        done += 1
    return {"replays": done, "mismatches": bad, "error": None}


def stranding_test(ext, backend, g, flag, row, owner, nbytes: int,
                   timeout_s: float = STRANDING_TIMEOUT_S) -> dict:
    """Launch the graph and never signal: the guard must fire after ``timeout_s``, release the
    WAIT from the host, and leave the device usable (a signalled replay then verifies)."""
    flag.store_u32(0, 0)
    g.launch()
    w = g.wait(timeout_s, 5.0)
    after = {"flag": flag.load_u32(0)}
    row.fill_pattern(SEED, 424242)
    g.launch()
    flag.store_u32(0, 1)
    w2 = g.wait(GUARD_TIMEOUT_S)
    replay_ok = bool(w2["completed"] and backend.read(owner) == ext.pattern(SEED, 424242, nbytes)
                     and flag.load_u32(0) == 0)
    usable = bool(backend.usable())
    fired = bool(w["guard_fired"])
    released = bool(w["released"])
    ok = fired and released and replay_ok and usable and after["flag"] == 0
    if not fired:
        reason = "the unsignalled WAIT did not block (graph completed without a signal)"
    elif not released:
        reason = f"host release did not unblock the stream: {w.get('error')}"
    elif not replay_ok:
        reason = "replay after the guard release failed verification"
    elif not usable:
        reason = "device not usable after the guard release"
    else:
        reason = None
    return {"status": "ok" if ok else "failed", "timeout_s": timeout_s, "fired": fired, "released": released,
            "blocked_us": round(w["waited_us"], 1), "release_us": round(w["total_us"] - w["waited_us"], 1),
            "releases": w["releases"], "flag_after_release": after["flag"], "replay_after_ok": replay_ok,
            "device_usable": usable, "reason": reason}


def run_selftest(ext, backend, replays: int, row_sizes: Sequence[int] = SELFTEST_ROW_SIZES,
                 python_replays: int = 20) -> dict:
    """The graph self-test at each row size (``replays`` native replays with a host signaller
    thread, each verified byte for byte; ``python_replays`` more verified from Python) and the
    stranding guard test. Returns the ``selftest`` section of the result."""
    runs = []
    strand = None
    py_checks = []
    for n in row_sizes:
        flag = ext.HostBuffer(64, backend.device)
        row = ext.HostBuffer(n, backend.device)
        ptr, owner = backend.staging(n)
        g = ext.DeferredRowGraph(flag, row, ptr, owner, n, backend.stream)
        try:
            r = ext.selftest(g, replays, GUARD_TIMEOUT_S, SEED + n, POISON)
            lat = summarize_us(r.pop("latency_us"))
            r["latency_us_median"] = lat["median"]
            r["latency_us_p99"] = lat["p99"]
            runs.append(r)
            if python_replays:
                py_checks.append({"row_bytes": n, **_python_replays(ext, backend, g, flag, row, owner, n,
                                                                    python_replays)})
            if strand is None and r["error"] is None:
                strand = stranding_test(ext, backend, g, flag, row, owner, n)
        finally:
            g.destroy()
            flag.free()
            row.free()
    total = sum(r["replays"] for r in runs)
    mism = sum(r["mismatches"] for r in runs) + sum(p["mismatches"] for p in py_checks)
    problems = []
    for r in runs:
        n = r["row_bytes"]
        if r["error"]:
            problems.append(f"{n} B: {r['error']}")
        if r["replays"] < r["requested"]:
            problems.append(f"{n} B: {r['replays']}/{r['requested']} replays")
        if r["mismatches"]:
            problems.append(f"{n} B: {r['mismatches']} replays with wrong staging bytes "
                            f"(first: replay {r['first_bad_replay']}, byte {r['first_bad_offset']})")
        if r["flag_not_reset"]:
            problems.append(f"{n} B: flag not reset to 0 after {r['flag_not_reset']} replays")
        if r["early_completions"]:
            problems.append(f"{n} B: {r['early_completions']} replays finished before the signal")
        if r["timeouts"]:
            problems.append(f"{n} B: {r['timeouts']} replays released by the stranding guard")
    for p in py_checks:
        if p["mismatches"] or p["error"]:
            problems.append(f"{p['row_bytes']} B python check: {p['mismatches']} mismatches {p['error'] or ''}".strip())
    if strand is None:
        problems.append("stranding guard not tested (self-test failed first)")
    elif strand["status"] != "ok":
        problems.append(f"stranding guard: {strand['reason']}")
    return {"status": "failed" if problems else "ok", "reason": "; ".join(problems) or None,
            "replays": total, "mismatches": mism, "runs": runs, "python_check": py_checks,
            "stranding_guard": strand}


# ------------------------------------------------------------------------------------------------
# Timings
# ------------------------------------------------------------------------------------------------

def run_timings(ext, backend, deferred: bool, iters: int, row_sizes: Sequence[int] = ROW_SIZES) -> dict:
    """Per-replay latency of the deferred path and of the synchronous baseline for each row size,
    plus the H2D bandwidth reference. Returns the ``timings`` section of the result.

    Deferred (one sample): launch the captured graph; the launching thread gathers a random row of
    a pageable host table into the pinned row buffer and sets the flag; spin on cuStreamQuery
    until the stream drains. Synchronous: gather into the same pinned buffer, cuMemcpyHtoDAsync
    to the staging buffer, spin until drained. Both are host wall-clock (steady_clock), interleaved
    one for one, each sample verified byte for byte afterwards (outside the timed region).
    """
    warmup = max(5, min(50, iters // 10))
    bw = backend.h2d_bandwidth()
    gbps = bw["gb_per_s"] if bw else None
    rows = []
    errors = []
    for n in row_sizes:
        flag = ext.HostBuffer(64, backend.device)
        row = ext.HostBuffer(n, backend.device)
        ptr, owner = backend.staging(n)
        g = ext.DeferredRowGraph(flag, row, ptr, owner, n, backend.stream) if deferred else None
        table_rows = max(64, min(4096, (64 << 20) // n))
        try:
            r = ext.time_paths(flag, row, ptr, n, backend.stream, g, table_rows, iters, warmup, SEED + n,
                               GUARD_TIMEOUT_S)
        finally:
            if g is not None:
                g.destroy()
            flag.free()
            row.free()
        d = summarize_us(r["deferred_us"])
        s2d = summarize_us(r["deferred_signal_to_done_us"])
        s = summarize_us(r["sync_us"])
        floor = round(n / (gbps * 1e9) * 1e6, 3) if gbps else None
        rows.append({
            "row_bytes": n,
            "deferred_us_median": d["median"], "deferred_us_p99": d["p99"],
            "deferred_signal_to_done_us_median": s2d["median"], "deferred_signal_to_done_us_p99": s2d["p99"],
            "sync_us_median": s["median"], "sync_us_p99": s["p99"],
            "deferred_minus_sync_us_median": (round(d["median"] - s["median"], 2)
                                              if d["median"] is not None and s["median"] is not None else None),
            "bandwidth_floor_us": floor,
            "iters": r["iters"], "table_rows": table_rows,
            "deferred_mismatches": r["deferred_mismatches"], "sync_mismatches": r["sync_mismatches"],
            "timeouts": r["timeouts"], "error": r["error"],
        })
        if r["error"] or r["deferred_mismatches"] or r["sync_mismatches"] or r["timeouts"]:
            errors.append(f"{n} B: error={r['error']} mismatches={r['deferred_mismatches']}/"
                          f"{r['sync_mismatches']} timeouts={r['timeouts']}")
    return {"rows": rows, "h2d_bandwidth_gb_per_s": gbps, "h2d_bandwidth": bw, "iters": iters,
            "warmup": warmup, "deferred_measured": deferred, "errors": errors,
            "method": run_timings.__doc__.split("\n\n", 1)[1].strip().replace("\n    ", " ")}


# ------------------------------------------------------------------------------------------------
# Verdict
# ------------------------------------------------------------------------------------------------

def classify(memops: dict | None, graph: dict | None, selftest: dict | None,
             timings: dict | None) -> tuple[str, str, str | None]:
    """(status, reason, fallback) from the sections. Pure; see :func:`pleharness.probe.run_probe`.

    fallback  -> 32-bit wait/write memops or mapped host memory missing, or the memops cannot be
                 captured into a graph: the engine must use the synchronous path.
    failed    -> captured fine but a replay, the self-test, the stranding guard or a timed
                 sample's verification went wrong.
    ok        -> everything that ran passed.
    """
    if memops is not None:
        missing = [k for k in ("wait_value_32", "write_value_32", "can_map_host_memory") if not memops.get(k)]
        if missing:
            return ("fallback", "stream memory operations unusable here (" + ", ".join(missing) +
                    " unsupported); the engine must load PLE rows synchronously", "synchronous")
    if graph is not None and not graph.get("captured"):
        return ("fallback", f"stream wait/write cannot be captured into a CUDA graph ({graph.get('error')}); "
                "the engine must load PLE rows synchronously", "synchronous")
    if graph is not None and graph.get("replay_ok") is False:
        return "failed", f"captured graph replay failed: {graph.get('error')}", None
    if selftest is not None and selftest.get("status") != "ok":
        return "failed", f"self-test failed: {selftest.get('reason')}", None
    if timings is not None and timings.get("errors"):
        return "failed", "timed samples failed verification: " + "; ".join(timings["errors"]), None
    return "ok", "", None


def require_cuda_torch():
    """Import torch and check it is a CUDA build that sees a GPU; else :class:`ProbeUnavailable`."""
    try:
        import torch  # lazy: torch (optional): only the GPU probe needs it
    except Exception as exc:
        raise ProbeUnavailable(f"PyTorch not importable: {one_line(exc)}") from exc
    if getattr(torch.version, "cuda", None) is None:
        raise ProbeUnavailable(f"no GPU support: PyTorch {torch.__version__} is a CPU-only build "
                               "(torch.version.cuda is None)")
    try:
        available = torch.cuda.is_available()
    except Exception as exc:  # pragma: no cover - broken driver
        raise ProbeUnavailable(f"CUDA initialisation failed: {one_line(exc)}") from exc
    if not available:
        raise ProbeUnavailable("no CUDA GPU visible (torch.cuda.is_available() is False)")
    return torch
