"""Verdicts: divergence classification, reference modes, repeats, compare gates, reports."""
import json
import re
import xml.etree.ElementTree as ET

import pytest

from conftest import load_json, run_cli
from doubles import FakeEngine, PromptRun
from pleharness.compare import compare, parse_threshold
from pleharness.divergence import analyse, margins, reconverges
from pleharness.errors import UsageError
from pleharness.manifest import Manifest, load_manifest
from pleharness.scenarios.transitions import PromptSet, TransitionsParams

SMALL = ["--scenario", "transitions", "--ladder", "2,1", "--repeats", "1", "--max-tokens", "8",
         "--vocab-size", "600"]


# -- divergence analysis on constructed data --------------------------------------------------
def test_margins_from_top_logprobs():
    assert margins([{1: -0.1, 2: -0.15}, {3: -0.2}, {}]) == [pytest.approx(0.05), None, None]
    assert margins(None) is None


def test_near_tie_vs_hard_and_reconvergence():
    ref = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    obs = list(ref)
    obs[3] = 99
    m = [2.0] * 12
    m[3] = 0.02
    d = analyse(ref, obs, 3, m, threshold=0.1)
    assert d.cls == "near_tie" and not d.fails and d.margin_nats == 0.02
    assert d.reference_window == [5, 6, 7, 8, 9, 10, 11, 12] and d.observed_window[3] == 99
    assert d.reconverged is True  # only position 3 differs
    d = analyse(ref, obs, 3, [2.0] * 12, threshold=0.1)
    assert d.cls == "hard" and d.fails
    d = analyse(ref, obs, 3, m, threshold=0.1, checks_failed=["degeneration"])
    assert d.cls == "near_tie" and d.fails, "a near tie followed by garbage fails"
    d = analyse(ref, obs, 3, None, threshold=0.1)
    assert d.cls == "unknown" and d.fails
    garbage = ref[:3] + [0] * 9
    assert reconverges(ref, garbage, 3) is False


# -- engine double: near ties pass (warn), hard divergences fail, --strict fails all -------------
def run_fake(behave, tmp_path, run_id, *extra):
    with FakeEngine(behave) as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id",
                    run_id, *SMALL, *extra, timeout=120)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


# prompt numbers for PromptRun (tests/doubles.py): the transitions warm-up's prompts come first,
# then the scenario's 8 (P0 opens the C2 phase, sent twice at once; P3 opens the C1 phase), then
# the determinism scenario's one prompt
P0 = TransitionsParams.model_fields["warmup_requests"].default
P3, DET = P0 + 3, P0 + PromptSet.model_fields["count"].default
LOAD, COPY = 3, 4  # runs of a prompt: 1 cold reference, 2 warm reference, 3 load, 4 its copy


def test_near_tie_flip_is_a_warning(tmp_path):
    r, out, m = run_fake(PromptRun("flip_tie", (P0, COPY)), tmp_path, "tie")
    assert r.returncode == 0, out[-2000:]
    (q,) = [q for q in m["requests"] if q["divergence"]]
    d = q["divergence"]
    assert d["class"] == "near_tie" and d["position"] == FakeEngine.TIE_POS and not d["fails"]
    assert d["margin_nats"] == pytest.approx(0.01) and d["reconverged"] is True
    assert m["verdict"] == "pass" and m["summary"]["near_ties"] == 1
    assert "1 near-tie divergence(s) (warnings)" in out
    r, out, m = run_fake(PromptRun("flip_tie", (P0, COPY)), tmp_path, "tie-strict", "--strict")
    assert r.returncode == 1 and m["verdict"] == "fail"
    assert m["summary"]["hard_divergences"] == 1


def test_hard_flip_fails(tmp_path):
    r, out, m = run_fake(PromptRun("flip_hard", (P0, COPY)), tmp_path, "hard")
    assert r.returncode == 1, out[-2000:]
    (q,) = [q for q in m["requests"] if q["divergence"]]
    assert q["divergence"]["class"] == "hard" and q["divergence"]["margin_nats"] == pytest.approx(4.0)
    assert "hard" in out


# -- reference modes ------------------------------------------------------------------------------
def test_reference_from_a_golden_manifest(tmp_path):
    r, out, golden = run_fake(None, tmp_path, "golden")
    assert r.returncode == 0, out[-2000:]
    gpath = tmp_path / "golden" / "manifest.json"
    r, out, m = run_fake(None, tmp_path, "vs-golden", "--reference", f"manifest:{gpath}")
    assert r.returncode == 0, out[-2000:]
    assert not [p for p in m["phases"] if p["role"] == "reference"], "no solo references taken"
    assert m["summary"]["hashes_matched"] == m["summary"]["hashes_compared"] == 6
    # a golden reference that differs is a hard divergence; a missing one is an explicit error
    g = json.loads(gpath.read_text())  # a copy elsewhere, without its records: references suffice
    g["references"][0]["output_ids"][1] += 1
    g["references"][0]["output_hash"] = "0" * 64
    del g["references"][1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(g))
    r, out, m = run_fake(None, tmp_path, "vs-bad", "--reference", f"manifest:{bad}")
    assert r.returncode == 1
    missing = [q for q in m["requests"] if any(c["name"] == "parity" and "no single-request "
                                                "reference" in c["detail"] for c in q["checks"])]
    assert missing and all(q["match"] is False for q in missing)
    assert any(q["divergence"] and q["divergence"]["position"] == 1 for q in m["requests"])


def test_reference_option_errors(tmp_path):
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), *SMALL,
                    "--reference", "manifest:/nope.json")
        assert r.returncode == 2 and "/nope.json" in r.stderr
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), *SMALL,
                    "--reference", "engine")
        assert r.returncode == 2 and "needs a launched engine" in r.stderr


# -- repeats, reports ----------------------------------------------------------------------------
def test_repeat_reports_medians_and_reports_render(tmp_path):
    r, out, m = run_fake(None, tmp_path, "rep", "--suite-repeats", "3")
    assert r.returncode == 0, out[-2000:]
    load = [p for p in m["phases"] if p["role"] == "load"]
    assert [p["repeat"] for p in load] == [1, 1, 2, 2, 3, 3]
    assert load[2]["name"] == "rep2/r1-s1-C2"
    assert len([p for p in m["phases"] if p["role"] == "reference"]) == 2  # taken once: cold, warm
    tbc = m["summary"]["throughput_by_concurrency"]
    assert set(tbc) == {"C1", "C2"} and tbc["C2"]["repeats"] == 3
    assert tbc["C2"]["min_tok_per_s"] <= tbc["C2"]["median_tok_per_s"] <= tbc["C2"]["max_tok_per_s"]
    run_dir = tmp_path / "rep"
    md = (run_dir / "summary.md").read_text()
    assert "## Test plan and result" in md and "-m pleharness stress --url" in md
    assert "--run-id" not in md, "a reproduce command must not reuse the finished run's folder"
    assert "| C2 |" in md
    root = ET.parse(run_dir / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == len(m["phases"]) and root.get("failures") == "0"
    r2 = run_cli("report", str(run_dir), "--format", "markdown")
    assert r2.returncode == 0 and r2.stdout == md


def test_junit_counts_failures(tmp_path):
    r, out, m = run_fake(PromptRun("http500", (P0, LOAD), (P3, LOAD)), tmp_path, "j")
    assert r.returncode == 1
    root = ET.parse(tmp_path / "j" / "junit.xml").getroot()
    failed = [c for c in root.findall(".//testcase") if c.find("failure") is not None]
    assert root.get("failures") == "2" and len(failed) == 2
    assert all("injected failure" in c.find("failure").text for c in failed)


def test_determinism_scenario_counts_distinct_outputs(tmp_path):
    r, out, m = run_fake(None, tmp_path, "det-ok", "--scenario", "determinism")
    assert r.returncode == 0, out[-2000:]
    assert m["tables"]["determinism"][0]["distinct_outputs"] == 1
    # one of the 32 identical requests (the 20th to arrive) gets a different token: 2 distinct
    # outputs, 31 + 1
    r, out, m = run_fake(PromptRun("flip_hard", (DET, 20)), tmp_path, "det-bad", "--scenario",
                         "determinism")
    assert r.returncode == 1
    t = m["tables"]["determinism"][-1]
    assert t["distinct_outputs"] == 2 and [d["requests"] for d in t["distribution"]] == [31, 1]


# -- compare ----------------------------------------------------------------------------------
def test_parse_threshold():
    assert parse_threshold("C4>=62.985") == ("C4", ">=", 62.985)
    with pytest.raises(UsageError):
        parse_threshold("C4 = 1")


def test_compare_gates_on_doctored_head(tmp_path):
    for rid in ("base", "head"):
        r, out, _ = run_fake(None, tmp_path, rid)
        assert r.returncode == 0
    r = run_cli("compare", str(tmp_path / "base"), str(tmp_path / "head"))
    assert r.returncode == 0, r.stdout
    assert "PASS token parity" in r.stdout
    # HEAD = BASE with one changed output hash and one phase 20% slower
    head = load_json(tmp_path / "base" / "manifest.json")  # records inline: a self-contained file
    req = [q for q in head["requests"] if q["match"]][0]
    req["output_hash"] = "f" * 64
    ph = [p for p in head["phases"] if p["role"] == "load"][0]
    ph["wall_s"] *= 1.25
    ph["decode_tok_per_s"] /= 1.25
    (tmp_path / "doctored.json").write_text(json.dumps(head))
    r = run_cli("compare", str(tmp_path / "base"), str(tmp_path / "doctored.json"),
                "--min-phase-ratio", "0.9", "--threshold", "C1>=1000000")
    assert r.returncode == 1
    # warmup outputs are not judged by either run (issue 25), so fewer than the 12 issued prompts
    assert re.search(r"FAIL token parity: 1 of \d+ prompts differ between BASE and HEAD", r.stdout)
    assert f"FAIL --min-phase-ratio 0.9: phase {ph['name']} ratio 0.800 is 0.100 below" in r.stdout
    assert "FAIL --threshold C1>=1000000: HEAD median" in r.stdout
    res = compare(load_manifest(tmp_path / "base"), Manifest.model_validate(head),
                  min_throughput_ratio=0.5)
    assert any("token parity" in g for g in res.gate_failures)
    assert any("--min-throughput-ratio" in g for g in res.gates_passed)


def test_suites_load_and_compose(tmp_path):
    from pleharness.scenarios import load_scenarios
    from pleharness.suites import load_suite
    s = load_suite("premerge")
    scs = load_scenarios(s.scenario_refs(), {})
    assert [x.kind for x in scs] == ["transitions", "boundary", "pairs", "insert", "determinism",
                                    "stop_strings", "mixed_params", "capture_edges", "sampled",
                                    "disconnects", "prefix_isolation", "chat_api",
                                    "prompt_logprobs", "choices", "constrained"]
    assert scs[0].params.repeats == 1 and scs[4].params.n == 16
    assert load_suite("nightly").repeat == 3
    bad = tmp_path / "s.toml"
    bad.write_text("repeat = 0\n[[scenario]]\nnme = 'x'\n")
    with pytest.raises(UsageError) as e:
        load_suite(str(bad))
    assert "repeat: Input should be greater than or equal to 1" in str(e.value)
    assert "scenario.0.nme: unknown key" in str(e.value)


def test_plot_png(tmp_path):
    r, out, m = run_fake(PromptRun("http500", (P0, LOAD)), tmp_path, "plot")
    png = tmp_path / "p.png"
    r = run_cli("report", str(tmp_path / "plot"), "--plot", str(png))
    assert r.returncode == 1 == m["exit_code"], r.stdout + r.stderr  # report mirrors the run's
    assert "plot written to" in r.stderr and "plot written" not in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_warm_reference_judges_cold_vs_warm_once(tmp_path):
    """A prompt whose first (cold) run breaks a near tie differently from its later (warm) runs:
    the warm reference phase reports one near tie, the load phases match the warm reference."""
    cold_only = PromptRun("flip_tie", (P0, 1))  # the first prompt's cold reference run
    r, out, m = run_fake(cold_only, tmp_path, "coldwarm")
    assert r.returncode == 0, out[-2000:]
    (q,) = [q for q in m["requests"] if q["divergence"]]
    assert q["phase"] == "references" and q["divergence"]["class"] == "near_tie"
    ref = [x for x in m["references"] if x["prompt_key"] == q["prompt_key"]][0]
    assert ref["cache_state"] == "warm" and ref["cold_output_hash"] != ref["output_hash"]
    assert all(x["match"] for x in m["requests"] if x["phase"].startswith("r1-"))
    r, out, m = run_fake(PromptRun("flip_tie", (P0, 1)), tmp_path, "cold",
                         "--reference-cache-state", "cold")
    assert r.returncode == 0
    bad = [q for q in m["requests"] if q["divergence"]]
    assert bad and all(q["phase"].startswith("r1-") for q in bad), "cold reference: every later run differs"


def test_compare_refuses_incomplete_or_empty_runs(tmp_path):
    r, out, m = run_fake(None, tmp_path, "good")
    assert r.returncode == 0
    bad = dict(m, status="interrupted", requests=[], references=[], phases=[])
    (tmp_path / "interrupted.json").write_text(json.dumps(bad))
    r = run_cli("compare", str(tmp_path / "good"), str(tmp_path / "interrupted.json"),
                "--min-throughput-ratio", "0.9")
    assert r.returncode == 3, r.stdout  # issue 36: no verdict, never "broken by this change"
    assert "FAIL run status: HEAD (good) is 'interrupted', not complete" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == (
        "verdict: none (no verdict: HEAD (good) did not complete (status 'interrupted' after "
        f"{m['summary']['phases_completed']} of "
        f"{m['summary']['phases_planned']} phases))")
    assert "broken by this change" not in r.stdout
    assert "FAIL token parity: no prompt was issued by both runs" in r.stdout
    assert "FAIL --min-throughput-ratio 0.9: no concurrency level has throughput" in r.stdout
    (tmp_path / "other.json").write_text(json.dumps({"run_id": "x", "schema_version": 99}))
    r = run_cli("compare", str(tmp_path / "good"), str(tmp_path / "other.json"))
    assert r.returncode == 2 and "manifest schema version 99" in r.stderr


def test_suite_gates_and_item_keys_are_checked(tmp_path):
    from pleharness.suites import load_suite
    bad = tmp_path / "s.toml"
    bad.write_text('[[scenario]]\nname = "transitions"\nfoo = 1\n[gates]\nthresholds = ["garbage"]\n')
    with pytest.raises(UsageError) as e:
        load_suite(str(bad))
    assert "scenario.0.foo: unknown key (allowed: name, params)" in str(e.value)
    assert "gates.thresholds: Value error, 'garbage' is not like 'C4>=62.985'" in str(e.value)
