"""The benchmark scripts under benchmarks/ keep working: each runs with tiny parameters, exits 0 and
prints / writes figures of the expected shape. These are not timed tests (the figures are in
BENCHMARKS.md); only ``vs_vllm_bench`` needs the real CPU engine (one engine start, about 1 min)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT, env={**os.environ, "COLUMNS": "160"})
    assert p.returncode == 0, f"{name} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def test_client_overhead_tiny(tmp_path):
    out = tmp_path / "overhead.json"
    p = run_script("client_overhead.py", "--requests", "30", "--concurrency", "1,4",
                   "--max-tokens", "8", "--paths", "client,threads,run_phase", "--profile",
                   "--json", str(out))
    assert re.search(r"client C=1\s+[\d.]+ req/s", p.stdout)
    data = json.loads(out.read_text())
    # the checkout's own pleharness is measured, with its asyncio request path
    assert data["pleharness"] == str(ROOT / "pleharness")
    assert data["client_impl"].startswith("asyncio")
    runs = {r["label"]: r for r in data["runs"]}
    assert set(runs) == {"client C=1", "threads C=1", "run_phase C=1", "client C=4",
                         "threads C=4", "run_phase C=4"}
    for r in runs.values():
        assert r["errors"] == 0
        assert r["req_per_s"] > 0 and r["tok_per_s"] > 0 and r["cpu_ms_per_req"] > 0
        assert r["tokens"] == 30 * 8
    # the client reuses its connections (it reads each stream to the end of the body)
    assert runs["client C=1"]["connections_per_req"] < 0.2
    assert runs["threads C=1"]["connections_per_req"] < 0.2
    assert abs(sum(data["profile_shares"].values()) - 1.0) < 1e-6
    assert "Unclosed" not in p.stderr, p.stderr[-2000:]


def test_scale_tiny(tmp_path):
    out = tmp_path / "scale.json"
    p = run_script("scale.py", "--sizes", "40,80", "--concurrency", "4", "--max-tokens", "4",
                   "--json", str(out))
    assert "growth exponent" in p.stdout
    data = json.loads(out.read_text())
    assert [r["exit_code"] for r in data["rows"]] == [0, 0]
    small, big = data["rows"]
    assert small["requests"] < big["requests"]
    assert big["manifest_bytes"] > small["manifest_bytes"] > 0
    assert big["writes"] > small["writes"]
    for r in data["rows"]:
        assert r["peak_rss_mib"] > 10 and r["last_phase_write_s"] > 0
        # the records (JSON Lines, one per request) carry the per-request bytes now
        assert 200 < r["records_bytes_per_request"] < 20000
        assert r["manifest_bytes_per_request"] < r["records_bytes_per_request"]
    assert big["records_bytes"] > small["records_bytes"]
    assert data["growth_exponents"]["manifest_bytes"] > 0


def test_suite_walltime_on_double(tmp_path):
    out = tmp_path / "suite.json"
    p = run_script("suite_walltime.py", "--double", "--json", str(out), "--",
                   "--scenario", "transitions", "--vocab-size", "600", "--ladder", "2,1",
                   "--repeats", "1", "--max-tokens", "4")
    total = float(re.search(r"total_s ([\d.]+)", p.stdout).group(1))
    assert total > 0
    data = json.loads(out.read_text())
    assert data["exit_code"] == 0 and data["verdict"] == "pass"
    split = data["split_s"]
    for key in ("harness start-up", "engine start (ready_s)", "references (all scenarios)",
                "scenario transitions", "shutdown (engine stop, summary)", "report / exit"):
        assert key in split and split[key] >= 0
    assert split["references (all scenarios)"] > 0
    # the parts (without the "of which" line) add up to the process wall time
    parts = sum(v for k, v in split.items() if not k.startswith("  "))
    assert parts == pytest.approx(data["total_s"], rel=0.05, abs=0.05)


@pytest.mark.engine
@pytest.mark.nightly
def test_vs_vllm_bench_tiny(tmp_path):
    out = tmp_path / "vs.json"
    p = run_script("vs_vllm_bench.py", "--pairs", "1", "--concurrency", "1", "--num-prompts", "4",
                   "--prompt-len", "16", "--max-tokens", "8", "--no-warmup", "--json", str(out),
                   timeout=600)
    m = re.search(r"C=1 pair 1: .* ratio ([\d.]+)", p.stdout)
    assert m and float(m.group(1)) > 0
    data = json.loads(out.read_text())
    s = data["by_concurrency"]["1"]
    pair = s["pairs"][0]
    assert pair["harness"]["errors"] == 0 and pair["vllm"]["errors"] == 0
    assert pair["harness"]["tokens"] == pair["vllm"]["tokens"] == 4 * 8
    assert s["median_ratio"] > 0 and s["harness_ttft_ms_median"] > 0
    assert s["vllm_ttft_ms_median"] > 0


def test_write_cost_tiny(tmp_path):
    out = tmp_path / "write_cost.json"
    p = run_script("write_cost.py", "--phases", "4,40", "--per-phase", "10", "--repeats", "2",
                   "--json", str(out))
    assert "growth exponent" in p.stdout
    data = json.loads(out.read_text())
    assert [r["phases"] for r in data["rows"]] == [4, 40]
    for r in data["rows"]:
        assert all(r[f"{h}_ms"] > 0 for h in ("inline", "append", "append+cache"))
    assert set(data["growth_exponents"]) == {"inline", "append", "append+cache"}


def test_cli_startup_tiny():
    p = run_script("cli_startup.py", "--repeats", "1")
    assert re.search(r"this tree +median \d+\.\d{3} s", p.stdout), p.stdout
    assert re.search(r"interpreter +median \d+\.\d{3} s", p.stdout), p.stdout
