"""pleharness.render.text: the next step a failed half-precision run without measured numerics
gets (GPU run x: a clean bf16 MoE engine split a cold and a warm run at 0.75 nats, above
bfloat16's 0.5-nat bound, with no control to measure its numerics)."""
import pytest

from pleharness.manifest import Manifest
from pleharness.manifest.records import CheckResult
from pleharness.render.text import next_steps, unmeasured_bound_hint

UNMEASURED = {"measured": {"logprob_nats": None, "logprob_source": "not measured: no control"}}


def run(*splits, dtype="bfloat16", verdict="fail", source="serving dtype bfloat16",
        envelope=UNMEASURED, control=None, by="engine margin (golden model uninformative)",
        args=("--dtype", "bfloat16"), threshold=0.5):
    reqs = [{"id": rid, "scenario": "transitions", "phase": "references", "concurrency": 1,
             "prompt_key": "p6", "prompt_len": 258, "prompt_hash": "h", "max_tokens": 32,
             "divergence": {"position": 1, "margin_nats": g, "class": cls, "fails": False,
                            "classified_by": by}}
            for rid, g, cls in splits]
    return Manifest.model_validate({
        "run_id": "r", "verdict": verdict, "requests": reqs,
        "engine": {"control_engine": control, "launch": {"engine_args": list(args)}},
        "run_options": {"serving_dtype": dtype, "near_tie_nats": threshold,
                        "near_tie_source": source,
                        "numerics_envelope": envelope}})


def test_a_split_judged_by_the_dtype_bound_alone_gets_the_control_hint():
    m = run(("r00019", 0.75, "hard"), ("r00018", 0.125, "near_tie"))
    hint = unmeasured_bound_hint(m)
    assert "r00019 at 0.75 nats" in hint and "r00018" not in hint
    assert "bfloat16's 0.5-nat bound" in hint
    # the control it suggests is one the run can be given: no --control-drop-arg of a flag
    # the run does not have
    assert """e.g. '--control-engine-arg=--compilation-config={"cudagraph_mode": "NONE"}' (""" \
        in hint
    fap = run(("r1", 0.75, "hard"), args=["--compilation-config",
                                          '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'])
    assert "e.g. --control-drop-arg=--compilation-config '--control-engine-arg=" in \
        unmeasured_bound_hint(fap)
    assert hint in [text for text, _ in next_steps(m, "/runs/r")]
    many = run(*[(f"r{i}", 1.0 + i, "hard") for i in range(5)])
    assert "r2 at 3 nats and 2 more of margin" in unmeasured_bound_hint(many)


def test_logprob_parity_failures_at_the_dtype_bound_get_the_hint_too():
    m = run(("r00019", 0.125, "near_tie"))
    assert unmeasured_bound_hint(m) is None
    m.requests[0].checks.append(CheckResult(name="logprob_parity", status="fail", detail="x"))
    assert unmeasured_bound_hint(m).startswith("numerics not measured: 1 failed logprob parity "
                                               "check(s) were judged against bfloat16's")


@pytest.mark.parametrize("change", [
    {"verdict": "pass"},
    {"dtype": "float32"},
    {"control": {"command": ["python", "-m", "vllm"]}},
    {"envelope": {"measured": {"logprob_nats": 0.4},
                  "logprob_tolerance_source": "2 x the envelope measured on the control run"},
     "source": "measured: 2 x the envelope measured on the control run"},
    {"source": "--near-tie-nats"},
    {"by": "golden"},
    # a threshold measured from --numerics-from (only a flip margin recorded), or missing
    {"source": "measured: the flips the control run reproduced (--numerics-from)",
     "threshold": 0.9},
    {"threshold": None},
    # measured below the bound: the bound stands, but it was measured
    {"envelope": {"measured": {"logprob_nats": 0.05, "flip_margin_nats": None}}},
    {"envelope": {"measured": {"logprob_nats": None, "flip_margin_nats": 0.3}}},
])
def test_no_hint_where_the_numerics_were_measured_or_not_the_question(change):
    assert unmeasured_bound_hint(run(("r00019", 0.75, "hard"), **change)) is None


def test_an_odd_envelope_does_not_stop_the_hint():
    m = run(("r00019", 0.75, "hard"), envelope={"measured": "garbage"})
    assert unmeasured_bound_hint(m).startswith("numerics not measured: the hard split(s)")


def test_a_selftest_pass_is_not_told_its_engine_must_be_running():
    """A selftest pass reaches the selftest's engine through a fault proxy (an attached run),
    but its reproduce command is the selftest, which starts its own engine (a new user read
    "the engine at http://127.0.0.1:43759 must be running" above a command that starts one)."""
    def reproduce(invocation):
        m = Manifest.model_validate({"run_id": "r", "invocation": invocation, "engine": {
            "mode": "attached", "url": "http://127.0.0.1:43759"}})
        return [(t, c) for t, c in next_steps(m) if t.startswith("reproduce")][0]
    text, cmd = reproduce(["ple-harness", "selftest", "(selftest pass flip_under_load)"])
    assert text == "reproduce:" and cmd == "ple-harness selftest --fault flip_under_load"
    text, cmd = reproduce(["ple-harness", "stress", "--url", "http://127.0.0.1:43759"])
    assert "must be running" in text  # a run attached with --url still needs its engine
