"""The scenario contract is a typed facade (issue 34): ScenarioContext's public members are
exactly the ones docs/extending.md documents, each a typed property or a method with the run
context's signature that returns what RunContext's member returns; any other name is the
AttributeError that names the contract, and nothing reaches the manifest or saves it."""
import inspect
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from pleharness.engine.facts import EngineFacts
from pleharness.manifest import Manifest
from pleharness.run.context import RunContext
from pleharness.run.scenario_context import ScenarioContext

DOC = (Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text()
MESSAGE = ("a scenario's context has no 'manifest' (the contract: "
           "pleharness.run.scenario_context.ScenarioContext, docs/extending.md)")


def _public() -> dict[str, object]:
    return {n: v for n, v in vars(ScenarioContext).items() if not n.startswith("_")}


def _documented() -> set[str]:
    """The ``ctx.NAME`` of the ``run(ctx)`` item of docs/extending.md's scenario kind section."""
    item = DOC[DOC.index("- `run(ctx)`:"):DOC.index("- optionally `plan(ctx)`")]
    return set(re.findall(r"`ctx\.(\w+)", item))


def _properties() -> list[str]:
    return sorted(n for n, v in _public().items() if isinstance(v, property))


def _methods() -> list[str]:
    return sorted(n for n, v in _public().items() if inspect.isfunction(v))


def test_the_public_members_are_the_documented_contract():
    assert set(_public()) == _documented()
    assert set(_public()) == set(_properties()) | set(_methods())
    assert len(_public()) == 31


def test_every_member_is_typed_and_points_to_the_run_context():
    for name in _properties():
        fget = getattr(ScenarioContext, name).fget
        assert "return" in fget.__annotations__, name
        assert ScenarioContext.__dict__[name].fset is None, name  # read-only
        assert f"RunContext.{name}`" in fget.__doc__ and "\n" not in fget.__doc__, name
    for name in _methods():
        mine, theirs = getattr(ScenarioContext, name), getattr(RunContext, name)
        assert inspect.signature(mine) == inspect.signature(theirs), name
        assert "return" in mine.__annotations__, name
        assert f"RunContext.{name}`" in mine.__doc__ and "\n" not in mine.__doc__, name


class _Stub:
    """A run context of sentinels: each property is a distinct object, each method records its
    call and returns a distinct object."""

    def __init__(self):
        self.calls = {}
        for name in _properties():
            setattr(self, name, object())
        for name in _methods():
            setattr(self, name, self._method(name))

    def _method(self, name):
        result = object()

        def method(*args, **kw):
            self.calls[name] = (args, kw)
            return result
        method.result = result
        return method


def _bound(sig: inspect.Signature, args, kw) -> dict:
    b = sig.bind(None, *args, **kw)
    b.apply_defaults()
    return dict(list(b.arguments.items())[1:])


def test_every_member_delegates_to_the_run_context():
    run = _Stub()
    view = ScenarioContext(run)
    for name in _properties():
        assert getattr(view, name) is getattr(run, name), name
    for name in _methods():
        sig = inspect.signature(getattr(RunContext, name))
        args, kw = [], {}
        for p in list(sig.parameters.values())[1:]:
            if p.kind is p.KEYWORD_ONLY:
                kw[p.name] = object()
            else:
                args.append(object())
        assert getattr(view, name)(*args, **kw) is getattr(run, name).result, name
        assert _bound(sig, *run.calls[name]) == _bound(sig, args, kw), name


def test_the_properties_return_what_a_real_run_context_returns(tmp_path):
    run = RunContext(None, Manifest(run_id="t"), tmp_path / "manifest.json",
                     EngineFacts({"vocab_size": 100}, {}), Console(file=io.StringIO()))
    view = run.scenario_view
    assert isinstance(view, ScenarioContext)
    for name in _properties():
        assert getattr(view, name) == getattr(run, name), name
    mark = view.mark()
    assert mark == run.mark() and view.since(mark) == ([], [])


def test_a_name_outside_the_contract_is_the_error_that_names_it(tmp_path):
    run = RunContext(None, Manifest(run_id="t"), tmp_path / "manifest.json",
                     EngineFacts({}, {}), Console(file=io.StringIO()))
    view = run.scenario_view
    with pytest.raises(AttributeError) as exc:
        view.manifest
    assert str(exc.value) == MESSAGE
    for name in ("save", "options", "judge", "refs", "collect_only", "record_request",
                 "store_references", "finish_judgement", "ensure_engine_alive", "in_scenario",
                 "_run_phase", "manifest_path"):
        with pytest.raises(AttributeError, match="the contract"):
            getattr(view, name)
    with pytest.raises(AttributeError):
        view.manifest = Manifest(run_id="x")  # no way to put one there either
    with pytest.raises(AttributeError):
        view.strict = True


def test_a_contract_property_whose_run_context_lacks_it_raises_the_run_contexts_error():
    class Bare:
        pass
    with pytest.raises(AttributeError, match="'Bare' object has no attribute 'facts'"):
        ScenarioContext(Bare()).facts


def test_the_control_runs_files_never_replace_the_runs(tmp_path):
    """Session 14: the control run shares the run folder, and a fuzz scenario in it wrote
    ``repro.toml`` over the reproducer the run under test confirms after the control run."""
    facts, con = EngineFacts({"vocab_size": 100}, {}), Console(file=io.StringIO())
    main = RunContext(None, Manifest(run_id="t"), tmp_path / "manifest.json", facts, con)
    ctl = RunContext(None, Manifest(run_id="t-control"), tmp_path / "control-manifest.json",
                     facts, con)
    assert main.scenario_view.file_path("repro.toml") == tmp_path / "repro.toml"
    assert ctl.scenario_view.file_path("repro.toml") == tmp_path / "control-repro.toml"
