"""Engine lifecycle on the real CPU engine: a killed engine and an interrupted harness each leave a
valid manifest that says so, no engine process, and no API key in anything the run wrote."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, group_alive, launched_pid

pytestmark = pytest.mark.engine

KEY = "sk-ple-test-7f3a9c1e5b"


def start_stress(tmp_path: Path, run_id: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PLE_TEST_KEY": KEY, "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "pleharness", "stress", "--results-dir",
                             str(tmp_path), "--run-id", run_id, "--api-key-env", "PLE_TEST_KEY",
                             *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for_load_phase(run_dir: Path, proc: subprocess.Popen, timeout: float = 600) -> dict:
    """Wait until the manifest shows a finished load phase of the ladder (the next one runs)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        try:
            m = json.loads((run_dir / "manifest.json").read_text())
            if any(p["role"] == "load" and p["status"] == "pass" for p in m["phases"]):
                return m
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("no load phase finished in time")


def assert_no_key(run_dir: Path, output: str) -> None:
    assert KEY not in output
    for f in run_dir.iterdir():
        assert KEY not in f.read_text(errors="replace"), f"API key leaked into {f.name}"


def disrupt_mid_run(tmp_path: Path, run_id: str, disrupt) -> tuple[subprocess.Popen, str, Path,
                                                                     int]:
    """Start a long ladder, wait until a load phase finished, call ``disrupt(proc, engine_pid)``,
    collect the output. Returns (process, output, run folder, engine pid)."""
    proc = start_stress(tmp_path, run_id, "--scenario", "transitions", "--repeats", "4")
    run_dir = tmp_path / run_id
    try:
        wait_for_load_phase(run_dir, proc)
        pid = launched_pid(run_dir)
        disrupt(proc, pid)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a failed wait: SIGTERM, so that the session stops the engine
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    return proc, out, run_dir, pid


@pytest.mark.nightly
def test_engine_killed_mid_run(tmp_path):
    # the API server process dies mid-run
    proc, out, run_dir, pid = disrupt_mid_run(tmp_path, "killed",
                                              lambda p, pid: os.kill(pid, signal.SIGKILL))
    m = json.loads((run_dir / "manifest.json").read_text())
    assert proc.returncode == 3, out[-3000:]
    assert m["status"] == "engine_died" and m["verdict"] == "error" and m["exit_code"] == 3
    job = m["job"]  # the job record (issue 50): the same words, the steps done before it died
    assert (job["status"], job["exit_code"], job["steps_done"]) == ("engine_died", 3, ["engines"])
    assert m["summary"]["phases_completed"] < m["summary"]["phases_planned"] == 32
    assert m["log_tail"], "the manifest keeps the last lines of engine.log"
    assert "engine error" in out
    assert not group_alive(pid), "engine processes survived"
    assert "<redacted>" in (run_dir / "launcher.log").read_text()
    assert_no_key(run_dir, out)


@pytest.mark.nightly
def test_sigint_interrupts_cleanly(tmp_path):
    proc, out, run_dir, pid = disrupt_mid_run(tmp_path, "intr",
                                              lambda p, pid: p.send_signal(signal.SIGINT))
    assert proc.returncode == 130, out[-3000:]
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["status"] == "interrupted" and m["reason"] == "interrupted by SIGINT"
    assert m["exit_code"] == 130 and m["ended_at"]
    assert (m["job"]["status"], m["job"]["exit_code"], m["job"]["reason"]) == (
        "interrupted", 130, "interrupted by SIGINT")
    assert 0 < m["summary"]["phases_completed"] < 32
    assert not group_alive(pid), "engine processes survived"
    assert_no_key(run_dir, out)


def _running_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run: a zombie (state Z) is dead, only not yet
    reaped (an init that does not reap, as in some containers, keeps it listed)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def _gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _running_members(pid):
            return True
        time.sleep(0.2)
    return not _running_members(pid)


def test_sigkill_of_the_harness_while_the_engine_starts_leaves_no_engine(tmp_path):
    """Issue 37: SIGKILL of the harness (no handler can run) while the engine starts, once the
    engine has started its engine-core child (the process that holds the device): the engine's
    watchdog ends its whole process group within 10 s. While it serves: the nightly test below."""
    proc = start_stress(tmp_path, "kill9-start", "--scenario", "transitions")
    run_dir = tmp_path / "kill9-start"
    pid = None
    try:
        end = time.monotonic() + 120
        while pid is None and time.monotonic() < end:
            try:
                pid = launched_pid(run_dir)
            except OSError:
                pass
            time.sleep(0.05)
        assert pid is not None, "the engine was never launched"
        end = time.monotonic() + 90  # the API server spawns its engine core early in its start
        while len(_running_members(pid)) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        assert proc.poll() is None, "the harness ended before the engine was up"
        assert len(_running_members(pid)) >= 2, "the engine never started a child process"
        proc.kill()
        proc.wait(timeout=30)
        assert _gone_within(pid, 10), "the engine outlived a SIGKILL of the harness (starting)"
    finally:
        if pid and group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.nightly
def test_sigkill_of_the_harness_while_the_engine_serves_leaves_no_engine(tmp_path):
    """Issue 37: SIGKILL of the harness mid-run: the watchdog ends the engine's group in 10 s."""
    proc, out, run_dir, pid = disrupt_mid_run(tmp_path, "kill9-serve",
                                              lambda p, pid: p.kill())
    try:
        assert proc.returncode == -signal.SIGKILL
        assert _gone_within(pid, 10), "the engine outlived a SIGKILL of the harness (serving)"
    finally:
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
