"""Issue 33: engines of one job side by side (pleharness.engine.side_by_side) and the order in which
explain spends its launches (pleharness.explain_plan). No engine: the plan's arithmetic, and the
worker pool with real process groups (a stand-in "python" that never becomes ready)."""
import os
import signal
import threading
import time

import pytest

from conftest import run_cli
from pleharness.engine.launch import EngineServer, LaunchSpec
from pleharness.engine.side_by_side import GIB, parse_parallel, plan, run_side_by_side
from pleharness.errors import EngineError, UsageError
from pleharness.explain import Case, Suspect
from pleharness.explain_plan import estimate, implied_by, order_first_round
from pleharness.manifest import Manifest

H200 = [{"index": 0, "memory_total_mib": 143771.0, "memory_used_mib": 600.0}]


def test_parse_parallel():
    assert parse_parallel("auto") is None and parse_parallel(None) is None
    assert parse_parallel("3") == 3 and parse_parallel(2) == 2
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(UsageError, match="--parallel-engines"):
            parse_parallel(bad)


def test_one_engine_is_launched_as_configured():
    sb = plan(1, gpus=H200, model=GIB, engine_args=[], engine_env={})
    assert sb.n == 1 and sb.add == []


def test_gpu_plan_fixes_the_kv_cache_and_a_small_share():
    sb = plan(None, gpus=H200, model=GIB, engine_args=[], engine_env={})
    assert sb.n == 4  # auto: at most MAX_AUTO, 8.1 GiB each of 140 free
    kv = next(a for a in sb.add if a.startswith("--kv-cache-memory-bytes="))
    share = float(next(a for a in sb.add if a.startswith("--gpu-memory-utilization="))
                  .split("=")[1])
    assert int(kv.split("=")[1]) == 4 * GIB
    # each engine's start-up check (free >= share x total) holds with the 3 others running
    need = 1.1 * GIB + 4 * GIB + 3 * GIB
    assert share * 143771 * 2 ** 20 >= need and share * 143771 * 2 ** 20 <= (143171 * 2 ** 20
                                                                            - 3 * need)
    # the launch's own KV cache size and share are kept
    own = plan(2, gpus=H200, model=GIB, engine_args=["--kv-cache-memory-bytes", str(2 * GIB),
                                                     "--gpu-memory-utilization=0.3"],
               engine_env={})
    assert own.n == 2 and own.add == []


def test_gpu_plan_refuses_what_does_not_fit():
    full = [{"index": 0, "memory_total_mib": 81559.0, "memory_used_mib": 60000.0}]
    with pytest.raises(UsageError, match=r"--parallel-engines 4: 4 engines do not fit on the "
                                         r"GPU: .*at most 1 fit"):
        plan(4, gpus=full, model=8 * GIB, engine_args=[], engine_env={})
    assert plan(None, gpus=full, model=8 * GIB, engine_args=[], engine_env={}).n == 1


def test_cpu_plan_auto_is_one_and_too_many_is_refused_with_the_arithmetic():
    assert plan(None, gpus=None, model=GIB, engine_args=[], engine_env={}).n == 1
    ok = plan(2, gpus=[], model=GIB, engine_args=[], engine_env={"VLLM_CPU_KVCACHE_SPACE": "1"},
              available=16 * GIB)
    assert ok.n == 2 and ok.add == []
    with pytest.raises(UsageError) as e:
        plan(8, gpus=None, model=GIB, engine_args=[], engine_env={"VLLM_CPU_KVCACHE_SPACE": "4"},
             available=16 * GIB)
    msg = str(e.value)
    assert "8 CPU engines need about 56.0 GiB" in msg and "16.0 GiB available" in msg
    assert "--parallel-engines 2" in msg  # what fits


def test_run_side_by_side_keeps_order_and_returns_errors():
    seen = []
    last_done = threading.Event()

    def job(i):
        def f():
            if i == 0:  # ends last, whatever the machine's speed
                assert last_done.wait(30)
            if i == 1:
                raise EngineError("no start")
            if i == 2:
                last_done.set()
            return i
        return f
    out = run_side_by_side([job(i) for i in range(3)], 3, on_done=lambda i, r: seen.append(i))
    assert out[0] == 0 and isinstance(out[1], EngineError) and out[2] == 2
    assert sorted(seen) == [0, 1, 2] and seen[-1] == 0  # on_done as each ends
    last_done.set()
    assert run_side_by_side([job(0), job(2)], 1) == [0, 2]


def _never_ready(tmp_path):
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\nexec sleep 300\n")
    py.chmod(0o755)
    return LaunchSpec(model="m", python=str(py))


def _alive(pid):
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_signal_stops_every_side_by_side_engine(tmp_path):
    """SIGTERM while two engines start side by side: both process groups are killed, the
    workers end, and the exception reaches the caller at once (not after the start timeout)."""
    servers = []
    # one stand-in python, written once: a job rewriting it while another execs it fails with
    # ETXTBSY on a loaded machine, which frees a worker for the third job
    spec = _never_ready(tmp_path)

    def start(k):
        def f():
            srv = EngineServer(spec, tmp_path, start_timeout_s=120, log_name=f"e{k}")
            servers.append(srv)
            srv.start()
        return f

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop()
    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        t0 = time.monotonic()
        with pytest.raises(Stop):
            run_side_by_side([start(0), start(1), start(2)], 2)
        took = time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert took < 30, took
    assert 1 <= len(servers) <= 2  # the third never started: it waited for a free worker
    for srv in servers:  # (on a slow machine one may not have reached its launch: never will)
        if srv.proc is not None:
            assert srv.proc.poll() is not None and not _alive(srv.proc.pid)
    assert not [t for t in threading.enumerate() if t.name.startswith("side-by-side")]


# -- explain's order -----------------------------------------------------------------------
def _suspects():
    return [Suspect("speculative decoding", "", drop=["--speculative-config"]),
            Suspect("CUDA graphs", "", add=["--enforce-eager"]),
            Suspect("FULL CUDA graphs", "", add=['--compilation-config={"cudagraph_mode": '
                                                 '"PIECEWISE"}'],
                    drop=["--compilation-config", "-O"], feature="CUDA graphs",
                    within="CUDA graphs")]


def _run(control=None, attribution="only_under_test", ready_s=60.0):
    m = Manifest(run_id="r", engine={"mode": "launched", "ready_s": ready_s,
                                     **({"control_engine": control} if control else {})})
    from pleharness.manifest import RequestRecord
    rec = RequestRecord.model_validate({
        "id": "r1", "scenario": "s", "phase": "p", "concurrency": 4, "prompt_key": "k",
        "prompt_hash": "h", "prompt_len": 5, "max_tokens": 8, "match": False,
        "divergence": {"position": 5, "class": "hard", "fails": True,
                       "attribution": attribution}})
    m.requests = [rec]
    return m


def test_first_round_narrower_first_and_the_runs_control_first():
    order = [s.name for s in order_first_round(_run(), _suspects())]
    assert order == ["speculative decoding", "FULL CUDA graphs", "CUDA graphs"]
    ctl = {"dropped": [], "added": ['--compilation-config={"cudagraph_mode": "PIECEWISE"}']}
    order = [s.name for s in order_first_round(_run(ctl), _suspects())]
    assert order == ["FULL CUDA graphs", "speculative decoding", "CUDA graphs"]
    # a control that did not remove the divergences gives no priority
    order = [s.name for s in order_first_round(_run(ctl, "also_in_control"), _suspects())]
    assert order[0] == "speculative decoding"


def test_a_broader_suspect_is_implied_when_the_narrower_removed_every_case():
    sus = _suspects()
    c1 = Case(1, "h", 4, "p", ["r1"], 5, {}, minimal="alone")
    c2 = Case(2, "h2", 4, "p", ["r2"], 5, {}, minimal="alone")
    c1.results["FULL CUDA graphs"] = {"fails": False, "vanishes": True}
    c2.results["FULL CUDA graphs"] = {"fails": True, "vanishes": False}
    assert implied_by(sus[1], [c1], sus).name == "FULL CUDA graphs"
    assert implied_by(sus[1], [c1, c2], sus) is None  # c2 still needs the broader launch
    assert implied_by(sus[0], [c1], sus) is None


def test_estimate_from_the_runs_measured_start():
    e = estimate(_run(ready_s=60.0), 7, 1, 600)
    assert e["waves"] == 7 and e["about_s"] == 525 and e["fits_budget"] is True
    assert "7 launch(es) in the first round: about 8.8 min" in e["text"]
    e2 = estimate(_run(ready_s=60.0), 7, 4, 100)
    assert e2["waves"] == 2 and e2["about_s"] == 150 and e2["fits_budget"] is False
    assert "4 side by side" in e2["text"] and "will be skipped" in e2["text"]


def test_stress_refuses_more_cpu_engines_than_fit_before_anything(tmp_path):
    r = run_cli("stress", "--parallel-engines", "500", "--results-dir", str(tmp_path),
                "--run-id", "x", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--parallel-engines 500: 500 CPU engines need about" in r.stderr
    assert not (tmp_path / "x").exists()


def test_every_launch_of_a_job_names_one_compile_cache(monkeypatch, tmp_path):
    from pleharness.engine.session import launch_record
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    spec = LaunchSpec(model="m", python="p")
    assert spec.env["VLLM_CACHE_ROOT"] == str(tmp_path / "xdg" / "vllm")  # vLLM's own default
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cc"))
    rec = launch_record(LaunchSpec(model="m", python="p"))
    assert rec["compile_cache"] == rec["env"]["VLLM_CACHE_ROOT"] == str(tmp_path / "cc")
    # a launch that sets its own keeps it
    assert LaunchSpec(model="m", python="p", env={"VLLM_CACHE_ROOT": "/x"}).env[
        "VLLM_CACHE_ROOT"] == "/x"
