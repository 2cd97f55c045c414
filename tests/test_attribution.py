"""Attribution: control runs over the same schedule, and `ple-harness explain`."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import ROOT, load_json, run_cli
from pleharness.attribution import attribute, control_args
from pleharness.explain import Case, failing_cases, suspects_for, write_repro
from pleharness.manifest import CheckResult, Divergence, Manifest, PhaseRecord, RequestRecord
from pleharness.scenarios import load_scenario_file

FAKE_PY = str(ROOT / "tests" / "fakepy" / "python")


# -- unit: control arguments, twin classification, suspects, reproducers ----------------------
def test_control_args_drop_and_add():
    args = ["--block-size", "32", "--speculative-config", '{"k": 3}', "--dtype=float32",
            "--enforce-eager"]
    assert control_args(args, ["--speculative-config", "--dtype"], ["--max-num-seqs=4"]) == [
        "--block-size", "32", "--enforce-eager", "--max-num-seqs=4"]
    assert control_args(args, ["--enforce-eager"]) == args[:-1]


def rec(i, phase, conc, prompt, out, match, div=None, fails=True):
    r = RequestRecord(id=f"r{i}", scenario="s", phase=phase, concurrency=conc, prompt_key=prompt,
                      prompt_len=3, prompt_hash=prompt, max_tokens=8, output_hash=out, match=match)
    if div is not None:
        r.first_divergence = div
        r.divergence = Divergence.model_validate({"class": "hard", "fails": fails,
                                                  "checks_failed": [], "position": div})
        r.checks.append(CheckResult(name="parity", status="fail", detail="hard at position 5"))
    return r


def test_attribute_twins():
    main = Manifest(run_id="m", phases=[PhaseRecord(index=0, name="C4", scenario="s",
                                                    concurrency=4)])
    main.requests = [rec(1, "C4", 4, "pA", "bad-a", False, 5), rec(2, "C4", 4, "pB", "bad-b", False, 5),
                     rec(3, "C4", 4, "pC", "bad-c", False, 5), rec(4, "C4", 4, "pD", "ok", True)]
    ctl = Manifest(run_id="c")
    ctl.requests = [rec(1, "C4", 4, "pA", "ok-a", True), rec(2, "C4", 4, "pA", "other", False, 7),
                    rec(3, "C4", 4, "pB", "ok-b", True), rec(4, "C4", 2, "pC", "bad-c", False, 5)]
    counts = attribute(main, ctl)
    # pA: one twin diverged too (batching is not repeatable: one is enough); pB: every twin
    # matched; pC: the control has it only at another concurrency
    assert counts == {"also_in_control": 1, "only_under_test": 1, "no_twin": 1}
    a, b, c = (main.requests[i].divergence for i in range(3))
    assert a.attribution == "also_in_control" and not a.fails
    assert a.control_evidence.model_dump() == {"twins": 2, "twins_diverged": 1,
                                               "same_output": False, "twin_first_divergences": [7]}
    assert b.attribution == "only_under_test" and b.fails
    assert c.attribution == "no_twin" and c.fails
    assert main.requests[0].checks[0].status == "warn"
    ph = main.phases[0]
    assert ph.status == "fail" and ph.mismatched == 2 and "also in the control" not in ph.reason
    # the same divergent output in the control counts as also_in_control
    main.requests[1].divergence.attribution = None
    ctl.requests[2].output_hash = "bad-b"
    assert attribute(main, ctl)["also_in_control"] == 2


def test_failing_cases_suspects_and_repro(tmp_path):
    m = Manifest(run_id="run1", facts={"num_speculative_tokens": {"value": 3},
                                       "prefix_caching": {"value": True},
                                       "max_num_batched_tokens": {"value": 256},
                                       "max_model_len": {"value": 1024}})
    m.engine = {"mode": "launched", "launch": {"engine_args": ["--speculative-config", "{}"]}}
    m.requests = [rec(1, "C4", 4, "pA", "x", False, 5), rec(2, "C4", 4, "pB", "y", True),
                  rec(3, "C4", 4, "pA", "z", False, 5, fails=False)]
    m.prompts = {"pA": [20, 21, 22], "pB": [30, 31, 32]}
    (case,) = failing_cases(m)
    assert case.requests == ["r1"] and case.concurrency == 4
    assert list(case.levels) == ["alone", "with its phase companions"]
    assert case.levels["with its phase companions"] == (4, [([20, 21, 22], 8), ([30, 31, 32], 8),
                                                           ([20, 21, 22], 8)])
    names = [s.name for s in suspects_for(m, ["--enforce-eager"])]
    assert names == ["speculative decoding", "prefix caching", "chunked prefill", "--enforce-eager"]
    assert [s.name for s in suspects_for(m, ["--x"], ["--speculative-config"], auto=False)] == [
        "--x", "without --speculative-config"]
    m.environment = {"gpus": [{"name": "H200"}]}
    assert "FULL CUDA graphs" in [s.name for s in suspects_for(m)]
    case.minimal = "with its phase companions"
    path = tmp_path / "repro-1.toml"
    write_repro(case, path, "run1")
    sc = load_scenario_file(str(path))
    assert sc.kind == "replay" and sc.params.phases[0].concurrency == 4
    assert [r.prompt for r in sc.params.phases[0].requests] == [[20, 21, 22], [30, 31, 32],
                                                                [20, 21, 22]]
    # the comparison that failed: without a replay on record, the run's own divergence
    (f,) = sc.params.failed
    assert f.first_divergence == 5 and "r1" in f.run and f.phase == sc.params.phases[0].name
    # with the configuration-under-test replay's divergent requests: each named, vs its warm
    # solo reference
    case.baseline = {"with its phase companions": {"fails": True, "divergent": [
        {"try": 2, "prompt_len": 3, "first_divergence": 6}]}}
    write_repro(case, path, "run1")
    (f,) = load_scenario_file(str(path)).params.failed
    assert (f.request, f.prompt_len, f.first_divergence) == (0, 3, 6)
    assert f.run == "load (explain replay, try 2)" and "warm single-request" in f.compared_with
    m.prompts = {}
    with pytest.raises(Exception, match="keeps no prompt IDs"):
        failing_cases(m)


def test_case_attribution_wording():
    c = Case(1, "p", 4, "C4", ["r1"], 5, {})
    assert c.attribution().startswith("not reproduced")
    c.minimal = "alone"
    c.results = {"speculative decoding": {"vanishes": True}, "prefix caching": {"vanishes": False}}
    assert c.attribution() == ("vanishes with speculative decoding: attributed to speculative "
                               "decoding")
    c.results["speculative decoding"]["vanishes"] = False
    assert c.attribution() == "persists in every control: not explained"


# -- end to end: a fault that follows a launch flag, in front of the real CPU engine -----------
def fault_env(engine, when, mode="crowded"):
    return {"PLE_FAULT_UPSTREAM": engine.url, "PLE_FAULT_WHEN": when, "PLE_FAULT_MODE": mode,
            "PLE_REAL_PYTHON": sys.executable}


def stress_fake(engine, tmp_path, run_id, when, *extra, mode="crowded"):
    r = run_cli("stress", "--engine-python", FAKE_PY, "--engine-profile",
                "profiles/cpu-ngram.toml", "--scenario", "transitions", "--ladder", "4,1",
                "--repeats", "1", "--results-dir", str(tmp_path), "--run-id", run_id, *extra,
                env=fault_env(engine, when, mode), timeout=900)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


@pytest.fixture(scope="module")
def spec_fault_run(cpu_engine, tmp_path_factory):
    """A run whose engine corrupts position 5 of busy requests only while --speculative-config is
    in its launch arguments, with the control run dropping that flag."""
    tmp = tmp_path_factory.mktemp("attribution")
    return stress_fake(cpu_engine, tmp, "spec", "--speculative-config",
                       "--control-drop-arg=--speculative-config") + (tmp,)


@pytest.mark.engine
def test_control_run_classifies_only_under_test(spec_fault_run):
    r, out, m, tmp = spec_fault_run
    assert r.returncode == 1, out[-3000:]
    div = [q for q in m["requests"] if q["divergence"]]
    assert div and all(q["concurrency"] == 4 for q in div)
    assert all(q["divergence"]["attribution"] == "only_under_test" for q in div)
    assert m["summary"]["only_under_test"] == len(div) and m["summary"]["also_in_control"] == 0
    ctl = m["engine"]["control_engine"]
    assert "--speculative-config" not in ctl["command"] and "--speculative-config" in \
        m["engine"]["launch"]["engine_args"]
    cm = load_json(tmp / "spec" / "control-manifest.json")
    assert cm["status"] == "complete" and not any(q["match"] is False for q in cm["requests"])
    # the control ran the identical schedule
    key = lambda q: (q["phase"], q["prompt_hash"], q["concurrency"])  # noqa: E731
    assert sorted(map(key, cm["requests"])) == sorted(map(key, m["requests"]))
    assert "only under test" in out


@pytest.mark.engine
def test_fault_in_both_configurations_is_also_in_control(cpu_engine, tmp_path):
    # the same requests are corrupted in both configurations (a timing-dependent fault could hit
    # a request under test and miss all of its twins, which would rightly be only_under_test)
    r, out, m = stress_fake(cpu_engine, tmp_path, "both", "always",
                            "--control-drop-arg=--speculative-config", mode="load")
    div = [q for q in m["requests"] if q["divergence"]]
    assert div and all(q["divergence"]["attribution"] == "also_in_control" for q in div)
    assert m["summary"]["also_in_control"] == len(div) and m["summary"]["only_under_test"] == 0
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    assert "also in the control" in out


@pytest.mark.engine
def test_explain_attributes_the_divergence_to_its_flag(cpu_engine, spec_fault_run):
    r, out, m, tmp = spec_fault_run
    run = tmp / "spec"
    e = run_cli("explain", str(run), "--tries", "3", "--confirm-runs", "2",
                env=fault_env(cpu_engine, "--speculative-config"), timeout=900)
    assert e.returncode == 0, (e.stdout + e.stderr)[-3000:]
    rep = json.loads((run / "explain" / "explain.json").read_text())
    assert "4 engine launch(es) planned" in e.stderr
    assert [s["name"] for s in rep["suspects"]] == ["speculative decoding", "prefix caching",
                                                    "chunked prefill"]
    assert rep["cases"]
    for c in rep["cases"]:
        assert c["minimal_case"] == "with its phase companions"  # alone it never fails
        assert c["baseline"]["alone"]["fails"] is False
        assert c["controls"]["speculative decoding"]["vanishes"] is True
        assert c["controls"]["prefix caching"]["vanishes"] is False
        assert c["attribution"] == ("vanishes with speculative decoding: attributed to "
                                    "speculative decoding")
    junit = ET.parse(run / "explain" / "junit.xml").getroot()
    fails = junit.findall(".//failure")
    assert len(fails) == len(rep["cases"]) and "speculative decoding" in fails[0].get("message")
    assert "attributed to speculative decoding" in (run / "explain" / "explain.md").read_text()
    # each reproducer was replayed on 2 fresh launches of the configuration under test (the
    # double in front of the session's engine) and failed both times; it names the comparison
    for c in rep["cases"]:
        assert c["reproduction"]["rate"] == "2/2", c["reproduction"]
        assert c["reproduction_verdict"].startswith("reproduced 2/2 on fresh engines")
        for x in c["reproduction"]["replays"]:
            sub = load_json(x["manifest"])
            assert sub["engine"]["mode"] == "launched" and sub["engine"]["command"][0] == FAKE_PY
            assert "--speculative-config" in sub["engine"]["launch"]["engine_args"]
    assert "reproduced 2/2 on fresh engines" in (run / "explain" / "explain.md").read_text()
    # the cases of one phase share its schedule: replayed once (2 runs, not 2 per case)
    firsts = [c for c in rep["cases"] if "same_schedule_as" not in c["reproduction"]]
    assert len(firsts) == len({c["phase"] for c in rep["cases"]})
    assert len(list((run / "explain" / "confirm").iterdir())) == 2 * len(firsts)
    # the one-file reproducer replays the failure
    repro = run / rep["cases"][0]["repro"]
    failed = load_scenario_file(str(repro)).params.failed
    assert failed and all(f.compared_with.startswith("its warm single-request reference")
                          and f.first_divergence == 5 for f in failed)
    rr = run_cli("stress", "--engine-python", FAKE_PY, "--engine-profile",
                 "profiles/cpu-ngram.toml", "--scenario", str(repro), "--results-dir", str(tmp),
                 "--run-id", "replayed", env=fault_env(cpu_engine, "--speculative-config"),
                 timeout=900)
    assert rr.returncode == 1, (rr.stdout + rr.stderr)[-3000:]
    rm = load_json(tmp / "replayed" / "manifest.json")
    assert rm["scenarios"][0]["kind"] == "replay" and rm["summary"]["hard_divergences"] >= 1
    assert any(x["reproduced"] for x in rm["tables"]["replay_failed_comparisons"])


def test_explain_refuses_attached_runs(tmp_path):
    m = Manifest(run_id="att", engine={"mode": "attached"})
    (tmp_path / "manifest.json").write_text(m.model_dump_json())
    r = run_cli("explain", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "launched by the harness" in (r.stdout + r.stderr)
