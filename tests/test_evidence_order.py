"""Issue 32: the verdict's evidence in its stated order (pleharness.divergence.settle,
docs/references.md): solo repeatability first, the control, the golden model only where it is
measured informative on this engine, the engine margin; a failed control engine is exit 3."""
import sys
from pathlib import Path

import pytest

from pleharness.causes import headline
from pleharness.divergence import analyse, golden_bound, noise_floor, settle
from pleharness.manifest import Manifest, PhaseRecord, RequestRecord
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.run.context import RunContext, RunOptions
from pleharness.run.judge import finish_phase, floor_run

sys.path.insert(0, str(Path(__file__).parent))
from conftest import load_json, run_cli  # noqa: E402

REF, OBS = [1, 2, 3, 4], [1, 2, 9, 4]


def test_golden_bound_and_an_uninformative_floor():
    assert golden_bound(0.5) == 2.0 and golden_bound(0.0625) == 0.25
    tol, info = noise_floor([0.1] * 20, "bfloat16", 0.5)
    assert info["informative"] is True and tol == 0.5
    tol, info = noise_floor([1.0] * 10 + [9.0] * 10, "bfloat16", 0.5)  # floor 9 > bound 2
    assert info["informative"] is False and "uninformative" in info["source"]
    assert info["informative_bound_nats"] == 2.0


def test_settle_order_solo_repeatability_beats_margin_golden_and_control():
    g = {"logprobs": {3: -0.5, 9: -0.51}, "top": [(3, -0.5), (9, -0.51)]}
    d = analyse(REF, OBS, 2, [1.0, 1.0, 0.01, 1.0], 0.5, golden=g)
    assert d.cls == "near_tie" and not d.fails and d.decided_by == "golden"
    d.attribution = "also_in_control"
    settle(d, half_precision=True)
    assert not d.fails and d.decided_by == "control"
    d.solo_repeat = "the engine does not repeat itself alone at this prompt: ..."
    settle(d, half_precision=True)
    assert d.cls == "hard" and d.fails and d.decided_by == "solo repeatability"


def test_uninformative_golden_decides_nothing_the_margin_does():
    # golden says near tie (gap 0.01); margin 3 nats says hard: an uninformative golden model
    # is not asked, so the engine margin decides
    g = {"logprobs": {3: -0.5, 9: -0.51}, "top": [(3, -0.5), (9, -0.51)]}
    d = analyse(REF, OBS, 2, [1.0, 1.0, 3.0, 1.0], 0.5, golden=g)
    assert d.cls == "near_tie"
    d.golden_informative = False
    settle(d, half_precision=True)
    assert d.cls == "hard" and d.fails and d.decided_by == "engine margin"
    assert d.classified_by == "engine margin (golden model uninformative)"


def spec(**kw):
    return RequestSpec(Prompt(key="p", ids=(1, 2, 3), text="x", why="t"), 4, **kw)


def test_sampled_penalised_and_stop_runs_never_enter_the_golden_floor():
    assert floor_run(spec())
    for kw in ({"temperature": 1.0, "seed": 3}, {"stop": ("ab",)}, {"repetition_penalty": 1.2},
               {"logit_bias": ((5, -100.0),)}, {"top_p": 0.9, "temperature": 1.0},
               {"compare": False}):
        assert not floor_run(spec(**kw)), kw


class WideGolden:
    """Teacher-forced view of each solo run: one flip of 9 nats (a weak oracle)."""

    def force(self, prompt, out):
        return [(-9.1, 999, -0.1)] + [(-0.1, t, -0.1) for t in out[1:]]


def test_a_weak_golden_model_decides_nothing_and_the_headline_says_so(tmp_path):
    m = Manifest(run_id="w")
    ctx = RunContext(None, m, tmp_path / "manifest.json", None, None,
                     options=RunOptions(serving_dtype="bfloat16", near_tie_nats=0.5),
                     golden=WideGolden())
    ctx.judge._solo_runs = [
        (RequestRecord(id=f"s{i}", scenario="s", phase="refs", concurrency=1, prompt_key=f"p{i}",
                       prompt_len=2, prompt_hash=f"h{i}", max_tokens=3), [1, 2], [5, 6, 7])
        for i in range(8)]
    # the same prompt twice: counted once
    ctx.judge._solo_runs.append((ctx.judge._solo_runs[0][0], [1, 2], [5, 6, 7]))
    m.phases = [PhaseRecord(index=0, name="load", scenario="s", concurrency=2)]
    r = RequestRecord(id="r9", scenario="s", phase="load", concurrency=2, prompt_key="p",
                      prompt_len=2, prompt_hash="ph", max_tokens=4, output_hash="x",
                      match=False, first_divergence=2)
    # golden: a 3-nat gap, the observed token outside its top-k: hard, and the reference's
    # token far better; the engine margin (0.1 nats) says near tie
    g = {"logprobs": {3: -0.5, 9: -3.5}, "top": [(3, -0.5)]}
    r.divergence = analyse(REF, OBS, 2, [1.0, 1.0, 0.1, 1.0], 0.5, golden=g)
    assert r.divergence.cls == "hard"
    m.requests = [r]
    finish_phase(m.phases[0], [r])
    ctx.finish_judgement()
    gt = m.run_options.golden_tolerance
    assert gt["informative"] is False and gt["solo_runs_scored"] == 8
    assert gt["left_out_prompt_repeats"] == 1
    d = r.divergence
    assert d.golden_informative is False and d.cls == "near_tie" and not d.fails
    assert d.decided_by == "engine margin" and d.corrupt_side is None
    assert m.phases[0].status == "pass"
    m.summary.assign(phases_completed=1, phases_planned=1)
    assert "golden model uninformative on this engine" in headline(m)
    assert "below 9 nats (bound 2)" in headline(m)


def test_solo_repeatability_applies_to_one_greedy_choice_alone_not_to_several_choices(tmp_path):
    """GPU run q: two C1 runs of one prompt with n = 3 greedy choices (sent as top-1 sampling)
    drew differently at an exact bf16 tie on a clean engine. Solo repeatability is evidence for a
    lone greedy request only; a request of several choices falls back to the margins."""
    from pleharness.manifest import ReferenceRecord
    m = Manifest(run_id="n")
    m.engine_probe = {"greedy_repeats": True}
    m.facts = {"prefix_caching": {"value": False}}
    ctx = RunContext(None, m, tmp_path / "manifest.json", None, None,
                     options=RunOptions(serving_dtype="bfloat16", near_tie_nats=0.5))
    ph = PhaseRecord(index=0, name="choices-solo", scenario="choices", concurrency=1)
    rec = RequestRecord(id="r2", scenario="choices", phase="choices-solo", concurrency=1,
                        prompt_key="p", prompt_len=3, prompt_hash="ph", max_tokens=4)
    ref = ReferenceRecord(prompt_key="p", prompt_hash="ph", prompt_len=3, max_tokens=4,
                          output_hash="h", output_ids=[5, 6, 7, 8], source="solo",
                          request_id="r1", cache_state="cold")
    assert "does not repeat itself alone" in ctx.judge._solo_repeat(ph, rec, spec(), ref)
    assert ctx.judge._solo_repeat(ph, rec, spec(n=3, choice=0), ref) is None


# -- on the real CPU engine -------------------------------------------------------------------

BOUNDARY = """kind = "boundary"
[params]
max_tokens = 8
depth = 1
edges = false
"""


@pytest.mark.engine
def test_one_length_whose_solo_runs_disagree_is_hard_by_solo_repeatability(
        plain_engine, tmp_path):
    """Every second solo run of the 33-token prompt (n*B + q = 32 + 1: the
    session's plain engine has no speculative decoding) gets output position 2
    changed: its warm run differs from its cold run. Prefix caching is off, both ran alone, the
    engine probe measured that solo greedy runs repeat: hard by solo repeatability, even with a
    near-tie threshold (100 nats, the largest allowed) that calls every margin a near tie; its
    -1 / +1 controls agree and the boundary notes name the length."""
    from doubles import Corrupt, FaultProxy
    fault = Corrupt(lambda ctx: len(ctx.body.get("prompt") or []) == 33
                    and fault.occurrence(ctx) % 2 == 0,
                    lambda t, pos: ((t + 1) % 793, f" t{(t + 1) % 793}"), start=2, stop=3,
                    consistent=True)
    sc = tmp_path / "b.toml"
    sc.write_text(BOUNDARY)
    with FaultProxy(plain_engine.url, fault) as proxy:
        r = run_cli("stress", "--url", proxy.url, "--results-dir", str(tmp_path), "--run-id",
                    "solo", "--scenario", str(sc), "--block-size", "32", "--chunk-size", "256",
                    "--num-speculative-tokens", "0", "--near-tie-nats", "100", "--no-golden",
                    "--engine-probe")
    out = r.stdout + r.stderr
    m = load_json(tmp_path / "solo" / "manifest.json")
    assert fault.hits, out[-2000:]
    assert m["engine_probe"]["greedy_repeats"] is True, m["engine_probe"]
    assert m["facts"]["prefix_caching"]["value"] is False
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if q["divergence"] and q["divergence"]["fails"]]
    assert bad and {q["prompt_len"] for q in bad} == {33}, [(q["id"], q["prompt_len"]) for q in bad]
    d = bad[0]["divergence"]
    assert d["class"] == "hard" and d["decided_by"] == "solo repeatability"
    assert "does not repeat itself alone" in d["solo_repeat"]
    assert d["margin_nats"] is not None and d["margin_nats"] < 100  # the margin said near tie
    rows = {x["length"]: x for x in m["tables"]["boundary"]}
    assert "solo repeatability" in rows[33]["warm"] and rows[33]["repeat"] == "= reference"
    assert rows[32]["warm"] == "= cold" and rows[34]["warm"] == "= cold"
    notes = " ".join(n["note"] for n in m["tables"]["boundary_notes"])
    assert "solo runs disagree at length 33" in notes
    assert bad[0]["divergence"]["corrupt_side"] == "load"  # cold and repeat agree: 2 against 1


@pytest.mark.engine
def test_a_control_engine_that_cannot_start_is_exit_3_and_named(cpu_engine, tmp_path):
    """The engine under test (the fault double, no fault) runs and passes; the control engine
    (dropping --speculative-config) refuses to start: exit 3, status control_failed, the run's
    own records kept and judged, summary.md and junit.xml name the control engine's failure."""
    fake = str(Path(__file__).parent / "fakepy" / "python")
    env = {"PLE_FAULT_UPSTREAM": cpu_engine.url, "PLE_FAULT_WHEN": "never",
           "PLE_REAL_PYTHON": sys.executable, "PLE_FAULT_FAIL_START": "--no-speculative-x"}
    # the control adds a flag the double refuses (as vLLM refuses a bad configuration)
    r = run_cli("stress", "--engine-python", fake, "--engine-profile", "profiles/cpu-ngram.toml",
                "--scenario", "transitions", "--ladder", "2,1", "--repeats", "1",
                "--control-engine-arg=--no-speculative-x", "--results-dir", str(tmp_path),
                "--run-id", "ctl", env=env, timeout=900)
    out = r.stdout + r.stderr
    m = load_json(tmp_path / "ctl" / "manifest.json")
    assert r.returncode == 3, out[-3000:]
    assert m["status"] == "control_failed" and m["verdict"] == "pass"
    assert m["summary"]["hashes_compared"] > 0
    assert "planted start failure" in m["engine"]["control_engine"]["error"]
    md = (tmp_path / "ctl" / "summary.md").read_text()
    assert "CONTROL ENGINE FAILED" in md and "planted start failure" in md
    assert "control_failed" in (tmp_path / "ctl" / "junit.xml").read_text()
    assert "control engine failed" in r.stderr
