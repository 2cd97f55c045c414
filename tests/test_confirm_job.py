"""The ``confirm`` job (issue 34: reproducer confirmation is a job): a finished run's reproducers
replayed on fresh engines of the run's configuration, judged as the run was; bad input is a usage
error before anything starts; the run's own manifest is never changed; an interrupted job keeps
what it confirmed. The engine test is in tests/test_fuzz.py
(``test_engine_fuzz_repro_confirmed_on_fresh_engines``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import run_cli
from pleharness import pipeline
from pleharness.cli import app
from pleharness.confirmjob import ConfirmResult, run_confirm
from pleharness.errors import UsageError
from pleharness.manifest import Manifest, PhaseRecord, write_manifest
from pleharness.reproduce import NOT_STILL_FAILING


REPRO = """kind = "replay"

[[params.phases]]
name = "p1"
concurrency = 2

[[params.phases.requests]]
prompt = [5, 6, 7]
max_tokens = 4

[[params.phases.requests]]
prompt = [8, 9]
max_tokens = 4
"""


def _run(tmp_path: Path, *, status: str = "fail", launched: bool = True,
         reproducers: bool = True, confirmed: bool = True) -> Path:
    """A finished fuzz run's folder: a failing (or passing) fuzz phase, a repro.toml and its
    row, confirmed 2/2 by the run itself when ``confirmed``."""
    d = tmp_path / "run"
    d.mkdir()
    (tmp_path / "tiny").mkdir(exist_ok=True)  # the run's model folder (confirm checks it is here)
    m = Manifest(run_id="run", status="complete", verdict="fail",
                 scenarios=[{"name": "fz", "kind": "fuzz"}],
                 engine={"mode": "launched", "model": "tiny",
                         "launch": {"model": str(tmp_path / "tiny"), "python": sys.executable,
                                    "engine_args": ["--max-num-seqs", "4"], "env": {}}}
                 if launched else {"mode": "attached", "url": "http://x"},
                 run_options={"reference": "solo", "repeat": 1, "near_tie_nats": 0.25,
                              "golden": False, "strict": True, "on_timeout": "continue",
                              "reference_cache_state": "cold"})
    m.phases = [PhaseRecord(index=0, name="fz-1", scenario="fz", concurrency=2, status=status)]
    if reproducers:
        row = {"source": "fuzz", "path": "repro.toml", "schedule": "1 phase, C2",
               "summary_table": "fuzz_summary"}
        if confirmed:
            row["verdict"] = "reproduced 2/2 on fresh engines"
            row["confirmation"] = {"runs": 2, "reproduced": 2, "errors": 0, "inconclusive": 0,
                                   "fresh_engine": True, "rate": "2/2", "side_by_side": 1,
                                   "verdict": row["verdict"], "replays": []}
        m.tables["reproducers"] = [row]
        m.tables["fuzz_summary"] = [{"examples": 3}]
        (d / "repro.toml").write_text(REPRO)
    write_manifest(d / "manifest.json", m)
    return d


class Runner:
    """A stand-in for :func:`pleharness.pipeline.run_stress`, the run each replay is: the
    configs it got, and the exit codes it returns in turn (no engine: the job's logic, not the
    engine, is under test here)."""

    def __init__(self, *codes: int):
        self.codes, self.cfgs = list(codes), []

    def __call__(self, cfg, console, err, spares=None):
        self.cfgs.append(cfg)
        code = self.codes.pop(0)
        d = Path(cfg.output.results_dir) / cfg.output.run_id
        d.mkdir(parents=True)
        write_manifest(d / "manifest.json", Manifest(run_id=cfg.output.run_id,
                                                      status="complete", exit_code=code))
        return code


def _replays(monkeypatch, *codes: int) -> Runner:
    """A :class:`Runner` in place of ``run_stress`` where the confirmation calls it: the
    pipeline's own (the job imports it; nothing is handed in)."""
    runner = Runner(*codes)
    monkeypatch.setattr(pipeline, "run_stress", runner)
    return runner


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))


def _result(run_dir: Path) -> ConfirmResult:
    (f,) = run_dir.glob("confirm-*/confirm.json")
    return ConfirmResult.model_validate_json(f.read_text())


@pytest.mark.parametrize("codes, exit_code, rate", [((1, 1), 1, "2/2"), ((0, 0), 0, "0/2"),
                                                    ((1, 0), 1, "1/2"), ((3, 3), 3, "0/2")])
def test_confirm_replays_each_reproducer_on_the_runs_configuration(tmp_path, monkeypatch, codes,
                                                                   exit_code, rate):
    d = _run(tmp_path)
    before = (d / "manifest.json").read_bytes()
    runner = _replays(monkeypatch, *codes)
    assert run_confirm(d, 2, console=_quiet()) == exit_code
    assert (d / "manifest.json").read_bytes() == before  # the run's own record is not changed
    for cfg in runner.cfgs:  # a replay: the run's launch, judged as the run recorded it
        assert cfg.suite.scenarios == [str(d / "repro.toml")]
        assert cfg.engine.model == str(d.parent / "tiny")
        assert cfg.engine.args == ["--max-num-seqs", "4"]
        assert (cfg.verdict.near_tie_nats, cfg.verdict.strict, cfg.verdict.golden,
                cfg.reference.cache_state) == (0.25, True, False, "cold")
        assert not cfg.control and cfg.confirmation.runs == 0
    res = _result(d)
    # no replay ran to a verdict (each ended in an error): the job failed, exit 3 (issue 50)
    status = "failed" if exit_code == 3 else "complete"
    assert (res.status, res.exit_code, res.runs, res.run_id) == (status, exit_code, 2, "run")
    assert (res.job.status, res.job.exit_code) == (status, exit_code)
    assert res.job.steps_done == ["run", "configuration", "confirmation", "result"]
    (row,) = res.reproducers
    # this job's own confirmation, not the run's earlier "reproduced 2/2"
    assert row.confirmation.rate == rate and row.confirmation.fresh_engine
    assert row.verdict == row.confirmation.verdict
    assert [Path(r.manifest).parent.parent for r in row.confirmation.replays] == \
        [next(d.glob("confirm-*"))] * 2  # the replays' folders beside confirm.json


def test_confirm_takes_another_engine_python(tmp_path, monkeypatch):
    d = _run(tmp_path)
    other = str(Path(sys.executable).parent / "python3")  # another launcher than the run's
    runner = _replays(monkeypatch, 0)
    assert run_confirm(d, 1, engine_python=other, console=_quiet()) == 0
    assert runner.cfgs[0].engine.python == other == _result(d).engine_python
    # not reproduced on another build is that build's result, not a timing-dependent failure
    assert _result(d).reproducers[0].verdict == \
        f"0/1: not reproduced on fresh engines of --engine-python {other}"


def test_an_interrupted_confirmation_keeps_what_it_learned(tmp_path, monkeypatch):
    d = _run(tmp_path)
    _replays(monkeypatch, 1, 130)
    assert run_confirm(d, 2, console=_quiet()) == 130  # a replay interrupted
    res = _result(d)
    assert (res.status, res.exit_code) == ("interrupted", 130) and res.ended_at


def test_ctrl_c_between_replays_keeps_what_it_learned(tmp_path, monkeypatch):
    d = _run(tmp_path)

    def runner(cfg, console, err, spares=None):  # Ctrl-C outside any replay's engine session
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline, "run_stress", runner)
    assert run_confirm(d, 2, console=_quiet()) == 130
    res = _result(d)
    assert (res.status, res.exit_code) == ("interrupted", 130) and res.ended_at


def test_a_reproducer_the_run_no_longer_fails_is_not_replayed(tmp_path, monkeypatch):
    d = _run(tmp_path, status="pass")  # e.g. the control run explained it
    runner = _replays(monkeypatch)
    assert run_confirm(d, 2, console=_quiet()) == 0
    assert runner.cfgs == [] and _result(d).reproducers[0].verdict == NOT_STILL_FAILING


@pytest.mark.parametrize("kw, message", [
    ({"reproducers": False}, "the run wrote no reproducer"),
    ({"launched": False}, "confirm relaunches the engine"),
])
def test_bad_input_is_a_usage_error_before_anything_starts(tmp_path, monkeypatch, kw, message):
    d = _run(tmp_path, **kw)
    runner = _replays(monkeypatch)
    with pytest.raises(UsageError, match=message):
        run_confirm(d, 2, console=_quiet())
    assert runner.cfgs == [] and not list(d.glob("confirm-*"))


def test_a_missing_reproducer_file_or_python_is_a_usage_error(tmp_path, monkeypatch):
    d = _run(tmp_path)
    runner = _replays(monkeypatch)
    with pytest.raises(UsageError, match="--engine-python /no/such/python"):
        run_confirm(d, 1, engine_python="/no/such/python", console=_quiet())
    (d / "repro.toml").unlink()
    with pytest.raises(UsageError, match="cannot be replayed:\n  - repro.toml: file not found"):
        run_confirm(d, 1, console=_quiet())
    with pytest.raises(UsageError, match="--runs 0"):
        run_confirm(d, 0, console=_quiet())
    assert runner.cfgs == [] and not list(d.glob("confirm-*"))


def test_the_command_line_exits_2_with_the_reason(tmp_path):
    d = _run(tmp_path, reproducers=False)
    r = run_cli("confirm", str(d))
    assert r.returncode == 2 and "the run wrote no reproducer" in r.stderr, r.stderr
    r = run_cli("confirm", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not a readable ple-harness manifest" in r.stderr, r.stderr
    r = CliRunner().invoke(app, ["confirm", str(d), "--runs", "0"])
    assert r.exit_code == 2 and "--runs" in r.output
    assert json.loads((d / "manifest.json").read_text())["run_id"] == "run"
    assert not list(d.glob("confirm-*"))


def test_confirm_runs_replays_side_by_side_and_stamps_when_one_reproduced(tmp_path, monkeypatch):
    """issue 49: ``confirm --parallel-engines`` as the other jobs (on the CPU: N engines when
    the memory fits), and ``confirm.json`` says when the first reproducer reproduced."""
    d = _run(tmp_path)
    _replays(monkeypatch, 0, 1)
    assert run_confirm(d, 2, console=_quiet(), parallel_engines=2) == 1
    res = _result(d)
    assert res.side_by_side["parallel_engines"] == 2
    assert res.reproducers[0].confirmation.side_by_side == 2
    t = res.timeline
    assert t.confirmed_s is not None and t.ended_s is not None and t.confirmed_s <= t.ended_s
    (tmp_path / "b").mkdir()
    d2 = _run(tmp_path / "b")
    _replays(monkeypatch, 0)
    assert run_confirm(d2, 1, console=_quiet()) == 0
    assert _result(d2).timeline.confirmed_s is None  # nothing reproduced: no time stamp


def test_confirm_moves_the_compile_cache_and_refuses_engines_that_do_not_fit(tmp_path, monkeypatch):
    d = _run(tmp_path)
    runner = _replays(monkeypatch, 0)
    assert run_confirm(d, 1, console=_quiet(), compile_cache=str(tmp_path / "cc")) == 0
    assert runner.cfgs[0].engine.env["VLLM_CACHE_ROOT"] == str(tmp_path / "cc")
    runner = _replays(monkeypatch)
    with pytest.raises(UsageError, match="--parallel-engines 100000"):
        run_confirm(d, 1, console=_quiet(), parallel_engines=100000)
    assert runner.cfgs == []
