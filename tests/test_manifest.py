import json
import os

import pytest

from pleharness.manifest import (Manifest, PhaseRecord, RequestRecord, load_manifest,
                                 write_atomic, write_manifest)
from pleharness.run.rundir import new_run_dir
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
    assert data["schema_version"] == 2 and data["status"] == "running"
    assert "requests" not in data, "records live in the JSON Lines file, not the manifest"
    assert data["requests_file"] == "requests.jsonl" and data["requests_count"] == 1
    back = load_manifest(tmp_path)
    assert back.phases[0].decode_tok_per_s == pytest.approx(256 / 1.5)
    assert back.requests[0].match is True


def rec(i: int, phase: str = "C1", **kw) -> RequestRecord:
    return RequestRecord(id=f"r{i:05d}", scenario="t", phase=phase, concurrency=1,
                         prompt_key=f"p{i}", prompt_len=5, prompt_hash=f"h{i}", max_tokens=8,
                         **{"match": True, **kw})


def test_records_are_appended_not_rewritten(tmp_path):
    """Each write appends only the new records (the earlier lines' bytes stay where they were);
    a records change announced with records_changed() rewrites the file once."""
    path = tmp_path / "manifest.json"
    records = tmp_path / "requests.jsonl"
    m = Manifest(run_id="x")
    write_manifest(path, m)
    assert records.read_text() == ""
    m.requests += [rec(1), rec(2)]
    write_manifest(path, m)
    first = records.read_text()
    ino = records.stat().st_ino
    write_manifest(path, m)  # nothing new: nothing appended
    assert records.read_text() == first
    m.requests.append(rec(3, "C2"))
    write_manifest(path, m)
    text = records.read_text()
    assert text.startswith(first) and records.stat().st_ino == ino, "appended in place"
    assert [json.loads(x)["id"] for x in text.splitlines()] == ["r00001", "r00002", "r00003"]
    m.requests[0].match = False
    m.records_changed()
    write_manifest(path, m)
    assert json.loads(records.read_text().splitlines()[0])["match"] is False
    assert [r.id for r in load_manifest(tmp_path).requests] == ["r00001", "r00002", "r00003"]
    # a second manifest in the same folder keeps its own records file
    write_manifest(tmp_path / "control-manifest.json", Manifest(run_id="c", requests=[rec(9)]))
    assert (tmp_path / "control-requests.jsonl").read_text().count("\n") == 1
    assert [r.id for r in load_manifest(tmp_path / "control-manifest.json").requests] == ["r00009"]
    # written elsewhere (a copy of a loaded manifest): all records go to the new folder
    other = tmp_path / "copy"
    other.mkdir()
    write_manifest(other / "manifest.json", load_manifest(tmp_path))
    assert len(load_manifest(other).requests) == 3


def test_lines_beyond_requests_count_are_ignored(tmp_path):
    """A kill after the records were appended but before the manifest was replaced (or in the
    middle of an append) leaves lines the manifest does not cover: they are not read."""
    m = Manifest(run_id="x", requests=[rec(1), rec(2)])
    write_manifest(tmp_path / "manifest.json", m)
    with open(tmp_path / "requests.jsonl", "a") as f:
        f.write(rec(3).model_dump_json() + "\n" + rec(4).model_dump_json()[:40])
    assert [r.id for r in load_manifest(tmp_path).requests] == ["r00001", "r00002"]


def test_missing_or_short_records_file_names_it(tmp_path):
    write_manifest(tmp_path / "manifest.json", Manifest(run_id="x", requests=[rec(1), rec(2)]))
    (tmp_path / "requests.jsonl").write_text(rec(1).model_dump_json() + "\n")
    with pytest.raises(ValueError, match=r"requests.jsonl: 1 request records, but manifest.json "
                                         r"names 2 \(requests_count\)"):
        load_manifest(tmp_path)
    (tmp_path / "requests.jsonl").unlink()
    with pytest.raises(ValueError, match=r"request records .*requests.jsonl cannot be read"):
        load_manifest(tmp_path)
    (tmp_path / "requests.jsonl").write_text("{bad\n" + rec(2).model_dump_json() + "\n")
    with pytest.raises(ValueError, match=r"requests.jsonl, line 1: not a JSON request record"):
        load_manifest(tmp_path)


def test_schema_version_1_manifest_loads_and_reports(tmp_path):
    """A manifest written before the records moved out (schema version 1, records inline) still
    loads with its records, and `report` renders it."""
    from conftest import run_cli
    m = Manifest(run_id="old", status="complete", verdict="fail", exit_code=1,
                 phases=[PhaseRecord(index=0, name="C1", scenario="t", concurrency=1, requests=2,
                                     matched=1, mismatched=1, status="fail",
                                     reason="1 hash mismatch(es)")],
                 requests=[rec(1), rec(2, match=False, first_divergence=3,
                                      output_hash="ff" * 32)])
    data = json.loads(m.model_dump_json())
    data["schema_version"] = 1
    data["requests"] = [json.loads(r.model_dump_json()) for r in m.requests]
    for k in ("requests_file", "requests_count"):
        data.pop(k)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    back = load_manifest(tmp_path)
    assert back.schema_version == 1 and [r.id for r in back.requests] == ["r00001", "r00002"]
    assert back.requests[1].first_divergence == 3
    r = run_cli("report", str(tmp_path), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: FAIL" in r.stdout and "r00002" in r.stdout


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


RUN_ARGS = ["--scenario", "transitions", "--ladder", "2,1", "--repeats", "1", "--max-tokens", "8",
            "--vocab-size", "600"]


def test_run_writes_one_record_line_per_request(tmp_path):
    """A whole run against the double: requests.jsonl has exactly one line per request issued,
    the manifest counts them, and `report` reads them back."""
    from conftest import run_cli
    from doubles import FakeEngine
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id", "ok",
                    *RUN_ARGS, timeout=120)
        issued = eng.count
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    data = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    lines = (tmp_path / "ok" / data["requests_file"]).read_text().splitlines()
    assert len(lines) == data["requests_count"] == issued == sum(p["requests"]
                                                                   for p in data["phases"])
    assert len({json.loads(x)["id"] for x in lines}) == issued
    assert len(load_manifest(tmp_path / "ok").requests) == issued


def test_killed_run_leaves_readable_records(tmp_path):
    """SIGKILL (no handler runs) while a phase hangs: the manifest on disk is valid and its
    records file holds every request of the phases that finished."""
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    from doubles import FakeEngine
    with FakeEngine(lambda k, body: "never" if k == 22 else None) as eng:
        proc = subprocess.Popen([sys.executable, "-m", "pleharness", "stress", "--url", eng.url,
                                 "--results-dir", str(tmp_path), "--run-id", "killed", *RUN_ARGS,
                                 "--no-engine-probe",
                                 "--first-token-timeout", "60"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 90
        while eng.count < 22 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    m = load_manifest(tmp_path / "killed")
    assert m.status == "running" and m.exit_code is None
    done = [p for p in m.phases if p.status in ("pass", "fail")]
    assert [p.role for p in done] == ["warmup", "reference", "reference"]
    assert len(m.requests) == sum(p.requests for p in done) == 20
    assert {r.phase for r in m.requests} == {p.name for p in done}
    assert all(r.error is None for r in m.requests)


def test_stored_schema_1_run_loads_with_its_records():
    """A real schema version 1 manifest (a GPU run kept in docs/gpu-runs, records inline)."""
    from conftest import ROOT
    m = load_manifest(ROOT / "docs/gpu-runs/2026-11-30-g-random-ngram-control")
    assert m.schema_version == 1 and m.requests_file is None
    compared = [r for r in m.requests if r.match is not None]
    assert len(compared) == m.summary.hashes_compared > 0
    assert sum(1 for r in compared if r.match) == m.summary.hashes_matched


def test_manifest_json_reuses_old_phases_but_sees_changes(tmp_path):
    """The manifest on disk equals a full serialization after every kind of change: new phases,
    the last phases amended in place, an older phase amended and announced."""
    from pleharness.manifest import PHASES_REFRESHED
    path = tmp_path / "manifest.json"
    m = Manifest(run_id="x")

    def on_disk():
        return json.loads(path.read_text())

    def full():
        return json.loads(m.model_dump_json())
    for i in range(PHASES_REFRESHED + 5):
        m.phases.append(PhaseRecord(index=i, name=f"p{i}", scenario="t", concurrency=1))
        write_manifest(path, m)
        assert on_disk() == full()
    m.phases[-PHASES_REFRESHED].status = "fail"  # a scenario amends a recent phase
    write_manifest(path, m)
    assert on_disk() == full() and on_disk()["phases"][-PHASES_REFRESHED]["status"] == "fail"
    m.phases[0].reason = "attributed"  # an old phase, announced
    m.records_changed()
    write_manifest(path, m)
    assert on_disk()["phases"][0]["reason"] == "attributed" and on_disk() == full()
    m.phases[1] = PhaseRecord(index=1, name="new", scenario="t", concurrency=2)  # replaced
    write_manifest(path, m)
    assert on_disk() == full()
    del m.phases[3:]
    write_manifest(path, m)
    assert on_disk() == full() and len(load_manifest(tmp_path).phases) == 3


def test_engine_run_options_summary_are_typed_and_keep_every_key(tmp_path):
    """The three sections are models: keys read and written as attributes (None when absent),
    an unset key is not written, a whole section is assigned as its model (a dict is refused);
    the JSON reads as the dict it was, in field order."""
    from pleharness.manifest import EngineRecord, RunOptionsRecord, Summary
    m = Manifest(run_id="r")
    m.engine.assign(url="http://x", mode="attached")
    m.summary = Summary(phases_planned=3)
    m.summary.near_ties = 0
    m.summary.add_corrupt_reference({"method": "golden"})
    m.run_options = RunOptionsRecord(strict=True, near_tie_nats=2)
    with pytest.raises(TypeError, match="manifest.summary must be a Summary"):
        m.summary = {"phases_planned": 3}
    assert m.engine.mode == "attached" and m.engine.version is None
    assert "version" not in m.engine.model_fields_set
    assert m.summary.phases_planned == 3 and m.summary.corrupt_references == [{"method": "golden"}]
    path = tmp_path / "manifest.json"
    write_manifest(path, m)
    data = json.loads(path.read_text())
    assert list(data["engine"].items()) == [("mode", "attached"), ("url", "http://x")]
    assert data["summary"] == {"phases_planned": 3, "near_ties": 0,
                               "corrupt_references": [{"method": "golden"}]}
    assert data["run_options"] == {"strict": True, "near_tie_nats": 2}  # 2 stays an int
    back = load_manifest(path)
    assert back.engine == m.engine and back.run_options.near_tie_nats == 2
    copy = back.model_copy(update={"engine": EngineRecord(mode="launched")})
    assert json.loads(copy.model_dump_json())["engine"] == {"mode": "launched"}
    ctl = back.run_options.model_copy(update={"role": "control run"})  # pleharness.passes
    assert ctl.model_dump() == {"strict": True, "near_tie_nats": 2, "role": "control run"}
    data["engine"]["max_model_len"] = "4096"  # another JSON type: refused, never coerced
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="manifest.json"):
        load_manifest(path)


def test_a_section_has_no_mapping_api_and_refuses_unknown_keys(tmp_path):
    """Issue 34: no dict layer over the sections. Indexing, ``get``, ``update`` and ``in`` are
    gone; an unknown key is refused from a writer, and in a file with a clear error naming the
    file, the section and the key."""
    m = Manifest(run_id="r")
    m.summary.near_ties = 1
    with pytest.raises(TypeError):
        m.summary["near_ties"]
    with pytest.raises(TypeError):
        m.engine["mode"] = "attached"
    for name in ("get", "update", "setdefault", "pop", "keys", "items", "values"):
        assert not hasattr(m.summary, name), name
    with pytest.raises(TypeError):
        "near_ties" in m.summary  # noqa: B015
    assert m.summary != {"near_ties": 1}
    with pytest.raises(ValueError, match="no field"):
        m.run_options.new_key = 1
    with pytest.raises(ValueError, match="no field"):
        m.engine.assign(new_key=1)
    path = tmp_path / "manifest.json"
    write_manifest(path, m)
    data = json.loads(path.read_text())
    data["summary"]["retired_count"] = 3  # a key this version does not know
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"manifest.json: not a valid ple-harness manifest: "
                                         r"summary.retired_count +Extra inputs are not permitted"):
        load_manifest(path)
