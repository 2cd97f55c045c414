"""The passes of a stress run, each on one engine: the run context of an engine
(:func:`engine_context`), the suite on it (:func:`run_suite`), the reference pass on a reference
engine (:func:`reference_pass`, ``--reference engine``) and the control pass on a control engine
(:func:`control_pass`, ``--control``). The steps of a stress run (:mod:`pleharness.pipeline`)
and the ``fuzz`` job (:mod:`pleharness.fuzzjob`) run them in their order of steps
(:mod:`pleharness.jobrun`); the second engines' launch is :mod:`pleharness.second_engine`."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .attribution import attribute
from .config import StressConfig
from .divergence import near_tie_threshold, normalize_dtype
from .engine.facts import as_facts
from .engine.session import Engine, EngineSession, Target, launch_record
from .errors import EngineError, UsageError
from .manifest import EngineRecord, Manifest, now_iso, write_manifest
from .redact import redact_argv
from .run.context import RunContext, RunOptions
from .scenarios import Scenario
from .second_engine import REFERENCE_INHERITS, control_variant, reference_variant
from .verdict import verdict


class StressRun(Protocol):
    """What a pass needs of the job's run it is part of (:class:`pleharness.jobrun.JobRun`): its
    options, consoles, folder and manifest, and its engine session."""

    cfg: StressConfig
    console: Console
    err: Console
    run_dir: Path
    manifest: Manifest
    session: EngineSession | None

    @property
    def mpath(self) -> Path: ...

    def save(self) -> None: ...

    def engine(self, target: Target, **kw) -> Engine: ...


def progress_bar(console: Console) -> Progress:
    """The transient progress bar of one pass on ``console``."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def engine_context(cfg: StressConfig, eng: Engine, manifest: Manifest, mpath: Path, facts,
                   progress: Progress, *, golden=None, references: dict | None = None,
                   **options) -> RunContext:
    """The run context of one engine (under test, reference or control), complete: options
    from ``cfg`` (``options`` overrides, e.g. collect_only), the near-tie threshold from the
    serving dtype (recorded in ``run_options``), every registered check."""
    facts = as_facts(facts)
    nats, why = near_tie_threshold(facts.dtype, cfg.verdict.near_tie_nats)
    manifest.run_options.near_tie_nats = nats
    manifest.run_options.near_tie_source = why
    manifest.run_options.serving_dtype = normalize_dtype(facts.dtype)
    opts = RunOptions(on_timeout=cfg.verdict.on_timeout, logprobs=cfg.suite.logprobs or None,
                      near_tie_nats=nats, strict=cfg.verdict.strict,
                      serving_dtype=normalize_dtype(facts.dtype),
                      reference_cache_state=cfg.reference.cache_state,
                      api=cfg.suite.api, **options)
    return RunContext(eng.client, manifest, mpath, facts, progress.console,
                      eng.server, progress, options=opts, golden=golden,
                      references=references if opts.reference_mode != "solo" else None)


def run_suite(ctx: RunContext, scenarios: list[Scenario], repeat: int) -> None:
    """Every scenario in order, ``repeat`` times on the same engine (references are taken once).

    Once the engine runs, no scenario ends the run with a usage error (issue 48): the kinds
    leave out what cannot fit this engine (``ctx.leave_out``); should one still raise a
    UsageError (a ScenarioError), the rest of that scenario is recorded as one left-out phase
    with the message (vacuous, a warning on the console) and the suite goes on."""
    for rep in range(1, repeat + 1):
        for sc in scenarios:
            with ctx.in_scenario(sc.name, rep, f"rep{rep}/" if repeat > 1 else ""):
                run_scenario(ctx, sc)
            ctx.ensure_engine_alive()


def run_scenario(ctx: RunContext, sc: Scenario) -> None:
    """``sc.run`` on ``ctx``; a UsageError it raises ends the scenario, not the run: the rest
    of it is recorded as one left-out phase with the message (nothing on a reference engine's
    collect-only pass, which records no phase)."""
    try:
        sc.run(ctx.scenario_view)
    except UsageError as exc:
        ctx.leave_out(f"{sc.name}-rest", f"the {sc.kind} kind could not go on on this engine: "
                      f"{exc}")


def reference_pass(run: StressRun, scenarios: list[Scenario], target: Target) -> dict:
    """``--reference engine``: launch the reference configuration (:data:`REFERENCE_INHERITS`),
    take every scenario's single-request references there, stop it. The boundary lengths come
    from the engine under test's facts (its launch arguments), not the reference engine's.
    Returns the references by request key. Raises EngineError when the reference engine fails."""
    cfg, m = run.cfg, run.manifest
    spec = reference_variant(cfg).spec(target)
    m.engine.reference_engine = {"launch": launch_record(spec, cfg.engine.profile),
                                    "engine_log": "reference-engine.log",
                                    "inherits": REFERENCE_INHERITS,
                                    "dropped": list(cfg.reference.drop_args),
                                    "added": list(cfg.reference.engine_args)}
    # the engine under test's launch arguments first (its lengths need references); the
    # reference engine's own resolved values fill what they leave open
    eng = run.engine(target, spec=spec, log_name="reference-engine", what="reference engine",
                     facts_engine_args=target.engine_args, engine_first=False)
    try:
        m.engine.reference_engine.update(eng.record())
        with progress_bar(run.console) as progress:
            ctx = engine_context(cfg, eng, m, run.mpath, eng.facts, progress, collect_only=True,
                           reference_source="engine")
            for sc in scenarios:
                with ctx.in_scenario(sc.name, phase_prefix="ref-engine/"):
                    run_scenario(ctx, sc)
        return dict(ctx.references)
    finally:
        run.session.stop(eng)


def control_pass(run: StressRun, scenarios: list[Scenario], facts, target: Target,
                 started: Engine | BaseException | None = None) -> Manifest | None:
    """Control run (:mod:`pleharness.attribution`): launch the control configuration (the engine
    under test's arguments without ``--control-drop-arg`` flags plus ``--control-engine-arg``
    values, or ``--control-profile``'s arguments and environment), run the same suite with the
    engine under test's facts (so prompts, phases, order and concurrency are identical), record it
    in ``control-manifest.json``, stop it, and classify every divergence of the engine under test
    as also_in_control / only_under_test. A control engine that fails is recorded
    (``engine.control_engine.error``) and leaves the divergences unattributed: they keep failing
    under the plain policy. Returns the control manifest (None when its engine failed to
    start), whose runs also vote on which side of a divergence is wrong. ``started``: the
    control engine already started beside the engine under test
    (:func:`pleharness.jobrun.start_engines`), or the exception its start raised; None: launch
    it now."""
    cfg, manifest = run.cfg, run.manifest
    spec = control_variant(cfg).spec(target)
    rec = manifest.engine.control_engine = {
        "launch": launch_record(spec, cfg.engine.profile), "engine_log": "control-engine.log",
        "manifest": "control-manifest.json", "dropped": list(cfg.control.drop_args),
        "added": list(cfg.control.engine_args), "profile": cfg.control.profile}
    cm = Manifest(run_id=manifest.run_id + "-control", harness=manifest.harness,
                  invocation=manifest.invocation, scenarios=manifest.scenarios,
                  run_options=manifest.run_options.model_copy(update={"role": "control run"}),
                  # the engine under test's probe: the control replays the identical schedule
                  engine_probe={**manifest.engine_probe, "measured_on": "the engine under test"}
                  if manifest.engine_probe else {})
    cpath = run.run_dir / "control-manifest.json"
    try:
        if isinstance(started, BaseException):
            raise started
        eng = started or run.engine(target, spec=spec, log_name="control-engine",
                                    what="control engine", gather=False)
    except EngineError as exc:
        rec["error"] = f"{exc.args[0] if exc.args else exc}; root cause: {exc.root_cause}"
        rec["root_cause"] = exc.root_cause
        run.err.print(f"[red]control engine failed[/red] (exit 3; the run under test is judged "
                      f"without it, its divergences unattributed): {escape(str(rec['error']))}")
        return None
    try:
        rec.update(eng.record())
        cm.engine = EngineRecord(mode="launched", command=redact_argv(eng.server.command),
                                 url=eng.server.url)
        with progress_bar(run.console) as progress:
            ctx = engine_context(cfg, eng, cm, cpath, facts, progress)
            run_suite(ctx, scenarios, cfg.suite.repeat)
        cm.status = "complete"
        verdict(cm)  # judged on its own (compare's BASE when the control is another build)
    except EngineError as exc:
        cm.status = "engine_died"
        rec["error"] = f"{exc.args[0] if exc.args else exc}; root cause: {exc.root_cause}"
        rec["root_cause"] = exc.root_cause
        run.err.print(f"[red]control engine died[/red] (exit 3): {escape(str(rec['error']))}")
    finally:
        cm.ended_at = now_iso()
        write_manifest(cpath, cm)
        run.session.stop(eng)
    counts = attribute(manifest, cm)
    manifest.summary.assign(**counts)
    rec["attribution"] = counts
    run.save()
    return cm
