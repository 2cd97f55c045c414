"""docs/extending.md is real: its new check and new scenario kind register from their one file
each, their registration lines match the real import lists plus the new module, and a stress run
of the documented scenario file against the engine double runs them."""
import ast
import io
import re
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

from doubles import FakeEngine
from pleharness import checks, scenarios
from pleharness.engine.completion import Completion
from pleharness.manifest import load_manifest

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "extending.md").read_text()
BLOCKS = re.findall(r"```(\w+)(?: file=(\S+))?\n(.*?)```", DOC, re.S)
FILES = {name: code for _, name, code in BLOCKS if name}
REGISTRATION = [code for lang, name, code in BLOCKS if lang == "python" and not name]


def _exec_module(dotted: str, code: str) -> types.ModuleType:
    """Execute ``code`` as module ``dotted`` inside the package (its relative imports work)."""
    mod = types.ModuleType(dotted)
    mod.__package__ = dotted.rsplit(".", 1)[0]
    sys.modules[dotted] = mod
    exec(compile(code, f"docs/extending.md:{dotted}", "exec"), mod.__dict__)
    return mod


@pytest.fixture
def documented():
    """The doc's check and scenario kind, registered for one test and removed after it."""
    before = dict(checks.REGISTRY), dict(scenarios.REGISTRY)
    try:
        chk = _exec_module("pleharness.checks.finish_reason_known",
                           FILES["pleharness/checks/finish_reason_known.py"])
        kind = _exec_module("pleharness.scenarios.flat", FILES["pleharness/scenarios/flat.py"])
        yield chk, kind
    finally:
        for reg, old in zip((checks.REGISTRY, scenarios.REGISTRY), before):
            reg.clear()
            reg.update(old)
        sys.modules.pop("pleharness.checks.finish_reason_known", None)
        sys.modules.pop("pleharness.scenarios.flat", None)


def _imported_names(code: str) -> set[str]:
    tree = ast.parse(code.strip())
    return {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.level == 1 and not node.module for a in node.names}


def test_the_registration_lines_are_the_real_import_lists_plus_one_module():
    check_line, scenario_line = REGISTRATION
    real_checks = _imported_names((ROOT / "pleharness/checks/__init__.py").read_text())
    real_kinds = _imported_names((ROOT / "pleharness/scenarios/__init__.py").read_text())
    assert _imported_names(check_line) == real_checks | {"finish_reason_known"}
    assert _imported_names(scenario_line) == real_kinds | {"flat"}


def test_the_documented_check_registers_and_judges(documented):
    assert "finish_reason_known" in checks.REGISTRY
    check = checks.REGISTRY["finish_reason_known"]
    ok = check(None, None, Completion(token_ids=[1], finish_reason="length"), {})
    bad = check(None, None, Completion(token_ids=[1], finish_reason="abort"), {})
    failed = check(None, None, Completion(error="timeout"), {})
    assert (ok.status, bad.status, failed.status) == ("pass", "fail", "skip")
    assert "'abort'" in bad.detail
    assert check(None, None, Completion(token_ids=[1], finish_reason="abort"),
                 {"allowed": ["abort"]}).status == "pass"


def test_register_refuses_an_incomplete_kind(documented):
    _, kind = documented
    with pytest.raises(TypeError, match="phases"):
        scenarios.register(type("NoPhases", (kind.Flat,), {"kind": "flat2", "phases": None}))
    with pytest.raises(TypeError, match="registered already"):
        scenarios.register(type("Again", (kind.Flat,), {}))


def test_the_documented_scenario_runs_in_a_stress_run(documented, tmp_path):
    from pleharness.config import AttachConfig, OutputConfig, StressConfig, SuiteConfig
    from pleharness.stress import run_stress
    toml = tmp_path / "flat.toml"
    toml.write_text(FILES["scenarios/flat.toml"])
    out = io.StringIO()
    with FakeEngine() as eng:
        code = run_stress(StressConfig(attach=AttachConfig(url=eng.url,
                                                           explicit_facts={"vocab_size": 600}),
                                       suite=SuiteConfig(scenarios=[str(toml)]),
                                       output=OutputConfig(results_dir=tmp_path, run_id="flat")),
                          Console(file=out, width=200), Console(file=out, width=200))
    assert code == 0, out.getvalue()
    m = load_manifest(tmp_path / "flat")
    assert m.scenarios[0]["kind"] == "flat" and m.scenarios[0]["params"]["concurrency"] == 4
    assert m.summary.phases_planned == 1
    load = [p for p in m.phases if p.role == "load"]
    assert [(p.name, p.concurrency, p.requests, p.status) for p in load] == \
        [("flat-c4", 4, 8, "pass")]
    reqs = [r for r in m.requests if r.phase == "flat-c4"]
    assert len(reqs) == 8 and all(r.match for r in reqs)
    assert all({c.name: c.status for c in r.checks}.get("finish_reason_known") == "pass"
               for r in reqs)
    assert m.tables["flat"] == [{"phase": "flat-c4", "status": "pass", "matched": 8}]


def test_a_check_name_registered_twice_is_refused(documented):
    with pytest.raises(ValueError, match="registered already"):
        checks.register("finish_reason_known")(lambda ctx, spec, c, params: None)
    with pytest.raises(ValueError, match="registered already"):
        checks.register_phase("health_after_phase")(lambda ctx, ph: None)
    assert checks.REGISTRY["finish_reason_known"].__module__ == \
        "pleharness.checks.finish_reason_known"
