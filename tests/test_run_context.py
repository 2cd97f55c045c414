"""RunContext is built complete (issue 13): options frozen at construction, every registered
check by default, scoped scenario state, public methods for scenarios. No engine needed."""
import dataclasses
import io

import pytest
from rich.console import Console

from pleharness.checks import DEFAULT_CHECKS, PHASE_REGISTRY, REGISTRY
from pleharness.engine.completion import Completion
from pleharness.engine.facts import EngineFacts
from pleharness.manifest import CheckResult, Manifest, PhaseRecord
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.run.context import RunContext, RunOptions


def _ctx(tmp_path, **kw) -> RunContext:
    return RunContext(None, Manifest(run_id="t"), tmp_path / "manifest.json",
                      EngineFacts({"vocab_size": 100}, {}), Console(file=io.StringIO()), **kw)


def _record(ctx: RunContext, role: str = "load"):
    """Record one finished request of a phase of ``role`` through the context's own checks."""
    ph = PhaseRecord(index=len(ctx.manifest.phases), name="p", scenario="s", concurrency=1,
                     requests=1, role=role)
    ctx.manifest.phases.append(ph)
    spec = RequestSpec(Prompt(key="k", ids=(1, 2, 3)), 3, compare=False)
    c = Completion(token_ids=[4, 5, 6], finish_reason="length", prompt_tokens=3,
                   completion_tokens=3)
    return ctx.record_request(ph, spec, c)


def test_a_context_built_without_a_registry_runs_every_default_check(tmp_path):
    ctx = _ctx(tmp_path)
    assert ctx.check_registry is REGISTRY
    rec = _record(ctx)
    ran = {c.name: c.status for c in rec.checks}
    assert set(ran) == set(DEFAULT_CHECKS)
    assert "skip" not in {ran[n] for n in ("vocab_range", "usage")}, ran


def test_no_checks_is_explicit_and_visible(tmp_path):
    rec = _record(_ctx(tmp_path, check_registry={}))
    assert {c.status for c in rec.checks} == {"skip"}
    assert all(c.detail == "check not registered" for c in rec.checks)


def test_options_are_fixed_at_construction(tmp_path):
    opts = RunOptions(strict=True, logprobs=None, reference_cache_state="cold")
    ctx = _ctx(tmp_path, options=opts)
    assert (ctx.strict, ctx.logprobs, ctx.reference_cache_state) == (True, None, "cold")
    with pytest.raises(AttributeError):
        ctx.strict = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.strict = False


def test_references_given_up_front_are_copied(tmp_path):
    refs = {("h", 3): object()}
    ctx = _ctx(tmp_path, references=refs)
    assert ctx.references == refs and ctx.references is not refs


def test_phase_role_follows_the_phase_being_recorded(tmp_path):
    ctx = _ctx(tmp_path)
    assert ctx.phase_role == "load"
    _record(ctx, role="reference")
    assert ctx.phase_role == "reference"
    _record(ctx, role="warmup")
    assert ctx.phase_role == "warmup"


def test_in_scenario_scopes_name_repeat_and_prefix(tmp_path):
    ctx = _ctx(tmp_path)
    with ctx.in_scenario("boundary", 2, "rep2/"):
        assert (ctx.scenario_name, ctx.repeat_index, ctx.phase_prefix) == ("boundary", 2, "rep2/")
        with pytest.raises(RuntimeError):
            with ctx.in_scenario("inner"):
                raise RuntimeError
        assert ctx.scenario_name == "boundary"
    assert (ctx.scenario_name, ctx.repeat_index, ctx.phase_prefix) == ("", 1, "")


@pytest.mark.parametrize("status,phase_status", [("pass", "pass"), ("warn", "pass"),
                                                 ("fail", "fail")])
def test_add_phase_check_updates_the_phase_status(tmp_path, status, phase_status):
    ctx = _ctx(tmp_path)
    ph = PhaseRecord(index=0, name="p", scenario="s", concurrency=1, requests=1,
                     status="pass", reason="")
    ctx.add_phase_check(ph, CheckResult(name="mine", status=status, detail="why"))
    assert ph.checks[-1].name == "mine"
    assert ph.status == phase_status
    assert ph.reason == ("why" if status == "fail" else "")


def test_phase_checks_come_from_the_phase_registry():
    assert "health_after_phase" in PHASE_REGISTRY


def test_checks_added_by_on_outcome_reach_the_records_file(tmp_path):
    """Records are appended to requests.jsonl when the phase is written and never rewritten, so a
    scenario's own per-request check (boundary's prefix_cache_hit) must be added through
    run_phase's on_outcome hook: it is then in the file on disk (it was lost once: appended to
    the record after the phase had been written)."""
    from doubles import FakeEngine

    from pleharness.engine.client import EngineClient
    from pleharness.manifest import load_manifest

    with FakeEngine() as eng:
        client = EngineClient(eng.url)
        client.resolve_model()
        ctx = RunContext(client, Manifest(run_id="t"), tmp_path / "manifest.json",
                         EngineFacts({"vocab_size": 600}, {}), Console(file=io.StringIO()))
        specs = [RequestSpec(Prompt(key=f"k{i}", ids=(20 + i, 21, 22)), 4, compare=False)
                 for i in range(3)]
        outs = ctx.run_phase("p", 2, specs, on_outcome=lambda o: o.record.checks.append(
            CheckResult(name="extra", status="warn", detail=o.spec.prompt.key)))
    assert len(outs) == 3
    on_disk = load_manifest(tmp_path / "manifest.json").requests
    assert [[c.detail for c in r.checks if c.name == "extra"] for r in on_disk] == \
        [["k0"], ["k1"], ["k2"]]
    assert all(r.error is None for r in on_disk)


def test_scenarios_see_the_narrow_face_and_never_the_manifest(tmp_path):
    view = _ctx(tmp_path).scenario_view
    assert view.facts.get("vocab_size") == 100 and view.run_id == "t"
    for name in ("manifest", "save", "options", "judge", "collect_only", "_record"):
        with pytest.raises(AttributeError, match="contract"):
            getattr(view, name)


def test_tables_and_notes_are_written_and_phase_counts_added(tmp_path):
    from pleharness.manifest import load_manifest
    ctx = _ctx(tmp_path)
    ctx.note("kind_notes", ["a", "b"])
    ctx.add_table("rows", [{"x": 1}])
    ctx.add_table("rows", [{"x": 2}])
    ctx.set_table("one", [{"y": 1}])
    ctx.set_table("one", [{"y": 2}])
    ctx.add_planned_phases(3)
    m = load_manifest(tmp_path / "manifest.json")  # each call wrote the manifest
    assert m.tables == {"kind_notes": [{"note": "a"}, {"note": "b"}],
                        "rows": [{"x": 1}, {"x": 2}], "one": [{"y": 2}]}
    assert m.summary.phases_planned == 3


def test_the_collect_only_pass_runs_references_only_and_writes_no_tables(tmp_path):
    """The reference engine's pass (--reference engine): load phases are empty results without a
    phase, tables and notes are no-ops, and take_references returns None (its phases are the
    reference engine's), so no scenario needs to know which pass it is in."""
    ctx = _ctx(tmp_path, options=RunOptions(collect_only=True, reference_source="engine"))
    spec = RequestSpec(Prompt(key="k", ids=(1, 2, 3)), 3)
    out = ctx.run_phase("load", 2, [spec])
    assert out == [] and out.phase is None and ctx.manifest.phases == []
    ctx.note("kind_notes", "x")
    ctx.add_table("rows", [{"x": 1}])
    ctx.add_planned_phases(2)
    assert ctx.manifest.tables == {} and "phases_planned" not in ctx.manifest.summary.model_fields_set
    ran = []
    ctx.refs.run_phase = lambda name, c, specs, role: ran.append((name, role)) or []
    assert ctx.take_references([spec], cache_state="cold") is None
    assert ran == [("references", "reference")]


@pytest.mark.parametrize("change, why", [
    ({"max_tokens": 4}, "differ in more than their prompts"),
    ({"stream": False}, "not streamed"),
])
def test_a_together_phase_refuses_requests_that_cannot_share_one(tmp_path, change, why):
    from pleharness.errors import UsageError
    ctx = _ctx(tmp_path)
    a = RequestSpec(Prompt(key="a", ids=(1, 2)), 3)
    b = dataclasses.replace(RequestSpec(Prompt(key="b", ids=(3, 4)), 3), **change)
    first = a if "max_tokens" in change else dataclasses.replace(a, **change)  # both unstreamed
    with pytest.raises(UsageError, match=why):
        ctx.run_phase("p", 2, [first, b], together=True)
    with pytest.raises(UsageError, match="concurrency 1 != 2"):
        ctx.run_phase("p", 1, [a, a], together=True)
    assert ctx.manifest.phases == []  # refused before anything was recorded or sent


@pytest.mark.parametrize("strict", [False, True])
def test_a_phase_left_out_is_recorded_vacuous_with_its_reason(tmp_path, strict):
    """Issue 48: ctx.leave_out records a planned load phase that cannot run on this engine:
    status skip, no requests, vacuous with the reason (the engaged warning; a failure under
    --strict), counted in summary.phases_left_out and named in the headline."""
    from pleharness.manifest import load_manifest
    from pleharness.verdict import verdict
    ctx = _ctx(tmp_path, options=RunOptions(strict=strict))
    with ctx.in_scenario("prompt_logprobs"):
        ph = ctx.scenario_view.leave_out("prompt-logprobs-c4", "no prompt is chunked", 4)
    m = load_manifest(tmp_path / "manifest.json")  # written
    (rec,) = m.phases
    assert (rec.name, rec.scenario, rec.status, rec.concurrency, rec.requests, rec.role) == (
        "prompt-logprobs-c4", "prompt_logprobs", "fail" if strict else "skip", 4, 0, "load")
    assert rec.vacuous == "no prompt is chunked" and ph.vacuous == rec.vacuous
    assert [(c.name, c.status) for c in rec.checks] == [("engaged", "fail" if strict else "warn")]
    ctx.manifest.summary.phases_planned = 1
    code = verdict(ctx.manifest)
    s = ctx.manifest.summary
    assert (code, ctx.manifest.verdict) == ((1, "fail") if strict else (0, "pass"))
    assert s.vacuous == ["phase prompt-logprobs-c4: no prompt is chunked"]
    if not strict:
        assert (s.phases_completed, s.phases_left_out) == (0, 1)
        assert s.headline.startswith("0/1 phases completed (1 left out on this engine, "
                                     "vacuous); ")
    # the reference engine's collect-only pass records nothing
    ref = _ctx(tmp_path / "ref", options=RunOptions(collect_only=True))
    (tmp_path / "ref").mkdir()
    assert ref.leave_out("x", "why") is None and ref.manifest.phases == []


def test_a_kind_that_raises_a_usage_error_ends_its_scenario_not_the_run(tmp_path):
    """Issue 48: should a kind still raise a UsageError once the engine runs, the suite goes on
    (passes.run_suite): the rest of that scenario is one left-out phase with the message."""
    from pleharness.passes import run_suite
    from pleharness.scenarios.base import ScenarioError
    from pleharness.scenarios.determinism import Determinism, DeterminismParams

    class Raising(Determinism):
        def run(self, ctx):
            raise ScenarioError("its prompt's default request gave no token at position 8")

    class Fine(Determinism):
        def run(self, ctx):
            ctx.note("fine_notes", "ran")

    ctx = _ctx(tmp_path)
    ctx.ensure_engine_alive = lambda: None
    run_suite(ctx, [Raising("a", DeterminismParams(), "a.toml"),
                    Fine("b", DeterminismParams(), "b.toml")], 1)
    (ph,) = ctx.manifest.phases
    assert (ph.name, ph.scenario, ph.status) == ("a-rest", "a", "skip")
    assert ph.vacuous == ("the determinism kind could not go on on this engine: its prompt's "
                          "default request gave no token at position 8")
    assert ctx.manifest.tables["fine_notes"] == [{"note": "ran"}]
