"""scripts/compare_manifests.py: timings, ids and checkout paths are left out; anything else that
differs (a token hash, a status, a check) is reported."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compare_manifests.py"
spec = importlib.util.spec_from_file_location("compare_manifests", SCRIPT)
cm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cm)


def manifest(root: str, hash_: str = "aa", wall: float = 1.0, status: str = "pass") -> dict:
    return {"run_id": f"run-{root}", "status": "complete", "verdict": "pass",
            "engine": {"url": "http://127.0.0.1:4242", "ready_s": wall * 30,
                       "launch": {"model": f"/work/{root}/pleharness/model/tiny_llama"}},
            "phases": [{"name": "p", "status": status, "wall_s": wall, "ttft_s_median": wall / 9,
                        "decode_tok_per_s": 10 / wall}],
            "requests": [{"id": "r00001", "output_hash": hash_, "latency_s": wall,
                          "checks": [{"name": "usage", "status": "pass"}]}],
            "summary": {"hashes_matched": 1, "throughput_by_concurrency": {"1": 10 / wall}}}


def test_timings_ids_and_checkout_paths_are_left_out():
    assert cm.diff(manifest("main"), manifest("h13", wall=2.5)) == []


def test_a_token_hash_a_status_and_a_missing_check_are_reported():
    a, b = manifest("main"), manifest("main", hash_="bb", status="fail")
    b["requests"][0]["checks"] = []
    out = cm.diff(a, b)
    assert any(line.startswith("requests.0.output_hash: 'aa' -> 'bb'") for line in out), out
    assert any(line.startswith("phases.0.status") for line in out), out
    assert any(line.startswith("requests.0.checks: 1 items -> 0 items") for line in out), out


def test_exit_status(tmp_path):
    import json
    (tmp_path / "a.json").write_text(json.dumps(manifest("x")))
    (tmp_path / "b.json").write_text(json.dumps(manifest("x", hash_="cc")))
    assert cm.main([str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert cm.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    assert cm.main([str(tmp_path / "a.json")]) == 2


def test_schema_2_records_file_compares_with_inline_records(tmp_path):
    """A schema-2 manifest (records in requests.jsonl, only requests_count of its lines belong to
    it) compares equal to the schema-1 manifest of the same run, and a changed hash in the records
    file is still reported."""
    import json
    old = manifest("x")
    new = {k: v for k, v in manifest("x").items() if k != "requests"}
    new.update(schema_version=2, requests_file="requests.jsonl", requests_count=1)
    (tmp_path / "old.json").write_text(json.dumps(old))
    d = tmp_path / "new"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(new))
    rec = old["requests"][0]
    # a second line past requests_count (a kill mid-append) is not part of the manifest
    (d / "requests.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    assert cm.main([str(tmp_path / "old.json"), str(d / "manifest.json")]) == 0
    (d / "requests.jsonl").write_text(json.dumps(dict(rec, output_hash="zz")) + "\n")
    assert cm.main([str(tmp_path / "old.json"), str(d / "manifest.json")]) == 1


def test_probe_prompts_insert_positions_and_log_folders_are_left_out_not_the_probe_verdict():
    def m(seed, pos, folder, reproduce=True):
        return {"engine_probe": {"prompt_seed": seed, "seeded_samples_reproduce": reproduce,
                                 "evidence": {"greedy": {"prompt_hash": f"h{seed}"}}},
                "tables": {"insert": [{"note": f"inserted (client-seen decode position {pos})"}],
                           "fact_sources": [{"note": f"engine log {folder}/engine.log: B"}]}}
    assert cm.diff(m(1, 24, "/work/baseline/x"), m(2, 31, "/tmp/r1-after/after")) == []
    out = cm.diff(m(1, 24, "/a"), m(2, 24, "/a", reproduce=False))
    assert out == ["engine_probe.seeded_samples_reproduce: True -> False"], out


def test_unseeded_samples_outputs_are_random_by_design(tmp_path):
    import json
    for seed, want in ((None, 0), (7, 3)):  # a seeded sample's output is still compared
        paths = []
        for name, h in (("a", "aa"), ("b", "bb")):
            m = manifest("x", hash_=h)
            m["requests"][0].update(temperature=1.0, seed=seed, output_len=len(h) + (h == "bb"),
                                    output_ids=[1, 2] if h == "aa" else [1, 3])
            m["phases"][0]["checks"] = [{"name": "sampled_distribution", "status": "pass",
                                         "detail": f"p = 0.{h}"}]
            (tmp_path / f"{name}.json").write_text(json.dumps(m))
            paths.append(str(tmp_path / f"{name}.json"))
        assert len(cm.diff(*(cm.load(p) for p in paths))) == want


def test_the_compile_cache_an_engine_start_found_is_left_out():
    a, b = manifest("main"), manifest("main")
    a["timeline"] = {"engine_starts": [{"what": "engine", "cache": "cold", "cache_bytes": 5,
                                        "cache_written_bytes": 5, "cache_reload_failure": None}]}
    b["timeline"] = {"engine_starts": [{"what": "engine", "cache": "warm", "cache_bytes": 9,
                                        "cache_written_bytes": 0, "cache_reload_failure": "x"}]}
    assert cm.diff(a, b) == []
    b["timeline"]["engine_starts"][0]["what"] = "control engine"
    assert len(cm.diff(a, b)) == 1


def test_run_folders_ports_and_run_to_run_texts_are_left_out(tmp_path):
    """Two runs of the same command into other results folders (scripts/refactor_check.py):
    paths under the run's own folder and its results folder, an engine's --port in a launch
    command, where the probe's random prompts diverged and how many disconnected requests still
    finished are left out; a changed launch argument is not."""
    import json

    def write(root, port, pos, finished, arg="--block-size"):
        d = tmp_path / root / "run"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({
            "repro": f"{d}/repro.toml", "db": f"{tmp_path / root}/other/db",
            "launches": [{"command": ["python", "--port", str(port), arg, "16"]}],
            "notes": [f"solo repeats diverged at position {pos}",
                      f"requests finished normally {finished} of 4 sent"]}))
        return str(d / "manifest.json")
    a = write("before", 41234, 6, 4)
    # a checkout beside the results folder whose name begins with it is not a run folder
    assert cm.diff(cm._local("/x/before1/pleharness/m", [("/x/before", "<f>")]), "/x/y/pleharness/m") == []
    assert cm.main([a, write("after", 52345, 7, 3)]) == 0
    assert cm.main([a, write("later", 41234, 6, 4, arg="--max-num-seqs")]) == 1
