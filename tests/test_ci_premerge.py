"""docs/ci.md's pre-merge job, run as written on two real CPU runs: BASE clean, HEAD with a
planted fault (one flipped token). The job's steps are taken from the YAML block in docs/ci.md and
run in order with GitHub Actions' rules (a failing step without continue-on-error fails the job;
later steps run only with ``if: always()``). Only the engine-specific parts are swapped: the
engine install line is dropped, and ``--engine-profile ... --engine-python ...`` becomes ``--url``
of a fault double in front of the session's CPU engine plus its facts (as in
test_fault_injection.py); ``ple-harness`` is this interpreter's ``-m pleharness``.

The job must fail at the gate for the right reason (HEAD's own verdict and token parity; BASE
passed: "broken by this change"), and HEAD's junit.xml must parse and name the failure.
"""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from conftest import ROOT, load_json
from doubles import EditTokens, FaultProxy

pytestmark = pytest.mark.engine

FACTS = "--block-size 32 --chunk-size 256 --num-speculative-tokens 3"
VOCAB = 793  # the embedded model's vocabulary (config.json)
ENGINE = re.compile(r"--engine-profile \S+ \\\n\s*--engine-python /opt/vllm-(base|head)/bin/python")


def premerge_job() -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("## Pre-merge"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(block)["jobs"]["premerge"]


def run_job(job: dict, urls: dict[str, str], cwd, env) -> tuple[bool, list[dict]]:
    """Run the job's ``run:`` steps (and the JUnit report step) like GitHub Actions would."""
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
                           if not ln.strip().startswith("./ci/install-engine.sh"))
        script = ENGINE.sub(lambda m: f"--url {urls[m.group(1)]} {FACTS}", script)
        assert "--engine-profile" not in script, script
        script = script.replace("ple-harness ", f"{sys.executable} -m pleharness ")
        p = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=900)
        log.append({"name": step.get("name", script[:40]), "rc": p.returncode,
                    "stdout": p.stdout, "stderr": p.stderr})
        if p.returncode != 0 and not step.get("continue-on-error"):
            failed = True
    return failed, log


@pytest.mark.nightly
def test_premerge_job_fails_at_the_gate_for_the_right_reason(cpu_engine, tmp_path):
    job = premerge_job()
    # PLE_HARNESS_ENGINE_PROBE=0 as in every test (conftest.run_cli): the probe's own solo
    # requests would shift the prompt occurrences that this fault is keyed to
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md"),
           "COLUMNS": "200", "PYTHONPATH": str(ROOT), "PLE_HARNESS_ENGINE_PROBE": "0"}
    # HEAD's fault: token 5 of the first request that is the 4th run of its prompt (each
    # transitions prompt runs cold, warm, once in C4: the 4th run is in the C3 phase) is flipped
    flipped = {}

    def select(ctx):
        if not flipped and fault.occurrence(ctx) == 4:
            flipped["request"] = ctx.number
            return True
        return False

    def flip(ctx, ch, i, pos):
        if pos == 5:
            flipped.update(old=ch["token_ids"][i], new=(ch["token_ids"][i] + 1) % VOCAB)
            ch["token_ids"][i] = flipped["new"]
    fault = EditTokens(select, flip)
    with FaultProxy(cpu_engine.url) as base, FaultProxy(cpu_engine.url, fault) as head:
        failed, log = run_job(job, {"base": base.url, "head": head.url}, tmp_path, env)
    assert "new" in flipped, "the fault was never planted"
    steps = {s["name"]: s for s in log}
    base_step = next(s for n, s in steps.items() if n.startswith("build and install"))
    head_step = steps["the same at HEAD"]
    gate = next(s for n, s in steps.items() if n.startswith("gate"))
    assert base_step["rc"] == 0, base_step["stderr"][-3000:] + base_step["stdout"][-3000:]
    assert head_step["rc"] == 1, head_step["stdout"][-3000:]
    assert failed, "the job must fail"
    assert gate["rc"] == 1, gate["stdout"] + gate["stderr"]
    out = gate["stdout"]
    # the cause names the corrupt side first (issue 23): "parity: the load run rN of prompt ..."
    assert "FAIL HEAD verdict: HEAD (head) is 'fail' on its own: parity: the load run r" in out
    assert "FAIL token parity: " in out  # (near ties this machine may have count here too)
    assert "verdict: fail (HEAD failed its own run, BASE passed: broken by this change)" in out
    head_m = load_json(tmp_path / "results" / "head" / "manifest.json")
    bad = [q for q in head_m["requests"] if q["divergence"] and q["divergence"]["fails"]]
    assert len(bad) == 1 and bad[0]["first_divergence"] == 5
    assert bad[0]["divergence"]["observed_token"] == flipped["new"]
    assert f"request {bad[0]['id']}" in out and "at token position 5" in out
    # the paste-ready summary leads with the cause; the JUnit report parses and names it
    summary = (tmp_path / "step-summary.md").read_text()
    assert summary.index("### Why") < summary.index("### Phases")
    junit = steps["junit"]["root"]
    assert junit.tag == "testsuites" and int(junit.get("failures")) >= 1
    failures = [c for c in junit.iter("testcase") if c.find("failure") is not None]
    assert any(bad[0]["id"] in (c.find("failure").text or "") for c in failures)
