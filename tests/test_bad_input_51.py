"""Issue 51 item 3: the "wrong" and "internal" rows of the new-user review of bad input
(shared/reviews/new-user-bad-input-3.md; docs/bad-input.md has the whole table with outcomes).
Each test names its rows; most call the function that decides, the rest run the command line
without an engine (a FakeEngine double where a server must answer)."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from doubles import FakeEngine

from pleharness import golden
from pleharness.cli import redacted_message
from pleharness.cli.assemble import api_key_from_env, option_problems
from pleharness.cli.options import AttachOptions, EngineOptions
from pleharness.compare import compare
from pleharness.option_rules import engine_arg_problems, parse_env
from pleharness.engine.launch import engine_python_check
from pleharness.engine.session import Interrupted
from pleharness.engine.side_by_side import parse_parallel
from pleharness.errors import UsageError
from pleharness.explain.job import suspect_problems
from pleharness.files import (BusyError, check_db_folder, check_json_path, check_writable_folder,
                              exclusive_lock)
from pleharness.manifest import Manifest, load_manifest
from pleharness.manifest.tables import ReproducerRow
from pleharness.profile import EngineProfile
from pleharness import pipeline
from pleharness.pipeline import replay_reproducer
from pleharness.reproduce import ReplayTarget, restore_env
from pleharness.run.rundir import new_run_dir
from pleharness.tomlfile import find_named

SECRET = "sk-SECRET-51"


def _launched(engine_args=(), env=None, profile=None, model="/nonexistent") -> Manifest:
    m = Manifest(run_id="r")
    m.engine.assign(mode="launched", launch={"model": model, "python": sys.executable,
                                             "engine_args": list(engine_args),
                                             "env": env or {}, "profile": profile})
    return m


# -- SE05 SE06 SE07 SE14 SE15 SE20: secrets given in the wrong place are never echoed ----------
def test_api_key_env_given_the_key_itself_is_not_echoed(monkeypatch):
    with pytest.raises(UsageError) as e:
        api_key_from_env(SECRET)  # SE05: the value instead of a variable's name
    assert SECRET not in str(e.value) and "NAME of an environment variable" in str(e.value)
    for bad in ("sk-NL\nX-Injected: 1", "ключ-SE07", " padded "):  # SE06, SE07
        monkeypatch.setenv("PLE_K51", bad)
        with pytest.raises(UsageError) as e:
            api_key_from_env("PLE_K51")
        assert "cannot carry" in str(e.value) and bad.strip() not in str(e.value)
    monkeypatch.setenv("PLE_K51", SECRET)
    assert api_key_from_env("PLE_K51") == SECRET


def test_engine_env_and_engine_arg_problems_redact_values():
    with pytest.raises(UsageError) as e:
        parse_env([SECRET])  # SE14: NAME= forgotten
    assert SECRET not in str(e.value) and "expected NAME=VALUE" in str(e.value)
    for where in ("--engine-arg", "--control-engine-arg"):  # SE15, SE20
        (p,) = engine_arg_problems([f"--api-key {SECRET}"], where)
        assert SECRET not in p and "use the = form" in p and "<redacted>" in p
    msg = redacted_message(f"Got unexpected extra argument(s) ({SECRET})",
                           ["stress", "--engine-arg=--api-key", SECRET])
    assert SECRET not in msg


# -- PR15 PR16 PR28-PR31 EXN07: engine flags the harness sets itself ----------------------------
def test_flags_the_harness_sets_are_refused_from_the_user_and_profiles():
    for arg, flag in (("--port=8000", "--port"), ("--model=/other", "--model"),
                      ("--served_model_name=x", "--served-model-name"),
                      (f"--api-key={SECRET}", "--api-key"), ("--host=0.0.0.0", "--host")):
        (p,) = engine_arg_problems([arg], "--engine-arg")
        assert f"the harness sets {flag} itself" in p and SECRET not in p, p
    assert engine_arg_problems(["--max-num-seqs=8", "--enforce-eager"], "--engine-arg") == []
    (p,) = engine_arg_problems(["--port=1"], "--suspect")  # EXN07
    assert "--suspect --port=1" in p


def test_profile_env_names_are_checked():  # PR08
    with pytest.raises(ValueError, match="not an environment variable name"):
        EngineProfile(env={"BAD NAME": "x"})


# -- PE08 PE09 PE11-PE13 PE16: --parallel-engines ---------------------------------------------
def test_parallel_engines_ascii_digits_only_and_not_with_url():
    for bad in ("1_0", "٣", "+2"):
        with pytest.raises(UsageError):
            parse_parallel(bad)
    assert parse_parallel(" 2 ") == 2 and parse_parallel("auto") is None
    out = option_problems(EngineOptions(), AttachOptions(url="http://127.0.0.1:9"),
                          given={"parallel_engines"}, results_dir="results")
    assert any("--parallel-engines" in p and "launch option" in p for p in out)


# -- FZN19 FZN22 FZN30 FS08 FS09 FS12: paths -------------------------------------------------
def test_db_folder_symlink_loop_and_run_folder(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(UsageError, match="symlink loop"):
        check_db_folder(str(tmp_path / "a"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    with pytest.raises(UsageError, match="a run folder"):
        check_db_folder(str(tmp_path / "run"))


def test_fuzz_db_quoted_tilde_is_the_home_folder(tmp_path):
    """FZN22: '~/db' as CI YAML quotes it is refused under HOME's rules, not made as ./~."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "file").write_text("x")
    r = run_cli("fuzz", "--db", "~/file", "--url", "http://127.0.0.1:9", timeout=120,
                env={"HOME": str(home)})
    assert r.returncode == 2 and str(home / "file") in r.stderr, r.stderr


def test_read_only_and_non_utf8_result_paths(tmp_path, monkeypatch):
    bad = Path(os.fsdecode(bytes(tmp_path) + b"/res\xffdir"))
    with pytest.raises(UsageError, match="not UTF-8"):
        new_run_dir(bad)  # FS12
    assert not bad.exists()
    with pytest.raises(UsageError, match="not UTF-8"):
        check_writable_folder(bad, "--results-dir")
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    with pytest.raises(UsageError, match="is not writable"):  # FS08
        check_writable_folder(ro / "facts", "--results-dir")
    with pytest.raises(UsageError, match="is not writable"):  # FS09
        check_json_path(ro / "facts.json")


# -- CK14 CK15 PR27 FS18 FS19 RPN10: FIFOs and devices -------------------------------------------
def test_fifos_and_devices_are_named_not_read(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for p in (fifo, Path("/dev/null")):
        with pytest.raises(UsageError, match="not a regular file"):
            find_named(str(p), [], "scenario")
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(
        {"run_id": "x", "schema_version": 2, "requests_file": "requests.jsonl",
         "requests_count": 1}))
    os.mkfifo(run / "requests.jsonl")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="not a regular file"):  # RPN10: no hang
        load_manifest(run)
    assert time.monotonic() - t0 < 5


# -- CF13 CF15: --engine-python ---------------------------------------------------------------
def test_engine_python_a_folder_or_not_executable(tmp_path):
    assert "is a folder" in engine_python_check(str(tmp_path))
    f = tmp_path / "python"
    f.write_text("")
    assert "not executable" in engine_python_check(str(f))


# -- CF36: the run's redacted environment ------------------------------------------------------
def test_redacted_environment_is_restored_or_refused(monkeypatch):
    monkeypatch.delenv("MY_SETTING_51", raising=False)
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    m = _launched(env={"MY_SETTING_51": "<redacted>", "VLLM_X": "1"})
    with pytest.raises(UsageError, match="MY_SETTING_51"):
        restore_env(m)
    monkeypatch.setenv("MY_SETTING_51", "v")
    env, notes = restore_env(m)
    assert env == {"MY_SETTING_51": "v", "VLLM_X": "1"} and "this shell" in notes[0]
    m = _launched(env={"NVSHMEM_DISABLE_NVLS": "<redacted>"},
                  profile="profiles/gpu-h200-ngram-k2.toml")
    env, notes = restore_env(m)  # the shipped profile's value, not ""
    assert env == {"NVSHMEM_DISABLE_NVLS": "1"} and "engine profile" in notes[0]


# -- CF17 CF19 CF26 CF34: a replay that cannot run says why ------------------------------------
def test_confirm_checks_the_reproducers_before_any_engine(tmp_path):
    from pleharness.confirmjob import check_reproducers
    (tmp_path / "repro.toml").write_text('kind = "replay"\n[[params.phases]\nname=')
    rows = [ReproducerRow(source="fuzz", path="repro.toml", fallback="repro-larger.toml"),
            ReproducerRow(source="fuzz", path="/etc/passwd")]
    with pytest.raises(UsageError) as e:
        check_reproducers(tmp_path, tmp_path, rows)
    text = str(e.value)
    assert "repro.toml: not a replayable scenario" in text  # CF19
    assert "repro-larger.toml: file not found" in text  # CF34
    assert "/etc/passwd: outside the run folder" in text  # CF26


def test_a_refused_replay_keeps_its_reason(tmp_path, monkeypatch):
    def runner(cfg, console, err, spares=None):
        raise UsageError("model path /tmp/dense does not exist")
    monkeypatch.setattr(pipeline, "run_stress", runner)  # the run a replay is
    m = _launched(model=str(tmp_path))
    from pleharness.reproduce import run_config
    target = ReplayTarget(config=run_config(m))
    res = replay_reproducer(tmp_path / "repro.toml", target, 1, tmp_path / "out", log=lambda x: 0)
    (row,) = res.replays
    assert row.error == "model path /tmp/dense does not exist" and row.manifest is None


def test_confirm_checks_the_run_model():  # CF17
    from pleharness.reproduce import check_run_model
    with pytest.raises(UsageError, match="/tmp/dense-51 is not a model folder here"):
        check_run_model(Path("RUN"), "/tmp/dense-51")


# -- CF40: SIGTERM between confirm replays -----------------------------------------------------
def test_sigterm_between_replays_is_an_interrupt():
    from pleharness.confirmjob import _sigterm_interrupts
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as e:
        with _sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert e.value.exit_code == 143 and signal.getsignal(signal.SIGTERM) == before


# -- EXN08 EXN13 EXN15 EXN16: explain's suspects and one explain at a time ---------------------
def test_suspects_that_change_nothing_are_refused():
    m = _launched(engine_args=["--enforce-eager", "--max-num-seqs=8"])
    out = suspect_problems(m, ["--enforce-eager", "--x", "--x"], ["--model", "--no-such-flag",
                                                                  "--max-num-seqs"])
    text = "\n".join(out)
    assert "--suspect --x: given more than once" in text  # EXN13
    assert "--suspect-drop=--model: the harness sets --model itself" in text  # EXN08
    assert "--suspect-drop=--no-such-flag: not among the run's engine arguments" in text  # EXN15
    assert "--suspect=--enforce-eager: the run's engine arguments already say so" in text
    assert "--max-num-seqs" not in text.replace("--enforce-eager --max-num-seqs=8", "")
    # a value that is no flag says so (it used to read "already say so" / "not among")
    out = suspect_problems(m, ["enforce-eager"], ["max-num-seqs"])
    assert out == ["--suspect=enforce-eager: not an engine flag (a flag starts with --, e.g. "
                   "--suspect=--enforce-eager)",
                   "--suspect-drop=max-num-seqs: not an engine flag (a flag starts with --, e.g. "
                   "--suspect-drop=--max-num-seqs)"]


def test_a_second_explain_of_one_run_is_refused(tmp_path):
    with exclusive_lock(tmp_path / ".explain.lock"):
        with pytest.raises(BusyError):
            with exclusive_lock(tmp_path / ".explain.lock"):
                pass
    with exclusive_lock(tmp_path / ".explain.lock"):  # released: free again
        pass


# -- CM02: HEAD that skipped a scenario BASE ran ------------------------------------------------
def test_compare_fails_a_head_that_dropped_a_scenario():
    base, head = Manifest(run_id="b"), Manifest(run_id="h")
    for m in (base, head):
        m.status, m.verdict = "complete", "pass"
    base.scenarios = [{"name": "transitions", "kind": "transitions"},
                      {"name": "boundary", "kind": "boundary"}]
    head.scenarios = [{"name": "transitions", "kind": "transitions"}]
    res = compare(base, head)
    assert any("HEAD did not run boundary" in g for g in res.gate_failures), res.gate_failures
    assert not any(g.startswith("scenarios") for g in compare(base, base).gate_failures)


# -- golden worker: its ready line is waited for with a timeout --------------------------------
def test_golden_worker_without_a_ready_line_times_out(tmp_path, monkeypatch):
    monkeypatch.setattr(golden, "golden_problem", lambda d: None)
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nsleep 60\n")
    slow.chmod(0o755)
    g = golden.GoldenModel(tmp_path, str(slow))
    g.ready_timeout_s = 1
    t0 = time.monotonic()
    with pytest.raises(golden.GoldenError, match="no ready line within 1 s"):
        g.start()
    assert time.monotonic() - t0 < 15
    chatty = tmp_path / "chatty"
    chatty.write_text("#!/bin/sh\necho 'INFO: serving on port 8000'\nsleep 60\n")
    chatty.chmod(0o755)
    with pytest.raises(golden.GoldenError, match="instead of its ready line"):
        golden.GoldenModel(tmp_path, str(chatty)).start()


# -- FZN25: a fuzz run of 0 examples does not pass ---------------------------------------------
def test_fuzz_that_ran_no_example_does_not_pass(tmp_path):
    with FakeEngine() as eng:
        r = run_cli("fuzz", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id", "z",
                    "--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3",
                    "--max-num-seqs", "8", "--vocab-size", "600", "--max-drawn-tokens", "8",
                    "--no-golden", "--no-features", "--time-budget", "0.000001", timeout=300)
    assert r.returncode == 1, (r.stdout + r.stderr)[-2000:]
    assert "0 examples ran" in r.stdout + r.stderr
    m = json.loads((tmp_path / "z" / "manifest.json").read_text())
    assert m["verdict"] == "fail"


# -- SF04 SI07: selftest ------------------------------------------------------------------------
def test_selftest_runs_the_shipped_family_suite():
    r = run_cli("selftest", "--suite", "selftest-families", "--url", "http://127.0.0.1:9",
                timeout=120)
    assert r.returncode == 2 and "for its family" not in r.stderr, r.stderr
    assert "no engine answers" in r.stderr


# -- RPN15: report --exit-zero says exit 0 ------------------------------------------------------
def test_report_exit_zero_note(tmp_path):
    m = Manifest(run_id="k")
    m.status = "running"
    (tmp_path / "manifest.json").write_text(m.model_dump_json())
    r = run_cli("report", str(tmp_path), "--exit-zero", timeout=120)
    assert r.returncode == 0 and "exit 0 (--exit-zero" in r.stderr, r.stderr


def test_selftest_interrupted_in_a_pass_says_interrupted(tmp_path, monkeypatch):
    """SI07: a pass that ended 130 (SIGINT) leaves selftest.json "interrupted", not "complete,
    catches 0/0"."""
    from rich.console import Console

    from pleharness.config import AttachConfig, OutputConfig, StressConfig, SuiteConfig
    from pleharness import selftest
    from pleharness.selftest import run_selftest
    quiet = Console(file=open(os.devnull, "w"))
    # each pass is the pipeline's run_stress, imported by selftest: a pass interrupted (130)
    monkeypatch.setattr(selftest, "run_stress", lambda c, a, b: 130)
    with FakeEngine() as eng:
        cfg = StressConfig(attach=AttachConfig(url=eng.url, explicit_facts={
            "block_size": 32, "max_num_batched_tokens": 256, "num_speculative_tokens": 0,
            "max_num_seqs": 8, "vocab_size": 600, "dtype": "float32"}),
            suite=SuiteConfig(scenarios=["determinism"]),
            output=OutputConfig(results_dir=tmp_path, run_id=None, invocation=["x"]))
        with pytest.raises(Interrupted):
            run_selftest(cfg, ["oov_id"], quiet, quiet, "si07")
    data = json.loads((tmp_path / "si07" / "selftest.json").read_text())
    assert data["status"] == "interrupted" and "headline" not in data


# -- K-co-emptyregex K-co-emptystrchoice K-rp-stopstrempty: constraints that judge nothing -------
def test_empty_constraints_and_stop_strings_are_refused(tmp_path):
    from pleharness.checks.constrained import constraint_problem
    from pleharness.scenarios import load_scenario_file
    assert "matches the empty output" in constraint_problem("regex", "")
    assert "not empty" in constraint_problem("choice", [""])
    assert constraint_problem("regex", "[0-9]{3}") is None
    f = tmp_path / "stop.toml"
    f.write_text('kind = "replay"\ndescription = "x"\n[[params.phases]]\nname = "p"\n'
                 'concurrency = 1\n[[params.phases.requests]]\nprompt = [1, 2]\n'
                 'max_tokens = 4\nstop = [""]\n')
    with pytest.raises(UsageError, match="stop: an empty string"):
        load_scenario_file(str(f))
