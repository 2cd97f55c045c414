"""Issue 50 item 2: one job frame and one job record. Every job (stress, fuzz, confirm, explain,
selftest, facts) writes the same :class:`~pleharness.jobrecord.JobRecord` under ``job`` in its
own file (manifest.json, confirm.json, explain.json, selftest.json, the facts --json file), and
the same cause ends every job with the same status and exit code: interrupted (SIGTERM: 143,
Ctrl-C: 130), an engine that cannot start (3), an internal error (4).

No engine runs here: the engine start every job goes through
(:meth:`pleharness.engine.session.EngineSession.start`) is replaced by one that raises the cause
(for ``confirm``, whose engines are its replays', the cause is raised in each replay, a
``stress`` run of its own; its internal error inside its own confirmation step). What leaves
the job function is mapped to the exit code as the command line maps it
(:func:`pleharness.cli.run`)."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from rich.console import Console

from doubles import FakeEngine
from pleharness import confirmjob
from pleharness.config import AttachConfig, OutputConfig, StressConfig, SuiteConfig
from pleharness.engine.session import EngineSession
from pleharness.engine.side_by_side import SideBySide
from pleharness.errors import EngineError, ExitCode, HarnessError, Interrupted
from pleharness.explain import job as explain_job
from pleharness.explain.suspects import Case
from pleharness.jobrecord import JOB_NAMES, JobFrame, JobRecord, job_outcome
from pleharness.manifest import Manifest, PhaseRecord, write_manifest

FACTS = {"block_size": 32, "max_num_batched_tokens": 256, "num_speculative_tokens": 0,
         "max_num_seqs": 8, "vocab_size": 600, "dtype": "float32"}
REPRO = """kind = "replay"

[[params.phases]]
name = "p1"
concurrency = 1

[[params.phases.requests]]
prompt = [5, 6, 7]
max_tokens = 4
"""
KEYS = list(JobRecord.model_fields)  # the one shape, in order


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=200)


def cli_exit_code(exc: BaseException) -> int:
    """The exit code :func:`pleharness.cli.run` gives an exception that leaves a job."""
    if isinstance(exc, HarnessError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.SIGINT)
    return int(ExitCode.INTERNAL)


def _call(fn) -> int:
    try:
        return int(fn())
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - as the command line does
        return cli_exit_code(exc)


def _cfg(url: str, out: Path, run_id: str, scenarios=("determinism",)) -> StressConfig:
    return StressConfig(attach=AttachConfig(url=url, explicit_facts=dict(FACTS)),
                        suite=SuiteConfig(scenarios=list(scenarios)),
                        output=OutputConfig(results_dir=out, run_id=run_id, invocation=["x"]))


# -- each job, run until the cause ends it: (exit code, its file's "job") ------------------------
def job_stress(tmp_path, monkeypatch):
    from pleharness.pipeline import run_stress
    with FakeEngine() as eng:
        code = _call(lambda: run_stress(_cfg(eng.url, tmp_path, "s"), _quiet(), _quiet()))
    return code, json.loads((tmp_path / "s" / "manifest.json").read_text())


def job_fuzz(tmp_path, monkeypatch):
    from pleharness.fuzzjob import run_fuzz
    with FakeEngine() as eng:
        code = _call(lambda: run_fuzz(_cfg(eng.url, tmp_path, "f", ()),
                                      {"max_examples": 2, "seed": 0, "features": False},
                                      _quiet(), _quiet()))
    return code, json.loads((tmp_path / "f" / "manifest.json").read_text())


def _launched_run(tmp_path: Path) -> Path:
    """A finished launched run with one failing phase and its reproducer (as fuzz writes)."""
    d = tmp_path / "run"
    d.mkdir()
    (tmp_path / "tiny").mkdir(exist_ok=True)  # the run's model folder
    m = Manifest(run_id="run", status="complete", verdict="fail",
                 scenarios=[{"name": "fz", "kind": "fuzz"}],
                 engine={"mode": "launched", "model": "tiny",
                         "launch": {"model": str(tmp_path / "tiny"), "python": sys.executable,
                                    "engine_args": [], "env": {}}},
                 run_options={"reference": "solo", "repeat": 1, "near_tie_nats": 0.25,
                              "golden": False, "strict": False, "on_timeout": "continue",
                              "reference_cache_state": "warm"})
    m.phases = [PhaseRecord(index=0, name="fz-1", scenario="fz", concurrency=1, status="fail")]
    m.tables["reproducers"] = [{"source": "fuzz", "path": "repro.toml", "schedule": "C1[3+4]",
                                "summary_table": "fuzz_summary"}]
    (d / "repro.toml").write_text(REPRO)
    write_manifest(d / "manifest.json", m)
    return d


def job_confirm(tmp_path, monkeypatch):
    d = _launched_run(tmp_path)
    code = _call(lambda: confirmjob.run_confirm(d, 1, console=_quiet()))
    (f,) = d.glob("confirm-*/confirm.json")
    return code, json.loads(f.read_text())


def job_explain(tmp_path, monkeypatch):
    d = _launched_run(tmp_path)
    case = Case(1, "h", 1, "fz-1", ["r1"], 2, {"alone": (1, [([5, 6, 7], 4)])}, prompt_len=3)
    monkeypatch.setattr(explain_job, "failing_cases", lambda m, w=False: [case])
    monkeypatch.setattr(explain_job, "_plan", lambda report, m, *a: (
        explain_job.run_target(m, None, 60.0, None), None, SideBySide(), None))

    def replay_all(session, target, *a):  # the configuration under test, started first
        session.start(target)
    monkeypatch.setattr(explain_job, "replay_all", replay_all)
    code = _call(lambda: explain_job.explain(d, console=_quiet(), confirm_runs=0))
    return code, json.loads((d / "explain" / "explain.json").read_text())


def job_selftest(tmp_path, monkeypatch):
    from pleharness.selftest import run_selftest
    with FakeEngine() as eng:
        code = _call(lambda: run_selftest(_cfg(eng.url, tmp_path, "x"), ["oov_id"], _quiet(),
                                          _quiet(), "st"))
    return code, json.loads((tmp_path / "st" / "selftest.json").read_text())


def job_facts(tmp_path, monkeypatch):
    from pleharness.factsjob import FactsConfig, run_facts
    with FakeEngine() as eng:
        cfg = FactsConfig(url=eng.url, log_dir=tmp_path / "facts",
                          json_path=tmp_path / "facts.json", explicit=dict(FACTS))
        code = _call(lambda: run_facts(cfg, _quiet()))
    return code, json.loads((tmp_path / "facts.json").read_text())


JOBS = {"stress": job_stress, "fuzz": job_fuzz, "confirm": job_confirm,
        "explain": job_explain, "selftest": job_selftest, "facts": job_facts}

# cause -> (the exception the engine start raises, the status and exit code every job ends with)
CAUSES = {
    "sigterm": (lambda: Interrupted(signal.SIGTERM), "interrupted", 143),
    "ctrl-c": (lambda: KeyboardInterrupt(), "interrupted", 130),
    "engine cannot start": (lambda: EngineError(
        "engine exited during startup (exit 1)", root_cause="RuntimeError: planted start "
        "failure"), "failed", 3),
    "internal error": (lambda: RuntimeError("a planted harness bug"), "failed", 4),
}


def _run_with_cause(job: str, cause: str, tmp_path, monkeypatch) -> tuple[int, dict]:
    make = CAUSES[cause][0]

    def start(self, *a, **kw):
        raise make()
    monkeypatch.setattr(EngineSession, "start", start)
    if job == "confirm" and cause == "internal error":  # its replays are stress runs (each
        def broken(*a, **kw):  # maps its own error): the bug is in confirm's own step
            raise make()
        monkeypatch.setattr(confirmjob, "confirm_run_reproducers", broken)
    return JOBS[job](tmp_path, monkeypatch)


def test_the_table_covers_every_job():
    assert tuple(JOBS) == JOB_NAMES


@pytest.mark.parametrize("cause", list(CAUSES))
@pytest.mark.parametrize("job", list(JOBS))
def test_every_job_ends_alike_for_the_same_cause(job, cause, tmp_path, monkeypatch):
    code, data = _run_with_cause(job, cause, tmp_path, monkeypatch)
    rec = data["job"]
    _, status, exit_code = CAUSES[cause]
    assert list(rec) == KEYS, rec  # one shape, every key present
    assert (rec["job"], rec["status"], rec["exit_code"], code) == (job, status, exit_code,
                                                                  exit_code), rec
    assert rec["started_at"] and rec["ended_at"] and rec["started_at"] <= rec["ended_at"]
    assert rec["reason"], rec
    if cause == "engine cannot start" and job != "confirm":  # confirm's engines: its replays'
        assert rec["root_cause"] == "RuntimeError: planted start failure", rec
    if job == "explain":  # explain.json's own status is its progress line ("launch 2 of 4
        # done", "interrupted (...) after 2 launch(es)", "stopped by an error after ...")
        assert data["status"].startswith("interrupted" if status == "interrupted" else "stop")
    elif "status" in data:  # the file's own top-level status and exit code are the record's
        assert data["status"] == rec["status"], data.get("status")
        assert data.get("exit_code") == rec["exit_code"]
    JobRecord.model_validate(rec)


def test_every_jobs_file_embeds_the_record_in_one_shape(tmp_path, monkeypatch):
    """The record's JSON keys are the same in every job's file (here: engines that cannot
    start), and the steps it names are the job's own."""
    shapes, steps = {}, {}
    for job in JOBS:
        folder = tmp_path / job
        folder.mkdir()
        with monkeypatch.context() as mp:
            _, data = _run_with_cause(job, "engine cannot start", folder, mp)
        shapes[job], steps[job] = list(data["job"]), data["job"]["steps_done"]
    assert all(s == KEYS for s in shapes.values()), shapes
    # what finished before the engine start: confirm's own steps up to its replays, explain's
    # plan; the others had not finished a step
    assert steps == {"stress": [], "fuzz": [], "confirm": ["run", "configuration",
                                                            "confirmation", "result"],
                     "explain": ["plan"], "selftest": [], "facts": []}, steps


def test_job_outcome_is_the_one_mapping(tmp_path):
    assert job_outcome(Interrupted(signal.SIGINT))[:3] == ("interrupted", 130,
                                                           "interrupted by SIGINT")
    assert job_outcome(KeyboardInterrupt())[:3] == ("interrupted", 130, "interrupted by SIGINT")
    e = EngineError("died", root_cause="OOM")
    assert job_outcome(e) == ("failed", 3, "died", "OOM")
    assert job_outcome(e, engine_ready=True).status == "engine_died"
    out = job_outcome(ValueError("bug"), crash_dir=tmp_path)
    assert out[:2] == ("failed", 4) and "traceback in harness-error.log" in out.reason
    assert "ValueError" in (tmp_path / "harness-error.log").read_text()


def test_the_frame_saves_each_step_and_keeps_or_raises_the_error():
    saved = []
    with JobFrame("facts", lambda r: saved.append(r.model_copy(deep=True)),
                  reraise=False) as frame:
        with frame.step("engine"):
            pass
        with frame.step("report"):
            raise Interrupted(signal.SIGTERM)
    assert isinstance(frame.error, Interrupted)
    assert [s.steps_done for s in saved] == [[], ["engine"], ["engine"]]
    assert (saved[-1].status, saved[-1].exit_code) == ("interrupted", 143)
    with pytest.raises(RuntimeError):
        with JobFrame("facts", lambda r: None) as frame:
            raise RuntimeError("x")
    assert (frame.record.status, frame.record.exit_code) == ("failed", 4)


def test_a_complete_run_records_its_steps_and_its_verdict(tmp_path):
    """On the way that works, the record says complete with the job's exit code and every step
    it ran, and the manifest's own top-level fields are the record's."""
    from pleharness.factsjob import FactsConfig, run_facts
    from pleharness.pipeline import run_stress
    with FakeEngine() as eng:
        code = run_stress(_cfg(eng.url, tmp_path, "ok"), _quiet(), _quiet())
        facts = FactsConfig(url=eng.url, log_dir=tmp_path / "facts",
                            json_path=tmp_path / "facts.json", explicit=dict(FACTS))
        assert run_facts(facts, _quiet()) == 0
    m = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    rec = m["job"]
    assert (rec["job"], rec["status"], rec["exit_code"]) == ("stress", "complete", code)
    assert rec["steps_done"] == ["engines", "suite", "evidence", "sides", "verdict"]
    assert {k: rec[k] for k in ("status", "exit_code", "reason", "root_cause", "started_at",
                                "ended_at")} == \
        {k: m[k] for k in ("status", "exit_code", "reason", "root_cause", "started_at",
                           "ended_at")}
    rec = json.loads((tmp_path / "facts.json").read_text())["job"]
    assert (rec["status"], rec["exit_code"], rec["steps_done"]) == ("complete", 0,
                                                                    ["engine", "report"])
