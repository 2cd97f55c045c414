"""One configuration (issue 28 move 3): option groups declared once and shared, validation in
pleharness/config.py, fuzz's flags bound to FuzzParams, one q rule, the ExitCode enum. No engine:
the job functions are replaced by recorders, so only parsing and validation run."""
from __future__ import annotations

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from pleharness.cli import app
from pleharness.cli.options import EngineOptions, Pick, grouped
from pleharness.errors import EngineError, ExitCode, UsageError
from pleharness.fuzzjob import fuzz_config

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=True)


@pytest.fixture
def facts_cfg(monkeypatch):
    """Record the FactsConfig that `facts` would run with (nothing is launched)."""
    seen = []
    monkeypatch.setattr("pleharness.cli.facts.run_facts",
                        lambda cfg, console: seen.append(cfg) or 0)
    return seen


@pytest.fixture
def stress_cfg(monkeypatch):
    """Record the StressConfig that `stress` / `fuzz` would run with (nothing is launched)."""
    seen = []
    # each command module holds the job it runs; fuzz's records the config its job would run
    monkeypatch.setattr("pleharness.cli.stress.run_stress",
                        lambda cfg, console=None, err_console=None: seen.append(cfg) or 0)
    monkeypatch.setattr("pleharness.cli.fuzz.run_fuzz",
                        lambda cfg, params, console=None, err_console=None:
                        seen.append(fuzz_config(cfg, params)) or 0)
    return seen


def test_facts_finds_a_shipped_profile_by_name_as_stress_does(facts_cfg, stress_cfg):
    # the drift of issue 28: facts took only a path (load_profile) and missed the shipped names
    r = invoke("facts", "--engine-profile", "cpu-ngram", "--engine-arg=--enforce-eager")
    assert r.exit_code == 0, r.output + repr(r.exception)
    (cfg,) = facts_cfg
    assert cfg.engine_args[:2] == ["--block-size", "32"] and cfg.engine_args[-1] == "--enforce-eager"
    assert cfg.engine_env.get("VLLM_CPU_KVCACHE_SPACE") == "1"
    r = invoke("stress", "--engine-profile", "cpu-ngram", "--engine-arg=--enforce-eager")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert stress_cfg[0].engine.args == cfg.engine_args  # one resolution for both commands


def test_facts_refuses_what_stress_refuses(facts_cfg):
    r = invoke("facts", "--url", "http://127.0.0.1:8000", "--model", "/m", "--tp", "2")
    assert isinstance(r.exception, UsageError)
    assert "--model, --tp: launch option(s), but --url attaches" in str(r.exception)
    r = invoke("facts", "--engine-arg", "--max-num-seqs 8")
    assert isinstance(r.exception, UsageError) and "--engine-arg=--max-num-seqs=8" in \
        str(r.exception).replace("--engine-arg --max-num-seqs=8", "--engine-arg=--max-num-seqs=8")
    r = invoke("facts", "--engine-profile", "no-such-profile")
    assert isinstance(r.exception, UsageError) and "no-such-profile" in str(r.exception)
    assert facts_cfg == []


def test_fuzz_max_drawn_tokens_and_its_deprecated_alias(stress_cfg):
    r = invoke("fuzz", "--max-drawn-tokens", "7")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert dict(stress_cfg[-1].suite.scenarios[0][1])["max_tokens"] == 7
    r = invoke("fuzz", "--max-tokens", "5")  # hidden, deprecated: still works, with a warning
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert dict(stress_cfg[-1].suite.scenarios[0][1])["max_tokens"] == 5
    r = invoke("fuzz", "--max-tokens", "5", "--max-drawn-tokens", "6")
    assert isinstance(r.exception, UsageError) and "--max-drawn-tokens" in str(r.exception)
    import typer.main
    params = {o: p for p in typer.main.get_command(app).commands["fuzz"].params for o in p.opts}
    assert params["--max-tokens"].hidden and not params["--max-drawn-tokens"].hidden


def test_fuzz_options_carry_the_bounds_and_defaults_of_fuzz_params():
    import typer.main

    from pleharness.cli.fuzz import FUZZ_FLAGS
    from pleharness.scenarios.fuzz.strategy import FuzzParams
    cmd = typer.main.get_command(app).commands["fuzz"]
    by_name = {p.name: p for p in cmd.params}
    for field, name, _ in FUZZ_FLAGS:
        info, opt = FuzzParams.model_fields[field], by_name[name]
        assert opt.default == info.default, name
        ge = [m.ge for m in info.metadata if getattr(m, "ge", None) is not None]
        le = [m.le for m in info.metadata if getattr(m, "le", None) is not None]
        assert opt.min == (ge[0] if ge else None), name
        assert opt.max == (le[0] if le else None), name


def test_fuzz_gt_bound_is_checked_by_fuzz_params(stress_cfg):
    # --time-budget was min=1.0 on the command line but gt=0 in FuzzParams: now one bound
    assert invoke("fuzz", "--time-budget", "0.5").exit_code == 0
    assert stress_cfg[-1].suite.scenarios[0][1]["time_budget_s"] == 0.5
    r = invoke("fuzz", "--time-budget", "0")
    assert isinstance(r.exception, UsageError) and str(r.exception).startswith("--time-budget 0.0")


def test_fuzz_takes_the_shared_groups_with_its_own_request_timeout(stress_cfg):
    assert invoke("fuzz").exit_code == 0
    cfg = stress_cfg[-1]
    assert cfg.timeouts.total_s == 600.0 and cfg.verdict.golden and cfg.engine.probe
    r = invoke("fuzz", "--block-size", "32")  # an attach-only fact without --url, as in stress
    assert isinstance(r.exception, UsageError) and "--block-size is for attaching" in str(r.exception)


def test_grouped_refuses_an_unknown_pick_and_needs_a_context():
    def cmd(ctx: typer.Context, engine: Annotated[EngineOptions, Pick(without=("hots",))]):
        pass
    with pytest.raises(TypeError, match="hots"):
        grouped(cmd)

    def no_ctx(engine: EngineOptions):
        pass
    with pytest.raises(TypeError, match="typer.Context"):
        grouped(no_ctx)


def test_query_len_one_rule_for_an_unknown_k():
    from pleharness.engine.facts import EngineFacts, query_len
    assert query_len({"num_speculative_tokens": 3}) == 4
    assert query_len({"num_speculative_tokens": 0}) == 1
    assert query_len({}) is None  # unknown k: q unknown, never guessed
    assert EngineFacts().q == 1  # a length derivation goes on with the lengths without spec decode


def test_exit_codes_are_one_enum():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 130, 143]
    assert UsageError.exit_code is ExitCode.USAGE and EngineError.exit_code is ExitCode.ENGINE
