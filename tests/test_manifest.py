import json
import os

import pytest

from pleharness.manifest import (Manifest, PhaseRecord, RequestRecord, load_manifest,
                                 write_atomic, write_manifest)
from pleharness.runner import new_run_dir
from pleharness.errors import UsageError


def test_manifest_roundtrip(tmp_path):
    m = Manifest(run_id="x")
    m.phases.append(PhaseRecord(index=0, name="C4", scenario="t", concurrency=4, requests=8,
                                matched=8, wall_s=1.5, completion_tokens=256,
                                decode_tok_per_s=256 / 1.5))
    m.requests.append(RequestRecord(id="r1", scenario="t", phase="C4", concurrency=4,
                                    prompt_key="p0", prompt_len=5, prompt_hash="ab", max_tokens=32,
                                    match=True))
    write_manifest(tmp_path / "manifest.json", m)
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["schema_version"] == 1 and data["status"] == "running"
    back = load_manifest(tmp_path)
    assert back.phases[0].decode_tok_per_s == pytest.approx(256 / 1.5)
    assert back.requests[0].match is True


def test_write_atomic_leaves_old_file_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "m.json"
    write_atomic(p, "old")

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(p, "new")
    assert p.read_text() == "old"
    assert [f.name for f in tmp_path.iterdir()] == ["m.json"]  # no temporary left behind


def test_load_manifest_bad_file(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable ple-harness manifest"):
        load_manifest(tmp_path)


def test_run_dirs_are_never_reused(tmp_path):
    a, da = new_run_dir(tmp_path)
    b, db = new_run_dir(tmp_path)
    assert a != b and da.is_dir() and db.is_dir()
    new_run_dir(tmp_path, "fixed")
    with pytest.raises(UsageError, match="exists already"):
        new_run_dir(tmp_path, "fixed")


def test_unwritable_results_dir(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(UsageError, match="cannot be created"):
        new_run_dir(f / "sub")


def test_root_cause_skips_wrappers_and_prefixes():
    from pleharness.engine.launch import root_cause_line
    log = """INFO starting
(Worker pid=9360) ERROR 11-29 18:06:27 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=9360) ERROR 11-29 18:06:27 [multiproc_executor.py:1063] ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).
(EngineCore pid=9337) ERROR 11-29 18:06:27 [core.py:1510] RuntimeError: Worker failed with error 'No common block size for 16', please check the stack trace above for the root cause
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: leaked
"""
    assert root_cause_line(log) == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert root_cause_line("all good\n") is None
    assert root_cause_line("RuntimeError: see above\n") == "RuntimeError: see above"
