"""What a job's run is made of: bad input refused before anything starts (:func:`check_input`),
the run's folder, manifest and outcome (:class:`JobRun`), the frame every run goes through
(:func:`run_job`: its engine session, every exception mapped to a status and an exit code, the
reports on every exit path), and the steps the jobs compose in their own order: the engine
session (:func:`open_session`), the engine under test and a control engine beside it
(:func:`start_engines`), the suite on it with the golden model and the engine probe
(:func:`suite_step`), which side of each divergence is wrong (:func:`sides_step`) and the
verdict (:func:`conclude`).

Two compose them (issue 34: a job calls the run layer, never another job's module): the
pipeline of a ``stress`` run (:mod:`pleharness.pipeline`: references, engines, suite, control,
sides, confirmation, verdict; the ``stress`` job :mod:`pleharness.stress` is its
:func:`~pleharness.pipeline.run_stress`) and the ``fuzz`` job (:mod:`pleharness.fuzzjob`:
engine, search, sides, confirmation, verdict). The confirmation step, whose replays are
``stress`` runs, is :func:`pleharness.pipeline.confirm_reproducers`. The passes on each engine
are :mod:`pleharness.passes`, the second engines' launch :mod:`pleharness.second_engine`, the
summary, verdict and reports :mod:`pleharness.verdict`.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .config import StressConfig
from .differential import compare_answers
from .engine.session import Engine, EngineSession, Target, launch_record
from .engine.side_by_side import SideBySide, run_side_by_side
from .engine.spares import SpareEngines
from .engine_probe import run_probe
from .envelope import apply as apply_envelope
from .envelope import describe as describe_envelope
from .environment import environment_info, harness_info
from .errors import (EngineError, ExitCode, HarnessError, Interrupted, RequestTimeoutAbort,
                     UsageError)
from .golden import GoldenModel, golden_problem
from .jobrecord import JobFrame, JobRecord
from .manifest import (Manifest, RunOptionsRecord, Summary, load_manifest, now_iso,
                       write_manifest)
from .model import model_digest
from .passes import engine_context, progress_bar, run_suite
from .probe import capability_summary
from .redact import redact_url
from .render import render
from .request import params_key
from .run.context import RunContext
from .run.rundir import new_run_dir
from .run.sides import judge_sides
from .scenarios import REGISTRY, Scenario, load_scenarios
from .summary import stamp_timeline
from .second_engine import (control_variant, raise_if_second_engine_is_the_same,
                            side_by_side_plan, with_second_engine_warnings)
from .verdict import control_outcome, summarize, verdict, write_reports


def esc(x) -> str:
    """Text for rich's console: user-given paths and messages may contain [brackets]."""
    return escape(str(x))


@dataclass(frozen=True)
class JobInput:
    """What :func:`check_input` read and resolved before anything started: the scenarios, the
    references of ``--reference manifest:PATH`` (by request key; else empty), the engine target,
    the side-by-side plan and the golden model's folder (None: none local); ``spares``: engines
    started ahead that the run's session adopts (a confirmation replay's:
    :mod:`pleharness.engine.spares`), else None."""

    scenarios: list[Scenario]
    references: dict
    target: Target
    side: SideBySide
    golden_dir: str | None
    spares: SpareEngines | None = None


def run_job(cfg: StressConfig, inputs: JobInput,
            steps: Callable[[JobRun, contextlib.ExitStack, JobInput], int],
            console: Console, err_console: Console | None = None, job: str = "stress") -> int:
    """The frame of a ``stress`` or ``fuzz`` run: create the run folder and manifest
    (:meth:`JobRun.begin`), run the job's ``steps(run, stack, inputs) -> exit code`` with
    ``stack`` closing every engine and restoring the signal handlers, in the job frame
    (:class:`~pleharness.jobrecord.JobFrame`: every exception mapped to a status and an exit
    code in one place, :func:`~pleharness.jobrecord.job_outcome`, printed by
    :meth:`JobRun.fail`; 4 for an internal error, its traceback in ``<run>/harness-error.log``),
    then write the final manifest (with the ``job`` record, ``job`` its name: stress or fuzz)
    and reports and print the verdict on every exit path. Returns the exit code
    (:mod:`pleharness.errors`)."""
    run = JobRun.begin(cfg, inputs.scenarios, inputs.target, console,
                       err_console or Console(stderr=True), job=job)
    run.side = inputs.side
    run.spares = inputs.spares
    code = ExitCode.FAIL
    try:
        with contextlib.ExitStack() as stack:  # closing it stops engines, restores handlers
            with run.frame:
                code = steps(run, stack, inputs)
            if run.frame.error is not None:
                code = run.frame.record.exit_code
    finally:
        if run.session is not None:  # the GPU check ran when the session closed
            run.manifest.environment.update(run.session.gpu_memory)
        run.finish(code)
    run.report(code)
    return code


def open_session(run: JobRun, stack: contextlib.ExitStack) -> EngineSession:
    """The run's engine session (closed with ``stack``): every engine of the run, the signals,
    the GPU-memory check when it closes."""
    cfg = run.cfg
    run.session = stack.enter_context(EngineSession(
        run.console, run.run_dir, timeouts=cfg.timeouts,
        explicit_facts=cfg.attach.explicit_facts,
        gpus_before=run.manifest.environment.get("gpus"),
        gpu_tolerance_mib=cfg.engine.gpu_memory_tolerance_mib, spares=run.spares))
    return run.session


def sides_step(run: JobRun, scenarios: list[Scenario], control: Manifest | None) -> None:
    """Which side of each divergence is wrong (:func:`pleharness.run.sides.judge_sides`, with the
    control run's twins when there is one), then every kind's tables from the final verdicts."""
    judge_sides(run.manifest, control)
    for sc in scenarios:  # one class everywhere: tables from the final verdicts
        type(sc).refresh_tables(run.manifest)
    run.save()


def evidence_step(run: JobRun, control: Manifest | None) -> None:
    """After the suite (and the control run): the run's numerics envelope measured where the
    defect under test is not, and every tolerance judged again at it
    (:func:`pleharness.envelope.apply`), then the control's answers to the same solo greedy
    requests compared with the run's (:func:`pleharness.differential.compare_answers`), and
    what the run had as an independent reference recorded (``run_options.
    independent_reference``; none: the headline says what that leaves open)."""
    m = run.manifest
    env = apply_envelope(m, control, run.cfg.verdict.numerics_from)
    if control is not None and control.requests:
        counts = compare_answers(m, control)
        if counts["differ"]:
            run.console.print(esc(f"control answers: {counts['differ']} solo answer(s) of "
                                  f"{counts['compared']} request(s) differ from the control's, "
                                  f"{counts['hard']} hard"), highlight=False)
    m.run_options.independent_reference = independent_reference(run.cfg, control)
    for line in describe_envelope(env):
        run.console.print(esc(line), highlight=False)
    run.save()


def independent_reference(cfg: StressConfig, control: Manifest | None) -> str | None:
    """What the run had that does not share the configuration under test: its control run
    (another configuration or build), a reference engine, the golden model's references or a
    stored run's; None when it had none (every reference was this engine's own)."""
    parts = []
    if control is not None:
        parts.append("control run" + (f" on another build ({cfg.control.python})"
                                      if cfg.control.python else ""))
    mode = cfg.reference_mode
    if mode == "engine":
        parts.append("reference engine")
    elif mode == "golden":
        parts.append("golden model references")
    elif mode == "manifest":
        parts.append(f"stored references ({cfg.reference.source})")
    return ", ".join(parts) or None


def conclude(run: JobRun) -> int:
    """The run is complete: its verdict and exit code (a control engine that failed: exit 3)."""
    run.manifest.status = "complete"
    return control_outcome(run.manifest, verdict(run.manifest))


def load_reference_manifest(spec: str) -> dict:
    """The references of ``--reference manifest:PATH``, by request key; raises UsageError when
    the file is not a manifest or holds none."""
    path = spec.split(":", 1)[1]
    try:
        ref = load_manifest(Path(path), with_requests=False)  # only its references
    except ValueError as exc:
        raise UsageError(f"--reference {spec}: {exc}") from None
    if not ref.references:
        raise UsageError(f"--reference {spec}: that manifest holds no references")
    return {(r.prompt_hash, r.max_tokens) if not r.params
            else (r.prompt_hash, r.max_tokens, params_key(r.params)): r for r in ref.references}


def check_input(cfg: StressConfig, console: Console) -> JobInput:
    """Bad options or input raise UsageError here, before anything starts or a run folder
    exists: the options, the scenarios, ``--confirm-runs`` without a reproducer, the
    ``--reference manifest:PATH`` references, the engine target, a second engine identical to the
    engine under test, too many engines side by side, ``--reference golden`` without a golden
    model."""
    cfg.validate()
    # bad input: before anything starts
    scenarios = load_scenarios(cfg.suite.scenarios, cfg.suite.overrides)
    if cfg.confirmation.runs_given and cfg.confirmation.runs and not any(
            sc.writes_reproducers for sc in scenarios):
        kinds = sorted(k for k, c in REGISTRY.items() if c.writes_reproducers)
        raise UsageError(f"--confirm-runs {cfg.confirmation.runs}: no selected scenario writes a "
                         f"reproducer (only the {', '.join(kinds)} kind"
                         f"{' does' if len(kinds) == 1 else 's do'}: add --scenario {kinds[0]}, "
                         "or leave --confirm-runs out)")
    references = (load_reference_manifest(cfg.reference.source) if cfg.reference_mode == "manifest"
                  else {})
    target = cfg.target(console)
    raise_if_second_engine_is_the_same(cfg, target)  # before a run folder exists
    checked = with_second_engine_warnings(cfg, target)
    for w in checked.warnings[len(target.warnings):]:
        console.print(escape(w), highlight=False)
    target = checked
    side = side_by_side_plan(cfg, target)  # too many engines for this machine: before anything
    golden_dir = cfg.reference.golden_model or (target.model_path if cfg.attach.url is None
                                                else None)
    if cfg.reference_mode == "golden" and golden_dir is not None:
        problem = golden_problem(golden_dir)
        if problem:
            raise UsageError(f"--reference golden: {problem}")
    return JobInput(scenarios, references, target, side, golden_dir)


def suite_step(run: JobRun, stack: contextlib.ExitStack, inputs: JobInput, eng: Engine,
               references: dict) -> None:
    """The suite on the engine under test: the golden model (closed with ``stack``), the
    engine probe, the suite ``--repeat`` times, then the judgement that needs the whole suite.
    ``references``: those taken before (a reference engine's, a manifest's), else empty."""
    scenarios, target, golden_dir = inputs.scenarios, inputs.target, inputs.golden_dir
    cfg = run.cfg
    run.manifest.run_options.assign(api=cfg.suite.api, api_used=cfg.suite.api)
    golden = golden_model(cfg, golden_dir or _local_model(cfg, target, eng),
                          cfg.reference_mode, run.manifest, run.run_dir)
    if golden is not None:
        stack.callback(golden.close)
    run.save()
    with progress_bar(run.console) as progress:
        ctx = engine_context(cfg, eng, run.manifest, run.mpath, eng.facts, progress,
                             golden=golden, reference_mode=cfg.reference_mode,
                             references=references)
        probe_engine(run, ctx)
        run_suite(ctx, scenarios, cfg.suite.repeat)
        ctx.finish_judgement()  # half precision: the measured golden tolerance


@dataclass
class JobRun:
    """One job's run: its options, consoles, folder and manifest and its engine session (the
    engines running now: the last one is the one an engine error is about)."""

    cfg: StressConfig
    console: Console
    err: Console
    run_dir: Path
    manifest: Manifest
    session: EngineSession | None = None
    ready: bool = False
    side: SideBySide = field(default_factory=SideBySide)  # engines side by side (confirmations)
    spares: SpareEngines | None = None  # engines started ahead, adopted by the session
    frame: JobFrame = field(init=False)  # the job frame: its record lands in the manifest

    @property
    def mpath(self) -> Path:
        return self.run_dir / "manifest.json"

    @classmethod
    def begin(cls, cfg: StressConfig, scenarios: list[Scenario], target: Target,
              console: Console, err: Console, job: str = "stress") -> "JobRun":
        """Create the run folder and write the first manifest (status running), with the job
        frame (:class:`~pleharness.jobrecord.JobFrame` of ``job``) whose record it embeds."""
        run_id, run_dir = new_run_dir(Path(cfg.output.results_dir), cfg.output.run_id)
        manifest = Manifest(run_id=run_id, harness=harness_info(), invocation=cfg.output.invocation,
                            scenarios=[s.definition() for s in scenarios])
        manifest.environment = environment_info(cfg.engine.python if cfg.attach.url is None
                                                else None)
        if target.model_path is not None:
            manifest.engine.model_digest = model_digest(target.model_path)
        if target.warnings:
            manifest.engine.launch_warnings = list(target.warnings)
        if manifest.environment.get("gpus"):
            manifest.environment["ple_probe"] = capability_summary()
        manifest.summary = Summary(phases_planned=cfg.suite.repeat * sum(s.planned_phases()
                                                                         for s in scenarios),
                                   phases_completed=0, hashes_compared=0, hashes_matched=0)
        manifest.run_options = RunOptionsRecord(
            reference=cfg.reference.source, repeat=cfg.suite.repeat,
            logprobs=cfg.suite.logprobs, golden=cfg.verdict.golden,
            strict=cfg.verdict.strict, on_timeout=cfg.verdict.on_timeout,
            reference_cache_state=cfg.reference.cache_state)
        run = cls(cfg, console, err, run_dir, manifest)
        run.frame = JobFrame(job, run.save_record, crash_dir=run_dir,
                             engine_ready=lambda: run.ready, on_error=run.fail, reraise=False)
        run.frame.record.started_at = manifest.started_at
        manifest.job = run.frame.record
        run.save()
        console.print(f"run {run_id}: results in {esc(run_dir)}")
        return run

    def save(self) -> None:
        write_manifest(self.mpath, self.manifest)

    def engine(self, target: Target, **kw) -> Engine:
        """Start or attach in the run's session (:meth:`EngineSession.start`, logs in the run
        folder)."""
        assert self.session is not None
        return self.session.start(target, **kw)

    # -- outcome ----------------------------------------------------------------------------------
    def step(self, name: str):
        """One named step of the job (:meth:`~pleharness.jobrecord.JobFrame.step`): its name
        lands in the record's ``steps_done`` once it ends without an exception."""
        return self.frame.step(name)

    def save_record(self, record: JobRecord) -> None:
        """The frame's writer: the record into the manifest (``job``), the manifest saved."""
        self.manifest.job = record
        self.save()

    def fail(self, exc: BaseException, record: JobRecord) -> None:
        """The frame's ``on_error``: the exception's outcome (``record``, mapped by
        :func:`~pleharness.jobrecord.job_outcome`) into the manifest's status, verdict, reason
        and root cause (the engine's, when the error named none), and its error line on
        stderr."""
        servers = self.session.servers if self.session is not None else []
        m, srv = self.manifest, (servers[-1] if servers else None)
        if isinstance(exc, UsageError):  # e.g. a usage error that needed the engine's facts
            record.reason = (f"usage error (exit {exc.exit_code}; found once the engine's facts "
                             f"were known): {exc}")
        if isinstance(exc, EngineError):
            record.root_cause = record.root_cause or (srv.root_cause() if srv else None)
            m.log_tail = srv.log_tail(20) if srv else []
        m.status, m.reason, m.root_cause = record.status, record.reason, record.root_cause
        m.verdict = "fail" if isinstance(exc, RequestTimeoutAbort) else "error"
        if isinstance(exc, (Interrupted, KeyboardInterrupt)):
            return
        if isinstance(exc, RequestTimeoutAbort):
            self.err.print(f"[red]aborted:[/red] {esc(exc)}")
        elif isinstance(exc, EngineError):
            self.err.print(f"[red]engine error:[/red] {esc(m.reason)}")
            if m.root_cause:
                self.err.print(f"root cause: {esc(m.root_cause)}")
            if srv:
                self.err.print(f"engine log: {esc(srv.log_path)}")
        elif isinstance(exc, HarnessError):
            self.err.print(f"[red]error:[/red] {esc(exc)}")
        else:  # a harness bug still leaves an honest manifest
            log = self.run_dir / "harness-error.log"
            self.err.print(f"[red]internal error:[/red] {esc(exc.__class__.__name__)}: "
                           f"{esc(exc)} (a ple-harness bug; traceback in {esc(log)})")

    def finish(self, code: int) -> None:
        """Summarize, write the final manifest (its ``job`` record from its status, exit code,
        reason, root cause and times), summary.md and junit.xml (on every exit path)."""
        m = self.manifest
        summarize(m)
        m.ended_at = now_iso()
        stamp_timeline(m, self.run_dir, self.session.starts if self.session else [])
        m.exit_code = code
        if m.status == "running":
            m.status = "incomplete"
        self.frame.record = m.job = self.frame.record.model_copy(update=dict(
            status=m.status, exit_code=code, reason=m.reason, root_cause=m.root_cause,
            started_at=m.started_at, ended_at=m.ended_at))
        self.save()
        write_reports(m, self.run_dir)

    def report(self, code: int) -> None:
        """Print the verdict, the tables and the status line to the console."""
        m = self.manifest
        render(m, self.console, run_dir=str(self.run_dir))
        self.console.print(f"status {m.status}, verdict {m.verdict}, exit {code}; "
                           f"manifest: {esc(self.mpath)}")


def _local_model(cfg: StressConfig, target: Target, eng: Engine) -> str | None:
    """The model folder the engine serves, when it is local (launched, or the card's root)."""
    return target.model_path if cfg.attach.url is None else (eng.card.get("root") or None)


def engine_under_test(run: JobRun, scenarios: list[Scenario], target: Target) -> Engine:
    """Start or attach the engine under test, record it and its facts in the manifest. The
    scenarios plan against the facts as they run: what cannot fit this engine is left out with
    its reason (vacuous), never a usage error (issue 48)."""
    cfg, m = run.cfg, run.manifest
    if cfg.attach.url is None:
        m.engine.assign(mode="launched", launch=launch_record(target.launch_spec(),
                                                              cfg.engine.profile),
                        engine_log="engine.log", launcher_log="launcher.log")
    else:
        m.engine.assign(mode="attached", url=redact_url(cfg.attach.url))
    eng = run.engine(target)
    run.ready = True
    if eng.server is not None:
        m.engine.command = eng.server.command
        m.engine.ready_s = round(eng.server.ready_s or 0, 3)
        if eng.server.log_dir != run.run_dir:  # a spare started ahead: its logs are its own
            m.engine.assign(engine_log=os.path.relpath(eng.server.log_path, run.run_dir),
                            launcher_log=os.path.relpath(eng.server.launcher_log_path,
                                                         run.run_dir))
    m.engine.assign(url=eng.server.url if eng.server else redact_url(cfg.attach.url),
                    model=eng.client.model,
                    version=eng.version, max_model_len=eng.card.get("max_model_len"),
                    model_root=eng.card.get("root"))
    eng.facts.record(m, run.console)
    model_dir = _local_model(cfg, target, eng)
    if "model_digest" not in m.engine.model_fields_set and model_dir:
        m.engine.model_digest = model_digest(model_dir)
    return eng


def golden_model(cfg: StressConfig, model_dir: str | None, mode: str, manifest: Manifest,
                  run_dir: Path):
    """The golden model (:mod:`pleharness.golden`, started lazily) for ``--reference golden`` and
    for classifying divergences, or None (``--no-golden``, or no local model that fits: the
    reason is recorded in ``run_options.golden_classifier``). Raises UsageError when
    ``--reference golden`` cannot have one."""
    if not cfg.verdict.golden:
        manifest.run_options.golden_classifier = "off (--no-golden)"
        return None
    problem = golden_problem(model_dir)
    if problem:
        if mode == "golden":
            raise UsageError(f"--reference golden: {problem}")
        manifest.run_options.golden_classifier = f"unavailable: {problem}"
        return None
    manifest.run_options.golden_classifier = (
        f"transformers float32 on {model_dir} (python {cfg.engine.python}); started on the first "
        "divergence" + (" and for every reference" if mode == "golden" else ""))
    manifest.run_options.golden_log = "golden.log"
    manifest.run_options.golden_model = str(model_dir)
    return GoldenModel(model_dir, cfg.engine.python, log_path=run_dir / "golden.log")



def probe_engine(run: "JobRun", ctx: RunContext) -> None:
    """Measure the engine under test before the suite (:mod:`pleharness.engine_probe`) into the
    manifest's ``engine_probe`` section, which the scenarios read to choose their requests;
    ``--no-engine-probe``, or references taken on another engine (``--reference engine``,
    whose requests were chosen before this engine was up), leave it unmeasured."""
    m = run.manifest
    if not run.cfg.engine.probe:
        m.engine_probe = {"status": "off (--no-engine-probe)"}
    elif run.cfg.reference_mode == "engine":
        m.engine_probe = {"status": "not run: --reference engine chose the requests on the "
                                    "reference engine, before this engine was up"}
    else:
        m.engine_probe = run_probe(ctx)
        p = m.engine_probe
        run.console.print(
            f"engine probe ({p['requests']} requests, {p['wall_s']:.1f} s): seeded samples "
            f"reproduce {_yn(p['seeded_samples_reproduce'])} (alone "
            f"{_yn(p.get('seeded_samples_reproduce_alone'))}"
            + ("" if p.get("seeded_samples_reproduce_alone") is not True else
               f", in a batch {_yn(p.get('seeded_samples_reproduce_in_batch'))}")
            + "), greedy outputs repeat "
            f"{_yn(p['greedy_repeats'])}, warm = cold {_yn(p['warm_equals_cold'])}",
            highlight=False)
        for w in p["warnings"]:
            run.console.print(f"[yellow]warning:[/yellow] engine probe: {esc(w)}")
    ctx.save()


def _yn(v) -> str:
    return {True: "yes", False: "NO", None: "unknown"}[v]


def start_engines(run: JobRun, scenarios: list[Scenario], target: Target
                   ) -> tuple[Engine, Engine | BaseException | None]:
    """The engine under test (:func:`engine_under_test`) and, where the run asks for a control
    and ``--parallel-engines`` lets two engines run at once with the launch's own memory
    settings (the side-by-side plan adds no argument: the engine under test is not changed for
    it), the control engine started beside it (issue 33: one engine start saved; it waits idle
    until the control pass). Returns (engine under test, control engine, or the exception its
    start raised, or None when it was not started beside)."""
    cfg, side = run.cfg, run.side
    if not cfg.control or side.n < 2:
        return engine_under_test(run, scenarios, target), None
    if side.add:
        run.console.print(esc("control engine: started after the run, not beside it (two engines "
                              f"side by side would need {' '.join(side.add)}, which would change "
                              "the engine under test; give them in the profile to start both "
                              "at once)"), highlight=False)
        return engine_under_test(run, scenarios, target), None
    spec = control_variant(cfg).spec(target)
    run.console.print("control engine: starting beside the engine under test "
                      f"({esc(side.why)})", highlight=False)
    eng, ctl = run_side_by_side(
        [lambda: engine_under_test(run, scenarios, target),
         lambda: run.engine(target, spec=spec, log_name="control-engine",
                            what="control engine", gather=False)], 2)
    if isinstance(eng, BaseException):
        raise eng  # the session's close stops the control engine too
    return eng, ctl
