"""GPU tests of pleharness.probe on a real NVIDIA GPU (marker ``gpu``; skipped elsewhere with the
reason): capability, pinned-buffer lifecycle, the captured WAIT -> WRITE -> H2D graph over many
verified replays (native graph and torch.cuda.CUDAGraph), and the stranding guard.

Run: ``python -m pytest -m gpu tests/test_probe_gpu.py -q``
"""
from __future__ import annotations

import json
import os

import pytest

from pleharness.probe import _build, _core, capability_summary, run_probe


def _skip_reason() -> str | None:
    try:
        import torch
    except Exception as exc:
        return f"PyTorch not importable ({_build.one_line(exc)})"
    if getattr(torch.version, "cuda", None) is None:
        return f"PyTorch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    if _build.find_cuda_include() is None:
        return "CUDA toolkit headers (cuda.h) not found"
    return None


SKIP = _skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=f"needs an NVIDIA GPU and CUDA: {SKIP}")]

GUARD_S = 2.0


@pytest.fixture(scope="module")
def torch():
    import torch

    torch.zeros(1, device="cuda")
    return torch


@pytest.fixture(scope="module")
def ext(torch):
    return _build.load_extension()  # a GPU is here: a build failure is a test failure


@pytest.fixture()
def backend(torch, ext):
    b = _core.TorchBackend(torch, torch.cuda.current_device())
    yield b
    b.close()


@pytest.fixture()
def graph_for(ext, backend):
    """graph_for(nbytes) -> (graph, flag, row, staging tensor); all released after the test."""
    made = []

    def make(nbytes: int):
        flag = ext.HostBuffer(64, backend.device)
        row = ext.HostBuffer(nbytes, backend.device)
        ptr, staging = backend.staging(nbytes)
        g = ext.DeferredRowGraph(flag, row, ptr, staging, nbytes, backend.stream)
        made.append((g, flag, row))
        return g, flag, row, staging

    yield make
    for g, flag, row in made:
        g.destroy()
        flag.free()
        row.free()


def test_capability(ext, backend):
    drv = ext.driver_status()
    assert drv["ok"] and drv["version"] >= 11070 and drv["device_count"] >= 1
    memops = _core.memops_capability(ext, backend.device)
    assert memops["wait_value_32"] and memops["write_value_32"] and memops["can_map_host_memory"]
    assert memops["trial"]["wait_value_32"] == "CUDA_SUCCESS" and memops["trial_guard_fired"] is False
    assert memops["api"] == "v2"
    assert set(memops["attributes"]) >= {"CAN_USE_64_BIT_STREAM_MEM_OPS", "CAN_USE_STREAM_WAIT_VALUE_NOR",
                                         "CAN_MAP_HOST_MEMORY"}
    if memops["64bit_attribute"]:
        assert memops["wait_value_64"] and memops["write_value_64"]
    graph = _core.graph_capture_trial(ext, backend)
    assert graph["captured"] and graph["replay_ok"], graph
    assert graph["node_types"].count("BATCH_MEM_OP") == 2 and graph["node_types"].count("MEMCPY") == 1
    summary = capability_summary()
    assert summary["status"] == "ok" and summary["graph_capture"] is True and summary["fallback"] is None
    json.dumps(summary)


def test_host_buffer_lifecycle(ext, backend, torch):
    n = 4096
    buf = ext.HostBuffer(n, backend.device)
    flag = ext.HostBuffer(64, backend.device)
    assert buf.nbytes == n and buf.device_ptr != 0 and buf.host_ptr != 0 and not buf.freed
    assert buf.read() == bytes(n)
    data = os.urandom(n)
    buf.write(data)
    assert buf.read() == data and buf.read(100, 8) == data[100:108]
    # The device sees the host's bytes through the mapping: eager WAIT/WRITE/H2D with the flag preset.
    ptr, staging = backend.staging(n)
    flag.store_u32(0, 1)
    assert ext.enqueue_deferred_row(flag, buf, ptr, n, backend.stream) is None  # not capturing: no token
    w = ext.guarded_wait(backend.stream, flag, GUARD_S)
    assert w["completed"] and not w["guard_fired"]
    assert backend.read(staging) == data and flag.load_u32(0) == 0
    # Free refused while a captured graph references the buffers.
    g = ext.DeferredRowGraph(flag, buf, ptr, staging, n, backend.stream)
    assert flag.graph_refs == 1 and buf.graph_refs == 1
    with pytest.raises(ext.BufferInUseError, match="still referenced by 1 captured graph"):
        buf.free()
    with pytest.raises(ext.BufferInUseError):
        flag.free()
    assert not buf.freed and buf.read() == data
    g.destroy()
    assert g.destroyed and buf.graph_refs == 0
    with pytest.raises(RuntimeError, match="destroyed"):
        g.launch()
    assert buf.free() is True and buf.freed and buf.free() is False
    with pytest.raises(RuntimeError, match="freed"):
        buf.read()
    with pytest.raises(IndexError):
        flag.write(b"x" * 65)
    with pytest.raises(ValueError):
        flag.store_u32(2, 1)
    assert flag.free() is True


@pytest.mark.parametrize("nbytes", [256, 4096, 65536])
def test_graph_replays_verified(ext, backend, graph_for, nbytes):
    g, flag, row, staging = graph_for(nbytes)
    assert g.node_types.count("BATCH_MEM_OP") == 2 and "MEMCPY" in g.node_types
    # 1000 native replays: a host thread writes a fresh pattern and sets the flag; each replay's
    # staging bytes (poisoned before it) and the reset flag are checked.
    r = ext.selftest(g, 1000, GUARD_S, 1000 + nbytes, 0xA5)
    assert r["error"] is None, r["error"]
    assert r["replays"] == 1000 and r["mismatches"] == 0 and r["flag_not_reset"] == 0
    assert r["early_completions"] == 0 and r["timeouts"] == 0 and not r["stranded"]
    # 100 more, driven and checked from Python with random bytes (independent of the native check).
    for i in range(100):
        data = os.urandom(nbytes)
        g.launch()
        row.write(data)
        flag.store_u32(0, 1)
        w = g.wait(GUARD_S)
        assert w["completed"] and not w["guard_fired"], (i, w)
        assert backend.read(staging) == data, i
        assert flag.load_u32(0) == 0, i


def test_torch_cuda_graph_capture(ext, backend, torch):
    """The same three operations captured by torch.cuda.graph (the engine's capture path)."""
    n = 16384
    flag = ext.HostBuffer(64, backend.device)
    row = ext.HostBuffer(n, backend.device)
    staging = torch.empty(n, dtype=torch.uint8, device=backend.dev)
    side = torch.cuda.Stream(device=backend.dev)
    cg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cg, stream=side):
        token = ext.enqueue_deferred_row(flag, row, staging.data_ptr(), n, torch.cuda.current_stream().cuda_stream)
    assert token is not None and not token.released
    with pytest.raises(ext.BufferInUseError):
        row.free()
    with torch.cuda.stream(side):
        for i in range(200):
            data = os.urandom(n)
            staging.fill_(0xA5)
            cg.replay()
            row.write(data)
            flag.store_u32(0, 1)
            w = ext.guarded_wait(side.cuda_stream, flag, GUARD_S)
            assert w["completed"] and not w["guard_fired"], (i, w)
            assert backend.read(staging) == data, i
            assert flag.load_u32(0) == 0, i
    torch.cuda.synchronize()
    cg.reset()
    assert token.release() is True and token.release() is False
    assert row.free() and flag.free()


def test_stranding_guard(ext, backend, graph_for):
    n = 4096
    g, flag, row, staging = graph_for(n)
    flag.store_u32(0, 0)
    g.launch()  # nobody signals
    w = g.wait(0.2, 5.0)
    assert not w["completed"] and w["guard_fired"] and w["released"], w
    assert w["waited_us"] >= 0.2e6 and w["releases"] >= 1 and w["error"] is None
    assert flag.load_u32(0) == 0
    assert backend.usable()
    # The graph works again afterwards.
    row.fill_pattern(99, 1)
    g.launch()
    flag.store_u32(0, 1)
    w = g.wait(GUARD_S)
    assert w["completed"] and backend.read(staging) == ext.pattern(99, 1, n)
    # The probe's own stranding test reports the same.
    st = _core.stranding_test(ext, backend, g, flag, row, staging, n, 0.1)
    assert st["status"] == "ok" and st["fired"] and st["released"] and st["device_usable"], st


def test_destroy_releases_a_blocked_replay(ext, backend, graph_for):
    g, flag, row, staging = graph_for(256)
    g.launch()  # blocked in its WAIT
    g.destroy()  # must release it rather than strand the stream
    assert ext.guarded_wait(backend.stream, None, 1.0)["completed"]
    assert backend.usable()


def test_run_probe_quick(torch):
    r = run_probe(selftest=True, timings=False, replays=200)
    assert r["status"] == "ok", r["reason"]
    assert r["selftest"]["replays"] == 400 and r["selftest"]["mismatches"] == 0
    assert r["selftest"]["stranding_guard"]["status"] == "ok"
    assert r["timings"] is None and r["fallback"] is None
    assert json.loads(json.dumps(r)) == r
