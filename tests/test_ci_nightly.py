"""docs/ci.md's nightly job, run as written on the CPU engine for two nights (issue 25 item 7).

The job's steps come from the YAML block in docs/ci.md and run in order with GitHub Actions' rules
(a failing step fails the job, later steps run only with ``if: always()``), with ``${{ ... }}``
expressions and the job's ``env`` substituted as the runner would. Only what needs a GPU or hours
is swapped: ``--engine-profile ... --engine-python ...`` becomes ``--url`` of a fault double in
front of the session's CPU engine plus its facts, ``--suite nightly`` a tiny suite with the same
kinds of entry (transitions, and fuzz with the nightly's database ``results/fuzz-db``),
``$PLE_STATE`` a temporary folder, and ``pip install -e .`` / checkout are skipped (installed).
``actions/checkout`` cleaning the ignored files is played by deleting ``results/`` between nights.

Night 1 is clean: the run passes, nothing to compare with, and it becomes the last good night.
Night 2 has a flipped token: the run and the compare fail, the last good night stays night 1, the
summary and junit.xml are still published, and the fuzz database lived outside the checkout.
"""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from conftest import ROOT, load_json
from doubles import EditTokens, FaultProxy

pytestmark = pytest.mark.engine

FACTS = "--block-size 32 --chunk-size 256 --num-speculative-tokens 3 --max-num-seqs 8"
VOCAB = 793  # the embedded model's vocabulary (config.json)
ENGINE = re.compile(r"--engine-profile \S+ \\\n\s*--engine-python /opt/vllm/bin/python")
TINY_SUITE = """description = "tiny nightly for tests"
repeat = 1
[[scenario]]
name = "transitions"
params = { ladder = [2, 1], repeats = 1, max_tokens = 8 }
[[scenario]]
name = "fuzz"
params = { seed = 5, max_examples = 3, time_budget_s = 120, shrink_budget_s = 30, max_tokens = 6, db = "results/fuzz-db" }
"""


def nightly_job() -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("## Nightly"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(block)["jobs"]["nightly"]


def expand(text: str, ctx: dict) -> str:
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: ctx[m.group(1)], text)


def run_night(job: dict, url: str, cwd, state, suite, run_id: str) -> tuple[bool, list[dict]]:
    ctx = {"github.run_id": run_id, "github.workspace": str(cwd)}
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(cwd / "step-summary.md"), "COLUMNS": "200",
           "PYTHONPATH": str(ROOT)}
    env.update({k: expand(str(v), ctx) for k, v in (job.get("env") or {}).items()})
    env["PLE_STATE"] = str(state)
    failed, log = False, []
    for step in job["steps"]:
        if failed and "always()" not in str(step.get("if", "")):
            continue
        if "run" not in step:
            if "upload-artifact" in step.get("uses", ""):
                log.append({"name": "upload", "paths": expand(step["with"]["path"], ctx).split()})
            elif "junit-report" in step.get("uses", ""):
                path = cwd / expand(step["with"]["report_paths"], ctx)
                log.append({"name": "junit", "root": ET.parse(path).getroot()})
            continue
        script = expand(step["run"], ctx)
        if script.strip() == "pip install -e .":
            continue  # installed already
        script = ENGINE.sub(f"--url {url} {FACTS}", script)
        assert "--engine-profile" not in script, script
        script = script.replace("--suite nightly", f"--suite {suite}")
        script = script.replace("ple-harness ", f"{sys.executable} -m pleharness ")
        p = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=900)
        log.append({"name": step.get("name", script[:40]), "rc": p.returncode,
                    "stdout": p.stdout, "stderr": p.stderr})
        if p.returncode != 0 and not step.get("continue-on-error"):
            failed = True
    return failed, log


@pytest.mark.nightly
def test_nightly_job_two_nights(cpu_engine, tmp_path):
    job = nightly_job()
    assert job["env"]["TMPDIR"].endswith("/results/tmp")
    suite = tmp_path / "tiny-nightly.toml"
    suite.write_text(TINY_SUITE)
    state, cwd = tmp_path / "srv-ple", tmp_path / "checkout"
    cwd.mkdir()
    # night 1: clean
    with FaultProxy(cpu_engine.url) as clean:
        failed, log = run_night(job, clean.url, cwd, state, suite, "1")
    steps = {s["name"]: s for s in log}
    assert not failed, [(s["name"], s.get("rc"), s.get("stderr", "")[-2000:]) for s in log]
    assert steps["stress (nightly suite, 3 repeats)"]["rc"] == 0
    assert load_json(state / "last-good" / "manifest.json")["run_id"] == "nightly-1"
    assert (cwd / "results" / "fuzz-db").is_symlink()
    assert (cwd / "results" / "fuzz-db").resolve() == (state / "fuzz-db").resolve()
    m1 = load_json(cwd / "results" / "nightly-1" / "manifest.json")
    fz = m1["tables"]["fuzz_summary"][0]
    assert fz["examples_run"] > 0 and fz["database"] == "results/fuzz-db"
    assert {"results/nightly-1/", "results/tmp/"} <= set(steps["upload"]["paths"])
    # actions/checkout cleans the ignored results/ before the next night
    shutil.rmtree(cwd / "results")
    flipped = {}

    def select(ctx):
        if not flipped and fault.occurrence(ctx) == 4:
            flipped["request"] = ctx.number
            return True
        return False

    def flip(ctx, ch, i, pos):
        if pos == 5:
            ch["token_ids"][i] = (ch["token_ids"][i] + 1) % VOCAB
            flipped["new"] = ch["token_ids"][i]

    fault = EditTokens(select, flip)
    with FaultProxy(cpu_engine.url, fault) as bad:
        failed, log = run_night(job, bad.url, cwd, state, suite, "2")
    assert "new" in flipped, "the fault was never planted"
    steps = {s["name"]: s for s in log}
    assert failed
    assert steps["stress (nightly suite, 3 repeats)"]["rc"] == 1
    gate = steps["compare with the last good night (golden references + throughput gates)"]
    assert gate["rc"] == 1 and "at token position 5" in gate["stdout"], gate["stdout"][-3000:]
    assert gate["stdout"].strip().splitlines()[-1].startswith(
        "verdict: fail (HEAD failed its own run, BASE passed: broken by this change)")
    assert "remember this night as the last good one (only when the run and the gate passed)" \
        not in steps, "a failed step stops the steps without if: always()"
    assert load_json(state / "last-good" / "manifest.json")["run_id"] == "nightly-1"
    assert steps["publish"]["rc"] == 0 and "### Why" in (cwd / "step-summary.md").read_text()
    assert int(steps["junit"]["root"].get("failures")) >= 1
    assert (state / "fuzz-db").is_dir(), "the database outlived the cleaned checkout"
