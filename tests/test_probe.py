"""CPU tests of pleharness.probe: the unavailable path, the verdict logic, rendering and JSON of a
recorded H200 probe (docs/probe/h200-*.json), and the native extension against a simulated driver
(csrc/testing/fake_libcuda.cpp) when a compiler, ninja and cuda.h are present."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from rich.console import Console

import pleharness.probe as probe
from pleharness.probe import _build, _core, capability_summary, run_probe
from pleharness.render.probe import fmt_bytes, fmt_us, render

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "probe"
ROW_SIZES = [256, 1024, 4096, 16384, 65536]


def recorded() -> dict:
    files = sorted(DOCS.glob("h200-*.json"))
    assert files, f"no recorded H200 probe under {DOCS}"
    return json.loads(files[-1].read_text())


def rendered(result: dict) -> str:
    console = Console(record=True, width=220, color_system=None, force_terminal=False)
    render(result, console)
    return console.export_text()


def _cpu_torch() -> bool:
    try:
        import torch
    except Exception:
        return True
    return not (getattr(torch.version, "cuda", None) and torch.cuda.is_available())


# ------------------------------------------------------------------------------------------------
# The unavailable path (this machine: CPU-only PyTorch)
# ------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not _cpu_torch(), reason="a CUDA GPU is visible: the unavailable path is not taken")
def test_run_probe_unavailable_without_gpu():
    r = run_probe(replays=10)
    assert r["status"] == "unavailable"
    assert r["reason"] and "\n" not in r["reason"]
    assert "CPU-only" in r["reason"] or "no CUDA GPU" in r["reason"] or "PyTorch" in r["reason"]
    assert r["fallback"] is None and r["timings"] is None and r["memops"] is None
    assert r["graph_capture"] is None
    assert r["selftest"]["status"] == "skipped"
    assert r["params"] == {"selftest": True, "timings": True, "replays": 10}
    datetime.fromisoformat(r["date"])
    assert isinstance(r["host"], str) and r["host"]
    assert json.loads(json.dumps(r)) == r
    text = rendered(r)
    assert "unavailable" in text and r["reason"][:40] in text


@pytest.mark.skipif(not _cpu_torch(), reason="a CUDA GPU is visible: the unavailable path is not taken")
def test_capability_summary_unavailable_without_gpu():
    r = capability_summary()
    assert r["status"] == "unavailable"
    assert r["reason"] and "\n" not in r["reason"]
    assert r["memops"] is None and r["graph_capture"] is None
    assert "selftest" not in r and "timings" not in r
    json.dumps(r)


def test_run_probe_never_raises(monkeypatch):
    def unavailable(result):
        raise _build.ProbeUnavailable("CUDA toolkit not found (simulated)")

    monkeypatch.setattr(probe, "_prepare", unavailable)
    r = run_probe(replays=5)
    assert r["status"] == "unavailable" and r["reason"] == "CUDA toolkit not found (simulated)"

    def boom(result):
        raise RuntimeError("cuGraphLaunch failed: CUDA_ERROR_LAUNCH_FAILED (719)\nsecond line")

    monkeypatch.setattr(probe, "_prepare", boom)
    r = run_probe(replays=5)
    assert r["status"] == "failed"
    assert r["reason"] == "RuntimeError: cuGraphLaunch failed: CUDA_ERROR_LAUNCH_FAILED (719)"
    assert "Traceback" in r["traceback"]
    json.dumps(r)
    assert capability_summary()["status"] == "failed"


def test_missing_toolkit_is_unavailable(monkeypatch):
    monkeypatch.setattr(_build, "_module", None)
    monkeypatch.setattr(_build, "find_cuda_include", lambda: None)
    with pytest.raises(_build.ProbeUnavailable, match="CUDA toolkit not found"):
        _build.load_extension()


def test_build_dir_follows_cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PLE_HARNESS_CACHE", str(tmp_path))
    assert _build.build_root() == tmp_path / "probe-build"
    monkeypatch.delenv("PLE_HARNESS_CACHE")
    assert _build.build_root() == Path.home() / ".cache" / "ple-harness" / "probe-build"
    assert _build.find_source().name == "ple_probe.cpp"


# ------------------------------------------------------------------------------------------------
# Verdict and statistics (pure)
# ------------------------------------------------------------------------------------------------

GOOD_MEMOPS = {"wait_value_32": True, "write_value_32": True, "can_map_host_memory": True}
GOOD_GRAPH = {"captured": True, "replay_ok": True, "node_types": ["BATCH_MEM_OP", "BATCH_MEM_OP", "MEMCPY"]}


def test_classify():
    assert _core.classify(GOOD_MEMOPS, GOOD_GRAPH, {"status": "ok"}, {"errors": []}) == ("ok", "", None)
    s, reason, fb = _core.classify({**GOOD_MEMOPS, "wait_value_32": False}, None, None, None)
    assert (s, fb) == ("fallback", "synchronous") and "wait_value_32" in reason
    s, reason, fb = _core.classify({**GOOD_MEMOPS, "can_map_host_memory": False}, None, None, None)
    assert (s, fb) == ("fallback", "synchronous") and "can_map_host_memory" in reason
    s, reason, fb = _core.classify(GOOD_MEMOPS, {"captured": False, "error": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
                                   None, None)
    assert (s, fb) == ("fallback", "synchronous") and "CAPTURE_UNSUPPORTED" in reason
    s, reason, fb = _core.classify(GOOD_MEMOPS, {"captured": True, "replay_ok": False, "error": "x"}, None, None)
    assert s == "failed" and fb is None
    s, reason, _ = _core.classify(GOOD_MEMOPS, GOOD_GRAPH, {"status": "failed", "reason": "3 mismatches"}, None)
    assert s == "failed" and "3 mismatches" in reason
    s, reason, _ = _core.classify(GOOD_MEMOPS, GOOD_GRAPH, {"status": "ok"}, {"errors": ["256 B: timeouts=1"]})
    assert s == "failed" and "timeouts=1" in reason


def test_percentile_and_summary():
    data = [float(x) for x in range(1, 101)]
    assert _core.percentile(data, 99) == 99.0
    assert _core.percentile(data, 100) == 100.0
    assert _core.percentile([5.0], 99) == 5.0
    assert _core.percentile([], 50) is None
    s = _core.summarize_us(list(reversed(data)))
    assert s == {"median": 50.5, "p99": 99.0, "min": 1.0, "max": 100.0, "n": 100}


def test_fmt_helpers():
    assert [fmt_bytes(n) for n in ROW_SIZES] == ["256 B", "1 KiB", "4 KiB", "16 KiB", "64 KiB"]
    assert fmt_bytes(256 << 20) == "256 MiB" and fmt_bytes(1536) == "1.5 KiB"
    assert fmt_us(None) == "-" and fmt_us(12.345) == "12.3"


# ------------------------------------------------------------------------------------------------
# Recorded H200 probe: contents, JSON round trip, table rendering
# ------------------------------------------------------------------------------------------------

def test_recorded_probe_contents():
    r = recorded()
    assert r["status"] == "ok", r["reason"]
    assert "H200" in r["device"]
    assert r["driver_version"] and r["cuda_version"]["torch"] and r["cuda_version"]["driver_api"]
    m = r["memops"]
    assert m["wait_value_32"] and m["write_value_32"] and m["can_map_host_memory"]
    assert r["graph_capture"] is True and r["fallback"] is None
    nodes = r["graph_capture_detail"]["node_types"]
    assert nodes.count("BATCH_MEM_OP") >= 1 and "MEMCPY" in nodes
    st = r["selftest"]
    assert st["status"] == "ok" and st["mismatches"] == 0
    assert st["replays"] >= 1000 * len(st["runs"]) and len(st["runs"]) >= 2
    for run in st["runs"]:
        assert run["replays"] == run["requested"] and run["mismatches"] == 0
        assert run["flag_not_reset"] == 0 and run["early_completions"] == 0 and run["timeouts"] == 0
    sg = st["stranding_guard"]
    assert sg["status"] == "ok" and sg["fired"] and sg["released"] and sg["device_usable"]
    assert sg["blocked_us"] >= sg["timeout_s"] * 1e6
    tm = r["timings"]
    assert [row["row_bytes"] for row in tm["rows"]] == ROW_SIZES
    bw = tm["h2d_bandwidth_gb_per_s"]
    assert 0.05 < bw < 1000  # units (GB/s), not this machine's speed
    for row in tm["rows"]:
        assert 0 < row["deferred_us_median"] <= row["deferred_us_p99"]
        assert 0 < row["sync_us_median"] <= row["sync_us_p99"]
        assert row["deferred_mismatches"] == 0 and row["sync_mismatches"] == 0 and row["timeouts"] == 0
        assert row["bandwidth_floor_us"] == pytest.approx(row["row_bytes"] / (bw * 1e9) * 1e6, rel=1e-2, abs=1e-3)
        # Nothing moves a row faster than the bus does.
        assert row["deferred_us_median"] >= row["bandwidth_floor_us"]
        assert row["sync_us_median"] >= row["bandwidth_floor_us"]


def test_recorded_probe_renders():
    r = recorded()
    text = rendered(r)
    assert "PLE deferred-row probe" in text
    assert r["device"] in text and r["driver_version"] in text
    assert f"torch {r['cuda_version']['torch']}" in text
    assert "wait32 yes" in text and "write32 yes" in text
    assert "graph capture   yes" in text or "graph capture  yes" in text or "yes  (BATCH_MEM_OP" in text
    assert f"{r['selftest']['replays']} replays, 0 mismatches" in text
    assert "guard fired yes, released yes" in text
    for row in r["timings"]["rows"]:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(fmt_bytes(row["row_bytes"]) + " "))
        for key in ("deferred_us_median", "deferred_us_p99", "sync_us_median", "sync_us_p99"):
            assert fmt_us(row[key]) in line, (key, line)
    assert f"H2D bandwidth {r['timings']['h2d_bandwidth_gb_per_s']:.1f} GB/s" in text
    # Rendering the JSON round trip gives the same table.
    assert rendered(json.loads(json.dumps(r))) == text


def test_render_fallback_and_failed():
    r = recorded()
    fb = {**r, "status": "fallback", "fallback": "synchronous", "graph_capture": False,
          "graph_capture_detail": {"captured": False, "error": "cuStreamEndCapture failed: "
                                   "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)"},
          "reason": "stream wait/write cannot be captured into a CUDA graph", "timings": None,
          "selftest": {"status": "skipped", "reason": "not run: fallback", "replays": 0, "mismatches": 0,
                       "stranding_guard": None}}
    text = rendered(fb)
    assert "fallback" in text and "synchronous" in text and "CAPTURE_INVALIDATED" in text
    assert "Timings" not in text and "not run: fallback" in text
    failed = {**r, "status": "failed", "reason": "self-test failed: 65536 B: 3 replays with wrong staging bytes"}
    failed["selftest"] = {**r["selftest"], "status": "failed", "mismatches": 3,
                          "reason": "65536 B: 3 replays with wrong staging bytes"}
    text = rendered(failed)
    assert "failed" in text and "3 replays with wrong staging bytes" in text and "3 mismatches" in text


def test_render_capability_summary_shape():
    r = recorded()
    summary = {k: r[k] for k in ("status", "reason", "device", "driver_version", "cuda_version", "graph_capture",
                                 "fallback", "date", "host")}
    summary["memops"] = {k: bool(r["memops"].get(k)) for k in probe.MEMOP_FLAGS}
    text = rendered(summary)
    assert r["device"] in text and "wait32 yes" in text and "Timings" not in text


# ------------------------------------------------------------------------------------------------
# The native extension against a simulated driver (no GPU needed)
# ------------------------------------------------------------------------------------------------

FAKE_SCRIPT = r"""
import json, sys
from pleharness.probe import _build, _core
import pleharness.probe as probe
ext = _build.load_extension()
out = {"driver": ext.driver_status()}
mode = sys.argv[1]
if mode == "lifecycle":
    flag, row, stg = ext.HostBuffer(64), ext.HostBuffer(4096), ext.HostBuffer(4096)
    out["zeroed"] = row.read() == bytes(4096)
    data = bytes(range(256)) * 16
    row.write(data)
    out["roundtrip"] = row.read() == data
    s = ext.stream_create(0)
    g = ext.DeferredRowGraph(flag, row, stg.device_ptr, stg, 4096, s)
    out["node_types"] = list(g.node_types)
    out["refs"] = [flag.graph_refs, row.graph_refs]
    try:
        flag.free(); out["free_while_captured"] = "allowed"
    except ext.BufferInUseError as e:
        out["free_while_captured"] = str(e)
    g.launch(); flag.store_u32(0, 1); w = g.wait(2.0)
    out["replay"] = [w["completed"], stg.read() == data, flag.load_u32(0)]
    g.launch(); g.destroy()  # blocked replay: destroy must release it
    out["drained_after_destroy"] = ext.guarded_wait(s, None, 1.0)["completed"]
    out["refs_after"] = [flag.graph_refs, row.graph_refs]
    out["free"] = [flag.free(), row.free(), flag.free()]
    try:
        row.read(); out["read_after_free"] = "allowed"
    except RuntimeError as e:
        out["read_after_free"] = str(e)
    try:
        ext.HostBuffer(16).store_u32(2, 1); out["unaligned"] = "allowed"
    except ValueError as e:
        out["unaligned"] = str(e)
    f2, r2, b2 = ext.HostBuffer(64), ext.HostBuffer(256), ext.HostBuffer(256)
    g2 = ext.DeferredRowGraph(f2, r2, b2.device_ptr, b2, 256, s)
    out["stranding"] = _core.stranding_test(ext, _core.NativeBackend(ext), g2, f2, r2, b2, 256, 0.1)
elif mode.startswith("direct:"):
    flag, row, stg = ext.HostBuffer(64), ext.HostBuffer(1024), ext.HostBuffer(1024)
    s = ext.stream_create(0)
    g = ext.DeferredRowGraph(flag, row, stg.device_ptr, stg, 1024, s)
    r = ext.selftest(g, 40, 2.0, 7, 0xA5); r.pop("latency_us")
    out["selftest"] = r
    out["stranding"] = _core.stranding_test(ext, _core.NativeBackend(ext), g, flag, row, stg, 1024, 0.1)
else:
    result = probe._skeleton({"selftest": True, "timings": True, "replays": 60})
    backend = _core.NativeBackend(ext)
    try:
        probe._sections(ext, backend, result, True, True, 60)
    finally:
        backend.close()
    out["result"] = result
print("JSON" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    include = _build.find_cuda_include()
    cxx = shutil.which("g++") or shutil.which("c++")
    if include is None or cxx is None:
        pytest.skip("needs cuda.h and a C++ compiler to build the probe against the simulated driver")
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except Exception:
        pytest.skip("needs torch.utils.cpp_extension")
    if not is_ninja_available():
        pytest.skip("needs ninja")
    lib_dir = tmp_path_factory.mktemp("fake-libcuda")
    src = ROOT / "csrc" / "testing" / "fake_libcuda.cpp"
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", f"-I{include}",
                    "-o", str(lib_dir / "libcuda.so.1"), str(src), "-lpthread"], check=True)
    cache = tmp_path_factory.mktemp("probe-cache")
    return lib_dir, cache


def run_fake(fake_driver, arg: str, mode: str = "") -> dict:
    lib_dir, cache = fake_driver
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}",
           "PLE_HARNESS_CACHE": str(cache), "FAKE_CUDA_MODE": mode}
    p = subprocess.run([sys.executable, "-c", FAKE_SCRIPT, arg], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("JSON"))
    out = json.loads(line[4:])
    assert out["driver"]["ok"] and out["driver"]["version"] == 13000, out["driver"]
    return out


def test_native_lifecycle_fake_driver(fake_driver):
    out = run_fake(fake_driver, "lifecycle")
    assert out["zeroed"] and out["roundtrip"]
    assert out["node_types"] == ["BATCH_MEM_OP", "BATCH_MEM_OP", "MEMCPY"]
    assert out["refs"] == [1, 1]
    assert "still referenced by 1 captured graph" in out["free_while_captured"]
    assert out["replay"] == [True, True, 0]
    assert out["drained_after_destroy"] is True
    assert out["refs_after"] == [0, 0]
    assert out["free"] == [True, True, False]
    assert "freed" in out["read_after_free"]
    assert "aligned" in out["unaligned"]
    st = out["stranding"]
    assert st["status"] == "ok" and st["fired"] and st["released"] and st["replay_after_ok"]
    assert st["blocked_us"] >= 0.1e6 and st["flag_after_release"] == 0
    # One release drains the single WAIT; the guard may write again only when the flag was consumed
    # and the stream is still busy 2 ms after its previous write (a slow machine finishing the copy),
    # so the count is bounded by the release phase's length, never a tight loop.
    assert 1 <= st["releases"] <= 1 + st["release_us"] / 2000.0, st


def test_probe_sections_fake_driver_ok(fake_driver):
    r = run_fake(fake_driver, "full")["result"]
    assert r["status"] == "ok", r["reason"]
    assert r["memops"]["wait_value_32"] and r["memops"]["wait_value_64"] and r["memops"]["api"] == "v2"
    assert r["graph_capture"] is True and r["graph_capture_detail"]["replay_ok"] is True
    st = r["selftest"]
    assert st["status"] == "ok" and st["replays"] == 120 and st["mismatches"] == 0
    assert [p["replays"] for p in st["python_check"]] == [20, 20]
    assert st["stranding_guard"]["status"] == "ok"
    rows = r["timings"]["rows"]
    assert [x["row_bytes"] for x in rows] == ROW_SIZES
    assert all(x["deferred_us_median"] and x["sync_us_median"] and x["iters"] == 60 for x in rows)
    assert r["timings"]["h2d_bandwidth_gb_per_s"] is None  # no bandwidth reference without torch
    text = rendered(r)
    assert "Simulated GPU" in text and "64 KiB" in text


def test_probe_sections_fake_driver_no_memops(fake_driver):
    r = run_fake(fake_driver, "full", "no_memops")["result"]
    assert r["status"] == "fallback" and r["fallback"] == "synchronous"
    assert r["memops"]["wait_value_32"] is False and r["memops"]["trial"]["write_value_32"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert r["graph_capture"] is None and r["selftest"]["status"] == "skipped"
    rows = r["timings"]["rows"]  # the synchronous baseline is still measured
    assert all(x["deferred_us_median"] is None and x["sync_us_median"] for x in rows)


def test_probe_sections_fake_driver_no_capture(fake_driver):
    r = run_fake(fake_driver, "full", "no_capture")["result"]
    assert r["status"] == "fallback" and r["fallback"] == "synchronous"
    assert r["memops"]["wait_value_32"] is True and r["graph_capture"] is False
    assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in r["graph_capture_detail"]["error"]


@pytest.mark.parametrize("mode,field,verdict", [("skip_copy", "mismatches", "failed"),
                                                 ("no_reset", "flag_not_reset", "fallback")])
def test_selftest_catches_faults_fake_driver(fake_driver, mode, field, verdict):
    out = run_fake(fake_driver, "direct:" + mode, mode)
    assert out["selftest"][field] == out["selftest"]["replays"] == 40, out["selftest"]
    full = run_fake(fake_driver, "full", mode)["result"]
    # A copy that never lands fails the captured replay; a WRITE that never lands already fails
    # the eager memop trial, so the engine is told to use the synchronous path.
    assert full["status"] == verdict, full["reason"]
    if verdict == "fallback":
        assert full["memops"]["write_value_32"] is False and full["memops"]["trial_guard_fired"] is True


def test_stranding_guard_notices_non_blocking_wait_fake_driver(fake_driver):
    out = run_fake(fake_driver, "direct:no_wait", "no_wait")
    st = out["stranding"]
    assert st["status"] == "failed" and st["fired"] is False and "did not block" in st["reason"]


def test_module_entry_point_runs(tmp_path):
    """``python -m pleharness.probe`` (docs/gpu-quickstart.md's GPU box) starts: its __main__ imported a
    ``render`` the package no longer had after the renderers moved to render/ (found in session
    14). --json to a folder is a usage error before the probe runs."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pleharness.probe", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--replays" in r.stdout, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "pleharness.probe", "--json", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is a folder" in r.stderr, r.stderr[-2000:]
