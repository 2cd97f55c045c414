"""Issue 25 item 6 and issue 51 item 4: ``pip install`` of a wheel built from this repository is
the documented tool, and names the commit it was built from.

The wheel goes into a fresh virtual environment that holds only the harness and its runtime
dependencies (from PyPI); the engine is the existing one (``--engine-python`` = this test
session's interpreter, which has vLLM), as docs/ci.md allows for a runner whose engine lives in
its own environment. Every command runs from a folder outside the checkout, so nothing can come
from the repository: the shipped profile is found by name from the installed package
(``--engine-profile cpu-ngram``), fuzz imports hypothesis from the runtime dependencies, and report
renders the run. Budgets are tiny (a two-level ladder of 8-token requests, 5 fuzz examples).
Building and installing take about a minute (the runtime dependencies come from the package
index), so every test here is nightly; only the one that drives an engine needs the engine.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.nightly


def sh(*cmd, cwd, timeout=600, env=None):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**clean, **(env or {}), "COLUMNS": "200"})


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the installed console script, a working folder outside the checkout)."""
    d = tmp_path_factory.mktemp("wheel")
    r = sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", d / "dist", ROOT, cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (d / "dist").glob("ple_harness-*.whl")
    r = sh(sys.executable, "-m", "venv", d / "venv", cwd=d)
    assert r.returncode == 0, r.stderr
    r = sh(d / "venv" / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    work = d / "work"
    work.mkdir()
    return d / "venv" / "bin" / "ple-harness", work


def git_commit() -> str:
    """The checkout's commit as hatch_build.py records it (12 hex digits, -dirty when a tracked
    file differs from it)."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True).stdout
    return head + ("-dirty" if dirty.strip() else "")


def test_installed_wheel_lists_scenarios_and_names_its_commit(installed):
    """Issue 51 item 4: from a folder outside the checkout, the installed ple-harness lists every
    shipped scenario, plans a shipped suite on a shipped profile (both inside the wheel), and
    --version names the commit the wheel was built from."""
    from pleharness import __version__
    exe, work = installed
    r = sh(exe, "scenarios", cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    listed = {ln.split(" (")[0] for ln in r.stdout.splitlines() if " (" in ln}
    shipped = {p.stem for p in (ROOT / "scenarios").glob("*.toml")}
    assert shipped and shipped <= listed, shipped - listed
    r = sh(exe, "scenarios", "--check", "premerge", "--facts", "gpu-tp4-mtp.example", cwd=work)
    assert r.returncode == 0 and "no usage error" in r.stdout, r.stdout + r.stderr
    r = sh(exe, "--version", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ple-harness {__version__} (commit {git_commit()})"


@pytest.mark.engine
def test_installed_wheel_runs_the_documented_commands(installed, request):
    exe, work = installed
    py = exe.parent / "python"
    r = sh(py, "-c", "import pleharness, hypothesis; print(pleharness.__file__)", cwd=work)
    assert r.returncode == 0 and "site-packages" in r.stdout, r.stdout + r.stderr
    # the shipped profile by name, from the installed package (not ./profiles)
    r = sh(exe, "stress", "--engine-profile", "cpu-ngram", "--engine-python", sys.executable,
           "--scenario", "transitions", "--ladder", "2,1", "--repeats", "1", "--max-tokens", "8",
           "--results-dir", "results", "--run-id", "smoke", cwd=work, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    m = json.loads((work / "results" / "smoke" / "manifest.json").read_text())
    assert m["engine"]["launch"]["profile"].endswith("pleharness/profiles_data/cpu-ngram.toml")
    assert "--speculative-config" in m["engine"]["launch"]["engine_args"]
    r = sh(exe, "report", "results/smoke", "--format", "markdown", cwd=work)
    assert r.returncode == 0 and "### Phases" in r.stdout, r.stderr[-2000:]
    # fuzz imports hypothesis (a runtime dependency): attach to the session's engine, started
    # only now so that one engine runs at a time when this test runs alone
    eng = request.getfixturevalue("cpu_engine")
    r = sh(exe, "fuzz", "--url", eng.url, "--block-size", "32", "--chunk-size", "256",
           "--num-speculative-tokens", "3", "--max-num-seqs", "8", "--max-examples", "5",
           "--seed", "5", "--max-tokens", "6", "--no-golden", "--db", work / "fuzz-db",
           "--results-dir", "results", "--run-id", "fz", cwd=work, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    fz = json.loads((work / "results" / "fz" / "manifest.json").read_text())
    s = fz["tables"]["fuzz_summary"][0]
    assert 0 < s["examples_run"] <= 5
    # the engine probe (on, as for users) chose the seeded draws: on this engine seeded samples
    # do not reproduce alone or in a batch, so none were drawn (a probe that measured them alone
    # only let them in once, and this run failed with 21 hard divergences)
    p = fz["engine_probe"]
    assert p["status"] == "measured" and s["space"]["sampled"] is bool(p["seeded_samples_reproduce"])
    r = sh(exe, "report", "results/fz", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]


def test_installed_probe_explains_unavailable(installed):
    exe, work = installed
    r = sh(exe, "probe", "--quick", cwd=work, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unavailable" in r.stdout
    assert "note: the probe runs in this Python" in r.stderr and "-m pleharness.probe" in r.stderr
