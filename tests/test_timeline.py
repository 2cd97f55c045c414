"""The jobs' time stamps and the compile cache (issue 49): ``pleharness.timeline``, what an engine
start did to the compile cache (``pleharness.engine.compile_cache.compile_cache_state``), a run's time
stamps from its manifest (``pleharness.summary.stamp_timeline``), and ``--compile-cache``'s bad input. The
engine test (a cold start, then a warm one on the same cache) is in tests/test_e2e_facts.py."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import os

import pytest

from conftest import run_cli
from pleharness.cli.assemble import compile_cache_dir
from pleharness.engine.compile_cache import (compile_cache_bytes, compile_cache_reload_failure,
                                            compile_cache_state)
from pleharness.errors import UsageError
from pleharness.manifest import Manifest, PhaseRecord
from pleharness.summary import stamp_timeline
from pleharness.timeline import COMMAND_STARTED, EngineStart, Timeline, seconds_at, since_start


def test_a_time_stamp_is_the_first_time_and_an_unknown_event_is_an_error():
    t = Timeline()
    t.mark("failing_run", 12.0)
    t.mark("failing_run", 30.0)  # later: the first stays
    t.mark("failing_run", 5.0)  # earlier (found after the fact): it wins
    t.mark("confirmed")
    assert t.failing_run_s == 5.0 and 0 <= t.confirmed_s <= since_start()
    assert t.reproducer_s is None and t.diagnosis_s is None
    with pytest.raises(AttributeError, match="no time stamp 'found'"):
        t.mark("found")


def test_the_summary_line_names_what_happened_in_order_and_each_engine_start():
    t = Timeline(failing_run_s=35.2, confirmed_s=190.0, diagnosis_s=120.4, engine_starts=[
        EngineStart(what="engine", ready_s=171.4, cache="cold", cache_written_bytes=3 * 2**20),
        EngineStart(what="control engine", ready_s=61.0, cache="warm"),
        EngineStart(what="engine", ready_s=20.0)])
    assert t.line() == ("failing run after 35 s; diagnosis after 120 s; confirmed after 190 s; "
                        "engine starts: engine 171 s (compile cache cold: 3.0 MiB written), "
                        "control engine 61 s (compile cache warm), engine 20 s")
    assert Timeline().line() == ""


def test_seconds_at_reads_a_manifest_time_against_the_commands_start():
    iso = datetime.fromtimestamp(COMMAND_STARTED + 42.25, timezone.utc).isoformat()
    assert seconds_at(iso) == pytest.approx(42.2, abs=0.11)
    assert seconds_at(None) is None and seconds_at("yesterday") is None


def test_compile_cache_size_counts_only_compiled_artifacts(tmp_path):
    assert compile_cache_bytes(None) is None
    assert compile_cache_bytes(str(tmp_path)) == 0  # no torch_compile_cache yet
    (tmp_path / "modelinfos").mkdir()
    (tmp_path / "modelinfos" / "m.json").write_bytes(b"x" * 100)  # any start writes these
    art = tmp_path / "torch_compile_cache" / "abc" / "rank_0_0"
    art.mkdir(parents=True)
    (art / "graph.py").write_bytes(b"y" * 300)
    assert compile_cache_bytes(str(tmp_path)) == 300


@pytest.mark.parametrize("before, after, state, written", [
    (0, 300, "cold", 300), (300, 300, "warm", 0), (None, 300, None, None),
    (500, 300, "warm", 0)])  # shrank (another job cleaned it): nothing written by this start
def test_a_start_that_wrote_compiled_artifacts_was_cold(before, after, state, written):
    rec = compile_cache_state("/cc", before, after)
    assert rec == {"compile_cache": "/cc", "cache": state, "cache_written_bytes": written,
                   "cache_bytes": after}


def test_stamp_timeline_reads_the_failing_phase_and_the_reproducer_file(tmp_path):
    now = datetime.now(timezone.utc)
    m = Manifest(run_id="r", verdict="fail")
    m.phases = [PhaseRecord(index=0, name="a", scenario="s", concurrency=1, status="pass",
                            ended_at=now.isoformat()),
                PhaseRecord(index=1, name="b", scenario="s", concurrency=4, status="fail",
                            ended_at=now.isoformat())]
    (tmp_path / "repro.toml").write_text("")
    m.tables["reproducers"] = [{"path": "repro.toml"}, {"path": "gone.toml"}]
    stamp_timeline(m, tmp_path, [EngineStart(what="engine", ready_s=3.0)])
    t = m.timeline
    assert t.failing_run_s == pytest.approx(time.time() - COMMAND_STARTED, abs=2)
    assert t.reproducer_s == pytest.approx(
        (tmp_path / "repro.toml").stat().st_mtime - COMMAND_STARTED, abs=0.11)
    assert t.ended_s is not None
    assert [e.what for e in t.engine_starts] == ["engine"]
    m.verdict, m.timeline = "pass", Timeline(failing_run_s=3.0)  # a fuzz failure not kept
    stamp_timeline(m, tmp_path, [])
    assert m.timeline.failing_run_s is None


def test_compile_cache_folder_is_made_absolute_and_a_second_root_is_refused(tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    # not made until an engine is launched: a later usage error leaves nothing behind
    assert compile_cache_dir("cc") == str(tmp_path / "cc") and not (tmp_path / "cc").exists()
    (tmp_path / "cc").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache_dir("~/cc2") == str(tmp_path / "cc2")
    with pytest.raises(UsageError, match="VLLM_CACHE_ROOT=/elsewhere is set too"):
        compile_cache_dir("cc", "/elsewhere")
    assert compile_cache_dir("cc", str(tmp_path / "cc")) == str(tmp_path / "cc")  # the same
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is not a folder"):
        compile_cache_dir(str(tmp_path / "file" / "cc"))
    with pytest.raises(UsageError, match="is not a folder"):
        compile_cache_dir(str(tmp_path / "file"))
    (tmp_path / "ro").mkdir(mode=0o500)
    if not os.access(tmp_path / "ro", os.W_OK):  # root writes anywhere
        with pytest.raises(UsageError, match="cannot create it"):
            compile_cache_dir(str(tmp_path / "ro" / "a" / "b"))


def test_compile_cache_bad_input_exits_2_before_anything_starts(tmp_path):
    r = run_cli("stress", "--compile-cache", str(tmp_path / "cc"), "--engine-env",
                "VLLM_CACHE_ROOT=/elsewhere", "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "give the folder once" in r.stderr, r.stderr
    r = run_cli("stress", "--compile-cache", str(tmp_path / "cc"), "--url",
                "http://127.0.0.1:9", "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and "--compile-cache" in r.stderr, r.stderr
    assert not (tmp_path / "res").exists() and not (tmp_path / "cc").exists()
    # a usage error found after --compile-cache was read leaves no folder behind either
    r = run_cli("stress", "--compile-cache", str(tmp_path / "cc"), "--ladder", "x",
                "--results-dir", str(tmp_path / "res"))
    assert r.returncode == 2 and not (tmp_path / "cc").exists(), r.stderr


def test_the_engines_own_reason_for_compiling_again_is_kept():
    log = ("(Worker pid=4558) WARNING 12-06 21:51:46 [decorators.py:333] [backbone] Compiling "
           "model again due to a load failure from /cc/torch_compile_cache/torch_aot_compile/7ae/"
           "rank_0_0/model, reason: 'function' object has no attribute 'finalize_loading'\n")
    assert compile_cache_reload_failure(log) == \
        "'function' object has no attribute 'finalize_loading'"
    assert compile_cache_reload_failure("saved AOT compiled function to /cc/x") is None
    e = EngineStart(what="engine", ready_s=40, cache="cold", cache_written_bytes=2**20,
                    cache_reload_failure="no attribute 'finalize_loading'")
    assert e.text() == ("engine 40 s (compile cache cold: 1.0 MiB written; its cached graph did "
                        "not load: no attribute 'finalize_loading')")


def test_an_engine_start_keeps_its_ready_time_to_the_millisecond():
    # CI failure of stop 54: an engine double ready in 40 ms was recorded as ready after 0.0 s
    s = EngineStart.measured("engine", 0.0404, cache="warm")
    assert s.ready_s == 0.04 and s.cache == "warm" and 0 <= s.at_s <= since_start()
    assert EngineStart.measured("engine", None).ready_s == 0
