"""Issue 37: an engine that outlives its harness is found and named by the next one.

Every launched engine has a pid file in its run folder (``engine.pid``) and an entry in the
per-user registry (``$PLE_HARNESS_CACHE/engines/<pgid>.json``), both removed when the engine is
stopped. When the harness and its watchdog are both SIGKILLed (a CI runner killing the
harness's whole process group), the engine lives on; the next harness names it
(``leftover_engines``) with the command that stops it. The "engine" here is the fault proxy of
tests/fault_engine.py in front of an in-process engine double: a real process of its own session,
as vLLM's server is, without a model to load."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, group_alive
from doubles import FakeEngine
from pleharness.engine import registry as reg_mod
from pleharness.engine.registry import leftover_engines, leftover_text

HARNESS = """
import sys, time
from pathlib import Path
from pleharness.engine.launch import EngineServer, LaunchSpec
spec = LaunchSpec(model="fake-model", python=sys.argv[2])
srv = EngineServer(spec, Path(sys.argv[1]), start_timeout_s=60)
srv.start()
print("ready", srv.proc.pid, srv._watchdog.pid if srv._watchdog else 0, flush=True)
if sys.argv[3] == "stop":
    srv.stop()
    print("stopped", flush=True)
else:
    time.sleep(600)
"""


@pytest.fixture
def registry(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PLE_HARNESS_CACHE", str(cache))
    return cache / "engines"


def _harness(tmp_path, upstream: str, run: str, mode: str) -> tuple[subprocess.Popen, int, int]:
    env = {**os.environ, "PLE_FAULT_UPSTREAM": upstream, "PLE_FAULT_WHEN": "never",
           "PLE_REAL_PYTHON": sys.executable, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    p = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path / run),
                          str(ROOT / "tests" / "fakepy" / "python"), mode],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = p.stdout.readline()
    assert line.startswith("ready"), line + p.stdout.read()[-2000:]
    _, pid, watchdog = line.split()
    return p, int(pid), int(watchdog)


def test_a_stopped_engine_leaves_no_pid_file_and_no_registry_entry(tmp_path, registry):
    with FakeEngine() as up:
        p, pid, _ = _harness(tmp_path, up.url, "clean", "stop")
        assert p.stdout.readline().startswith("stopped")
        p.wait(timeout=30)
    assert not (tmp_path / "clean" / "engine.pid").exists()
    assert not (registry / f"{pid}.json").exists()
    assert leftover_engines() == []


def test_an_engine_whose_harness_and_watchdog_were_killed_is_named(tmp_path, registry):
    with FakeEngine() as up:
        p, pid, watchdog = _harness(tmp_path, up.url, "killed", "sleep")
        try:
            rec = json.loads((tmp_path / "killed" / "engine.pid").read_text())
            assert (rec["pid"], rec["process_group"], rec["harness_pid"]) == (pid, pid, p.pid)
            assert (registry / f"{pid}.json").exists()
            assert leftover_engines() == []  # its harness is alive: not left over
            os.kill(watchdog, signal.SIGKILL)  # the whole harness group, as a CI runner does
            p.kill()
            p.wait(timeout=30)
            time.sleep(0.5)
            assert group_alive(pid), "the engine should outlive a harness without its watchdog"
            (found,) = leftover_engines()
            assert found["process_group"] == pid and found["url"] == rec["url"]
            text = leftover_text(found)
            assert f"kill -- -{pid}" in text and str(tmp_path / "killed" / "engine.pid") in text
        finally:
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while reg_mod._group_has_live_member(pid) and time.monotonic() < end:
            time.sleep(0.1)
        assert leftover_engines() == []  # gone: the stale entry is removed
        assert not (registry / f"{pid}.json").exists()


def test_a_session_warns_about_leftovers_before_its_first_launch(tmp_path, registry):
    """The next job names the leftover engine on its console before launching its own."""
    from rich.console import Console
    from pleharness.engine.session import EngineSession, Target
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    registry.mkdir(parents=True)
    (registry / f"{sleeper.pid}.json").write_text(json.dumps(
        {"pid": sleeper.pid, "process_group": sleeper.pid, "harness_pid": dead.pid,
         "url": "http://127.0.0.1:1", "started": "then", "command": ["sleep", "60"],
         "pid_file": "/somewhere/engine.pid"}))
    console = Console(record=True, width=300)
    target = Target(url=None, model_path="/nonexistent-model", served_name=None,
                    python=str(Path(sys.executable)), start_timeout_s=5)
    try:
        with EngineSession(console, tmp_path / "run", signals=False) as session:
            with pytest.raises(Exception) as err:
                session.start(target, gather=False)
        out = console.export_text()
        assert f"process group {sleeper.pid}" in out and f"kill -- -{sleeper.pid}" in out
        assert "1 engine(s) left by an earlier harness" in str(err.value)
    finally:
        sleeper.kill()
        sleeper.wait()
