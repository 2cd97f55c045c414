"""Issue 34: a stress run confirms its reproducers after the control run and the sides, and only
those whose failure still fails the run (fresh engines are not spent on a failure the control
run explains)."""
from __future__ import annotations

import inspect
from pathlib import Path

from pleharness import fuzzjob, jobrun, pipeline, reproduce
from pleharness.config import AttachConfig, StressConfig
from pleharness.manifest import Manifest, PhaseRecord, RequestRecord
from pleharness.manifest.tables import ReproducerRow


def _manifest(phase_status: str, problem: bool) -> Manifest:
    m = Manifest(run_id="t", scenarios=[{"name": "fz", "kind": "fuzz"},
                                        {"name": "tr", "kind": "transitions"}])
    m.phases = [PhaseRecord(index=0, name="fz-1", scenario="fz", concurrency=2,
                            status=phase_status),
                PhaseRecord(index=1, name="tr-1", scenario="tr", concurrency=4, status="fail")]
    rec = dict(scenario="fz", phase="fz-1", concurrency=2, prompt_key="k", prompt_len=3,
               prompt_hash="h", max_tokens=4)
    m.requests = [RequestRecord(id="r1", **rec, error="boom" if problem else None)]
    m.tables["reproducers"] = [{"source": "fuzz", "path": "repro.toml", "schedule": "s"}]
    return m


def test_still_failing_looks_at_the_rows_own_scenarios():
    row = ReproducerRow(source="fuzz", path="repro.toml")
    # another scenario's failure (tr) does not keep a fuzz reproducer alive
    assert not reproduce.still_failing(_manifest("pass", False), row)
    assert reproduce.still_failing(_manifest("fail", False), row)
    assert reproduce.still_failing(_manifest("pass", True), row)
    # a source no scenario of the run is of: the whole run decides
    assert reproduce.still_failing(_manifest("pass", False),
                                   ReproducerRow(source="other", path="x.toml"))


def test_an_excused_failure_is_not_replayed(tmp_path: Path, monkeypatch):
    m = _manifest("pass", False)  # e.g. the control run reproduced it: attributed, now passing
    replays = []

    def runner(cfg, console, err, spares=None):  # never reached: no fresh engine is spent
        replays.append(cfg)
        return 1
    monkeypatch.setattr(pipeline, "run_stress", runner)  # the run each replay would be

    lines: list[str] = []
    rows = pipeline.confirm_run_reproducers(
        m, tmp_path, reproduce.ReplayTarget(
            config=StressConfig(attach=AttachConfig(url="http://x"))), 3,
        log=lines.append)
    assert replays == []
    assert rows[0].verdict == reproduce.NOT_STILL_FAILING
    assert rows[0].confirmation is None
    assert m.tables["reproducers"] == [{"source": "fuzz", "path": "repro.toml", "schedule": "s",
                                        "verdict": reproduce.NOT_STILL_FAILING}]
    assert lines == [f"repro.toml: {reproduce.NOT_STILL_FAILING}"]


def test_the_jobs_confirm_after_control_and_sides():
    src = inspect.getsource(pipeline._steps)  # the stress run's steps
    body = src[src.index('"""', src.index('"""') + 3):]  # the code after the docstring
    order = [body.index(s) for s in ("suite_step(", "control_pass(", "sides_step(",
                                     "confirm_reproducers(", "conclude(")]
    assert order == sorted(order), order
    src = inspect.getsource(jobrun.sides_step)  # sides, then the tables from the final verdicts
    assert src.index("judge_sides(") < src.index("refresh_tables(")
    src = inspect.getsource(fuzzjob._phases)  # the fuzz job: confirmation after sides too
    order = [src.index(s) for s in ("suite_step(", "sides_step(", "confirm_reproducers(",
                                    "conclude(")]
    assert order == sorted(order), order
