"""docs/ci.md's pre-merge job, run as written on the real CPU engine: HEAD (an engine double with
a planted fault) with BASE (the same double, fault off) as its control run, then the gate. The
job's steps are taken from the YAML block in docs/ci.md and run in order with GitHub Actions'
rules (a failing step without continue-on-error fails the job; later steps run only with ``if:
always()``). Only the engine-specific parts are swapped: the engine install lines are dropped, the
profile is profiles/cpu-ngram.toml, and the two builds' interpreters are launchers of
tests/fault_engine.py in front of the session's CPU engine; ``ple-harness`` is this interpreter's
``-m pleharness``.

The job must fail at the gate for the right reason (HEAD's own verdict, its answers against
BASE's; BASE passed: "broken by this change"), and HEAD's junit.xml must parse and name the
failure.
"""
import os
import re
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from conftest import ROOT, load_json

pytestmark = pytest.mark.engine

FAKE_PY = str(ROOT / "tests" / "fakepy" / "python")


def premerge_job() -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("## Pre-merge"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(block)["jobs"]["premerge"]


def run_job(job: dict, builds: dict[str, str], cwd, env) -> tuple[bool, list[dict]]:
    """Run the job's ``run:`` steps (and the JUnit report step) like GitHub Actions would;
    ``builds``: the interpreter of each of /opt/vllm-base and /opt/vllm-head."""
    failed = False
    log = []
    for step in job["steps"]:
        if failed and "always()" not in str(step.get("if", "")):
            continue
        if "run" not in step:
            if "junit-report" in step.get("uses", ""):
                path = cwd / step["with"]["report_paths"]
                log.append({"name": "junit", "root": ET.parse(path).getroot()})
            continue
        script = step["run"]
        if script.strip() == "pip install -e .":
            continue  # installed already
        script = "\n".join(ln for ln in script.splitlines()
                           if not ln.strip().startswith("./ci/install-engine.sh")) or "true"
        script = script.replace("profiles/my-tp4.toml", str(ROOT / "profiles" / "cpu-ngram.toml"))
        for name, py in builds.items():
            script = script.replace(f"/opt/vllm-{name}/bin/python", py)
        assert "/opt/vllm" not in script, script
        script = script.replace("ple-harness ", f"{sys.executable} -m pleharness ")
        p = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=1200)
        log.append({"name": step.get("name", script[:40]), "rc": p.returncode,
                    "stdout": p.stdout, "stderr": p.stderr})
        if p.returncode != 0 and not step.get("continue-on-error"):
            failed = True
    return failed, log


def build(tmp_path, name: str, when: str) -> str:
    p = tmp_path / f"{name}-python"
    p.write_text(f"#!/bin/sh\nPLE_FAULT_WHEN='{when}' exec {FAKE_PY} \"$@\"\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


@pytest.mark.nightly
def test_premerge_job_fails_at_the_gate_for_the_right_reason(cpu_engine, tmp_path):
    job = premerge_job()
    # HEAD's fault: every run of a prompt after its first two (its cold and warm solo runs) has
    # token 5 changed: load runs and later solo runs alike; BASE is the same launcher, fault off
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md"),
           "COLUMNS": "200", "PYTHONPATH": str(ROOT), "PLE_HARNESS_ENGINE_PROBE": "0",
           "PLE_FAULT_UPSTREAM": cpu_engine.url, "PLE_FAULT_MODE": "load",
           "PLE_REAL_PYTHON": sys.executable}
    builds = {"base": build(tmp_path, "base", "never"), "head": build(tmp_path, "head", "always")}
    failed, log = run_job(job, builds, tmp_path, env)
    steps = {s["name"]: s for s in log}
    head_step = next(s for n, s in steps.items() if n.startswith("the pre-merge suite at HEAD"))
    gate = next(s for n, s in steps.items() if n.startswith("gate"))
    assert head_step["rc"] == 1, head_step["stdout"][-3000:] + head_step["stderr"][-3000:]
    assert failed, "the job must fail"
    assert gate["rc"] == 1, gate["stdout"] + gate["stderr"]
    out = gate["stdout"]
    assert "FAIL HEAD verdict: HEAD (head) is 'fail' on its own" in out
    assert "verdict: fail (HEAD failed its own run, BASE passed: broken by this change)" in out
    head_m = load_json(tmp_path / "results" / "head" / "manifest.json")
    base_m = load_json(tmp_path / "results" / "head" / "control-manifest.json")
    assert base_m["verdict"] == "pass"
    assert head_m["engine"]["control_engine"]["launch"]["python"] == builds["base"]
    # HEAD's solo answers after its first two runs of a prompt differ from BASE's
    assert head_m["summary"]["differential"]["hard"] >= 1
    bad = [q for q in head_m["requests"] if q["divergence"] and q["divergence"]["fails"]]
    assert bad and all(q["divergence"]["position"] == 5 for q in bad)
    # the paste-ready summary leads with the cause; the JUnit report parses and names it
    summary = (tmp_path / "step-summary.md").read_text()
    assert summary.index("### Why") < summary.index("### Phases")
    junit = steps["junit"]["root"]
    assert junit.tag == "testsuites" and int(junit.get("failures")) >= 1
