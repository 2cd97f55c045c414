"""The ``stress`` job: launch or attach, run the selected scenarios, write the manifest, verdict.

:func:`run_stress` reads as the steps of a run: validate the options, load the scenarios, resolve
the engine target, create the run folder and manifest, then (every engine, the signals and the
GPU-memory check owned by one :class:`~pleharness.engine.session.EngineSession`) take references
on a reference engine if asked, start or attach the engine under test, run the suite, replay it on
a control engine if asked (the engine under test's launch as a
:class:`~pleharness.engine.session.Variant`), and judge. Every exception maps to a manifest status
and an exit code in one place (:meth:`_Run.fail`).
"""
from __future__ import annotations

from .engine.facts import as_facts

import contextlib
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .causes import headline
from .config import StressConfig
from .engine.session import Engine, EngineSession, Interrupted, Target, Variant, launch_record
from .engine.side_by_side import SideBySide, model_bytes, run_side_by_side
from .engine.side_by_side import plan as plan_side_by_side
from .environment import environment_info, harness_info
from .errors import (EngineError, ExitCode, HarnessError, RequestTimeoutAbort, UsageError,
                     write_crash_log)
from .manifest import Manifest, now_iso, write_manifest
from .redact import redact_argv, redact_url
from .render import render
from .run.context import RunContext, RunOptions
from .run.rundir import new_run_dir
from .scenarios import Scenario, load_scenarios


def esc(x) -> str:
    """Text for rich's console: user-given paths and messages may contain [brackets]."""
    return escape(str(x))


def _load_reference_manifest(spec: str) -> dict:
    from .manifest import load_manifest
    path = spec.split(":", 1)[1]
    try:
        ref = load_manifest(Path(path), with_requests=False)  # only its references
    except ValueError as exc:
        raise UsageError(f"--reference {spec}: {exc}") from None
    if not ref.references:
        raise UsageError(f"--reference {spec}: that manifest holds no references")
    from .request import params_key
    return {(r.prompt_hash, r.max_tokens) if not r.params
            else (r.prompt_hash, r.max_tokens, params_key(r.params)): r for r in ref.references}


def run_stress(cfg: StressConfig, console: Console | None = None,
               err_console: Console | None = None) -> int:
    """Run the job; returns the exit code (see :mod:`pleharness.errors`; 4 for an internal
    error, its traceback in ``<run>/harness-error.log``). Never leaves an engine. Reports go to
    ``console`` (stdout), errors and warnings to ``err_console`` (stderr). Raises UsageError
    (exit 2) for bad options or input, before anything is started or a run folder exists."""
    console = console or Console(stderr=False)
    cfg.validate()
    scenarios = load_scenarios(cfg.scenarios, cfg.overrides)  # bad input: before anything starts
    if cfg.confirm_runs_given and cfg.confirm_runs and not any(
            sc.kind == "fuzz" for sc in scenarios):
        raise UsageError(f"--confirm-runs {cfg.confirm_runs}: no selected scenario writes a "
                         "reproducer (only the fuzz kind does: add --scenario fuzz, or leave "
                         "--confirm-runs out)")
    references = (_load_reference_manifest(cfg.reference) if cfg.reference_mode == "manifest"
                  else {})
    target = cfg.target(console)
    _raise_if_second_engine_is_the_same(cfg, target)  # before a run folder exists
    side = _side_by_side(cfg, target)  # too many engines for this machine: before anything
    golden_dir = cfg.golden_model or (target.model_path if cfg.url is None else None)
    if cfg.reference_mode == "golden" and golden_dir is not None:
        from .golden import golden_problem
        problem = golden_problem(golden_dir)
        if problem:
            raise UsageError(f"--reference golden: {problem}")
    run = _Run.begin(cfg, scenarios, target, console, err_console or Console(stderr=True))
    run.side = side
    code = ExitCode.FAIL
    try:
        with contextlib.ExitStack() as stack:  # closing it stops engines, restores handlers
            try:
                run.session = stack.enter_context(EngineSession(
                    console, run.run_dir, timeouts=cfg.timeouts,
                    explicit_facts=cfg.explicit_facts,
                    gpus_before=run.manifest.environment.get("gpus"),
                    gpu_tolerance_mib=cfg.gpu_memory_tolerance_mib))
                if cfg.reference_mode == "engine":
                    references = _reference_pass(run, scenarios, target)
                eng, control_eng = _start_engines(run, scenarios, target)
                run.manifest.run_options.update({"api": cfg.api, "api_used": cfg.api})
                golden = _golden_model(cfg, golden_dir or _local_model(cfg, target, eng),
                                       cfg.reference_mode, run.manifest, run.run_dir)
                if golden is not None:
                    stack.callback(golden.close)
                run.save()
                with _progress(console) as progress:
                    ctx = _context(cfg, eng, run.manifest, run.mpath, eng.facts, progress,
                                   golden=golden, reference_mode=cfg.reference_mode,
                                   references=references)
                    _probe_engine(run, ctx)
                    _run_suite(ctx, scenarios, cfg.repeat)
                    ctx.finish_judgement()  # half precision: the measured golden tolerance
                if cfg.confirm_runs and run.manifest.tables.get("reproducers"):
                    _confirm_reproducers(run, eng, target,
                                         beside=0 if control_eng is None or isinstance(
                                             control_eng, BaseException) else 1)
                control = None
                if cfg.control:
                    run.session.stop(eng)  # the control suite runs alone, as the suite did
                    control = _control_pass(run, scenarios, eng.facts, target,
                                            started=control_eng)
                from .run.sides import judge_sides
                judge_sides(run.manifest, control)  # which side of each divergence is wrong
                for sc in scenarios:  # one class everywhere: tables from the final verdicts
                    type(sc).refresh_tables(run.manifest)
                run.save()
                run.manifest.status = "complete"
                code = _verdict(run.manifest)
                code = _control_outcome(run.manifest, code)
            except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - mapped in one place
                code = run.fail(exc)
    finally:
        if run.session is not None:  # the GPU check ran when the session closed
            run.manifest.environment.update(run.session.gpu_memory)
        run.finish(code)
    run.report(code)
    return code


@dataclass
class _Run:
    """One stress run's state: its folder and manifest and its engine session (the engines
    running now: the last one is the one an engine error is about)."""

    cfg: StressConfig
    console: Console
    err: Console
    run_dir: Path
    manifest: Manifest
    session: EngineSession | None = None
    ready: bool = False
    side: SideBySide = field(default_factory=SideBySide)  # engines side by side (confirmations)

    @property
    def mpath(self) -> Path:
        return self.run_dir / "manifest.json"

    @classmethod
    def begin(cls, cfg: StressConfig, scenarios: list[Scenario], target: Target,
              console: Console, err: Console) -> "_Run":
        """Create the run folder and write the first manifest (status running)."""
        run_id, run_dir = new_run_dir(Path(cfg.results_dir), cfg.run_id)
        manifest = Manifest(run_id=run_id, harness=harness_info(), invocation=cfg.invocation,
                            scenarios=[s.definition() for s in scenarios])
        manifest.environment = environment_info(cfg.engine_python if cfg.url is None else None)
        if target.model_path is not None:
            from .model import model_digest
            manifest.engine.model_digest = model_digest(target.model_path)
        if manifest.environment.get("gpus"):
            from .probe import capability_summary  # cheap: capability only, never raises
            manifest.environment["ple_probe"] = capability_summary()
        manifest.summary = {"phases_planned": cfg.repeat * sum(s.planned_phases()
                                                               for s in scenarios),
                            "phases_completed": 0, "hashes_compared": 0, "hashes_matched": 0}
        manifest.run_options = {"reference": cfg.reference, "repeat": cfg.repeat,
                                "logprobs": cfg.logprobs, "near_tie_nats": cfg.near_tie_nats,
                                "golden": cfg.golden,
                                "strict": cfg.strict, "on_timeout": cfg.on_timeout,
                                "reference_cache_state": cfg.reference_cache_state}
        run = cls(cfg, console, err, run_dir, manifest)
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
    def fail(self, exc: BaseException) -> int:
        """The one mapping from an exception to the manifest's status, verdict and reason and
        the exit code (returned); prints the error line to stderr."""
        servers = self.session.servers if self.session is not None else []
        m, srv = self.manifest, (servers[-1] if servers else None)
        if isinstance(exc, Interrupted):
            m.status, m.verdict, code = "interrupted", "error", 128 + exc.signum
            m.reason = f"interrupted by {signal.Signals(exc.signum).name}"
        elif isinstance(exc, KeyboardInterrupt):
            m.status, m.verdict, m.reason, code = "interrupted", "error", "SIGINT", 130
        elif isinstance(exc, RequestTimeoutAbort):
            m.status, m.verdict, m.reason, code = "incomplete", "fail", str(exc), ExitCode.FAIL
            self.err.print(f"[red]aborted:[/red] {esc(exc)}")
        elif isinstance(exc, EngineError):
            m.status, m.verdict, code = ("engine_died" if self.ready else "failed"), "error", \
                ExitCode.ENGINE
            m.reason = str(exc.args[0]) if exc.args else str(exc)
            m.root_cause = exc.root_cause or (srv.root_cause() if srv else None)
            m.log_tail = srv.log_tail(20) if srv else []
            self.err.print(f"[red]engine error:[/red] {esc(m.reason)}")
            if m.root_cause:
                self.err.print(f"root cause: {esc(m.root_cause)}")
            if srv:
                self.err.print(f"engine log: {esc(srv.log_path)}")
        elif isinstance(exc, HarnessError):  # e.g. a usage error that needed the engine's facts
            m.status, m.verdict, code = "failed", "error", exc.exit_code
            m.reason = (f"usage error (exit {exc.exit_code}; found once the engine's facts "
                        f"were known): {exc}" if isinstance(exc, UsageError) else str(exc))
            self.err.print(f"[red]error:[/red] {esc(exc)}")
        else:  # a harness bug still leaves an honest manifest
            log = write_crash_log(traceback.format_exc(), self.run_dir)
            m.status, m.verdict, code = "failed", "error", ExitCode.INTERNAL
            m.reason = (f"internal harness error: {exc.__class__.__name__}: {exc} "
                        f"(traceback in {Path(log).name})")
            self.err.print(f"[red]internal error:[/red] {esc(exc.__class__.__name__)}: "
                           f"{esc(exc)} (a ple-harness bug; traceback in {esc(log)})")
        return code

    def finish(self, code: int) -> None:
        """Summarize, write the final manifest, summary.md and junit.xml (on every exit path)."""
        m = self.manifest
        _summarize(m)
        m.ended_at = now_iso()
        m.exit_code = code
        if m.status == "running":
            m.status = "incomplete"
        self.save()
        _write_reports(m, self.run_dir)

    def report(self, code: int) -> None:
        """Print the verdict, the tables and the status line to the console."""
        m = self.manifest
        render(m, self.console, run_dir=str(self.run_dir))
        self.console.print(f"status {m.status}, verdict {m.verdict}, exit {code}; "
                           f"manifest: {esc(self.mpath)}")


def _local_model(cfg: StressConfig, target: Target, eng: Engine) -> str | None:
    """The model folder the engine serves, when it is local (launched, or the card's root)."""
    return target.model_path if cfg.url is None else (eng.card.get("root") or None)


def _engine_under_test(run: _Run, scenarios: list[Scenario], target: Target) -> Engine:
    """Start or attach the engine under test, record it and its facts in the manifest, check
    the scenarios against the facts (ScenarioError)."""
    cfg, m = run.cfg, run.manifest
    if cfg.url is None:
        m.engine.update({"mode": "launched", "launch": launch_record(target.launch_spec(),
                                                                     cfg.profile),
                         "engine_log": "engine.log", "launcher_log": "launcher.log"})
    else:
        m.engine.update({"mode": "attached", "url": redact_url(cfg.url)})
    eng = run.engine(target)
    run.ready = True
    if eng.server is not None:
        m.engine.command = eng.server.command
        m.engine.ready_s = round(eng.server.ready_s or 0, 3)
    m.engine.update({"url": eng.server.url if eng.server else redact_url(cfg.url), "model": eng.client.model,
                     "version": eng.version, "max_model_len": eng.card.get("max_model_len"),
                     "model_root": eng.card.get("root")})
    eng.facts.record(m, run.console)
    for sc in scenarios:
        sc.validate_against(eng.facts)
    local_model = _local_model(cfg, target, eng)
    if "model_digest" not in m.engine and local_model:
        from .model import model_digest
        m.engine.model_digest = model_digest(local_model)
    return eng


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def _golden_model(cfg: StressConfig, model_dir: str | None, mode: str, manifest: Manifest,
                  run_dir: Path):
    """The golden model (:mod:`pleharness.golden`, started lazily) for ``--reference golden`` and
    for classifying divergences, or None (``--no-golden``, or no local model that fits: the
    reason is recorded in ``run_options.golden_classifier``). Raises UsageError when
    ``--reference golden`` cannot have one."""
    from .golden import GoldenModel, golden_problem
    if not cfg.golden:
        manifest.run_options.golden_classifier = "off (--no-golden)"
        return None
    problem = golden_problem(model_dir)
    if problem:
        if mode == "golden":
            raise UsageError(f"--reference golden: {problem}")
        manifest.run_options.golden_classifier = f"unavailable: {problem}"
        return None
    manifest.run_options.golden_classifier = (
        f"transformers float32 on {model_dir} (python {cfg.engine_python}); started on the first "
        "divergence" + (" and for every reference" if mode == "golden" else ""))
    manifest.run_options.golden_log = "golden.log"
    manifest.run_options.golden_model = str(model_dir)
    return GoldenModel(model_dir, cfg.engine_python, log_path=run_dir / "golden.log")



def _context(cfg: StressConfig, eng: Engine, manifest: Manifest, mpath: Path, facts,
             progress: Progress, *, golden=None, references: dict | None = None,
             **options) -> RunContext:
    """The run context of one engine (under test, reference or control), complete: options
    from ``cfg`` (``options`` overrides, e.g. collect_only), the near-tie threshold from the
    serving dtype (recorded in ``run_options``), every registered check."""
    facts = as_facts(facts)
    from .divergence import near_tie_threshold, normalize_dtype
    nats, why = near_tie_threshold(facts.dtype, cfg.near_tie_nats)
    manifest.run_options.near_tie_nats = nats
    manifest.run_options.near_tie_source = why
    manifest.run_options.serving_dtype = normalize_dtype(facts.dtype)
    opts = RunOptions(on_timeout=cfg.on_timeout, logprobs=cfg.logprobs or None,
                      near_tie_nats=nats, strict=cfg.strict,
                      serving_dtype=normalize_dtype(facts.dtype),
                      reference_cache_state=cfg.reference_cache_state,
                      api=cfg.api, **options)
    return RunContext(eng.client, manifest, mpath, facts, progress.console,
                      eng.server, progress, options=opts, golden=golden,
                      references=references if opts.reference_mode != "solo" else None)


def _probe_engine(run: "_Run", ctx: RunContext) -> None:
    """Measure the engine under test before the suite (:mod:`pleharness.engine_probe`) into the
    manifest's ``engine_probe`` section, which the scenarios read to choose their requests;
    ``--no-engine-probe``, or references taken on another engine (``--reference engine``,
    whose requests were chosen before this engine was up), leave it unmeasured."""
    from .engine_probe import run_probe
    m = run.manifest
    if not run.cfg.engine_probe:
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


def _run_suite(ctx: RunContext, scenarios: list[Scenario], repeat: int) -> None:
    """Every scenario in order, ``repeat`` times on the same engine (references are taken once)."""
    for rep in range(1, repeat + 1):
        for sc in scenarios:
            with ctx.in_scenario(sc.name, rep, f"rep{rep}/" if repeat > 1 else ""):
                sc.run(ctx.scenario_view)
            ctx.ensure_engine_alive()


REFERENCE_INHERITS = ("the engine under test's model, python, tp, host, environment and "
                      "arguments (profile engine_args, then --engine-arg), less "
                      "--reference-drop-arg flags, plus --reference-engine-arg values; only the "
                      "port differs (a free one)")


def _reference_variant(cfg: StressConfig) -> Variant:
    """The reference engine's launch: see :data:`REFERENCE_INHERITS`."""
    return Variant.of(drop=cfg.reference_drop_args, add=cfg.reference_engine_args)


def _control_variant(cfg: StressConfig) -> Variant:
    """The control engine's launch: the engine under test's arguments less --control-drop-arg
    flags plus --control-engine-arg values, or --control-profile's engine_args (plus
    --control-engine-arg) with its [env] over the engine's environment."""
    from .profile import load_profile
    if cfg.control_profile:
        prof = load_profile(Path(cfg.control_profile))
        return Variant.of(add=cfg.control_engine_args, env=prof.env, base=prof.engine_args)
    return Variant.of(drop=cfg.control_drop_args, add=cfg.control_engine_args)


def _reference_config(cfg: StressConfig, target: Target) -> tuple[list[str], dict[str, str]]:
    """The reference engine's (arguments, environment) (:func:`_reference_variant`)."""
    return _reference_variant(cfg).apply(target.engine_args, target.engine_env)


def _control_config(cfg: StressConfig, target: Target) -> tuple[list[str], dict[str, str]]:
    """The control engine's (arguments, environment) (:func:`_control_variant`)."""
    return _control_variant(cfg).apply(target.engine_args, target.engine_env)


def second_engine_problems(cfg: StressConfig, target: Target) -> list[str]:
    """Usage-error lines for a control or reference engine that would change nothing: a dropped
    flag that is not among the engine's arguments, or a configuration identical to the engine
    under test's after the profile, --engine-arg and the drops are applied (issue 25: an
    identical control turns every deterministic corruption into ``also_in_control``)."""
    from .attribution import same_config_problem, unused_drops
    out: list[str] = []
    if target.url is not None:
        return out
    for flag, drops, active in (("--control-drop-arg", cfg.control_drop_args, cfg.control),
                                ("--reference-drop-arg", cfg.reference_drop_args,
                                 cfg.reference_mode == "engine")):
        if not active:
            continue
        for d in unused_drops(target.engine_args, drops):
            out.append(f"{flag}={d}: not among the engine under test's arguments "
                       f"({' '.join(target.engine_args) or 'none'}), so dropping it changes "
                       "nothing")
    if cfg.control and not out:
        args, env = _control_config(cfg, target)
        hint = " and ".join(x for x, v in (
            (f"--control-profile {cfg.control_profile}", cfg.control_profile),
            ("--control-drop-arg " + " ".join(cfg.control_drop_args), cfg.control_drop_args),
            ("--control-engine-arg " + " ".join(cfg.control_engine_args),
             cfg.control_engine_args)) if v)
        p = same_config_problem(hint, "control", args, env, target.engine_args, target.engine_env)
        if p:
            out.append(p)
    if cfg.reference_mode == "engine" and not out:
        args, env = _reference_config(cfg, target)
        given = " and ".join(x for x, v in (
            ("--reference-drop-arg " + " ".join(cfg.reference_drop_args), cfg.reference_drop_args),
            ("--reference-engine-arg " + " ".join(cfg.reference_engine_args),
             cfg.reference_engine_args)) if v)
        p = same_config_problem(given or "--reference engine without --reference-engine-arg or "
                                "--reference-drop-arg", "reference", args, env,
                                target.engine_args, target.engine_env)
        if p:
            out.append(p)
    return out


def _raise_if_second_engine_is_the_same(cfg: StressConfig, target: Target) -> None:
    problems = second_engine_problems(cfg, target)
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} problems with the options:\n"
                         + "\n".join(f"  - {x}" for x in problems))


def _side_by_side(cfg: StressConfig, target: Target) -> SideBySide:
    """The side-by-side plan of the run's confirmation replays and of its control engine
    (``--parallel-engines``; :func:`pleharness.engine.side_by_side.plan`): one at a time when
    attached, or with neither confirmations nor a control. Raises UsageError when the engines
    asked for do not fit."""
    if cfg.url is not None or not (cfg.confirm_runs or cfg.control) or \
            cfg.parallel_engines == 1:
        return SideBySide()
    from .environment import gpu_inventory
    return plan_side_by_side(cfg.parallel_engines, gpus=gpu_inventory(),
                             model=model_bytes(target.model_path),
                             engine_args=target.engine_args, engine_env=target.engine_env)


def _start_engines(run: _Run, scenarios: list[Scenario], target: Target
                   ) -> tuple[Engine, Engine | BaseException | None]:
    """The engine under test (:func:`_engine_under_test`) and, where the run asks for a control
    and ``--parallel-engines`` lets two engines run at once with the launch's own memory
    settings (the side-by-side plan adds no argument: the engine under test is not changed for
    it), the control engine started beside it (issue 33: one engine start saved; it waits idle
    until the control pass). Returns (engine under test, control engine, or the exception its
    start raised, or None when it was not started beside)."""
    cfg, side = run.cfg, run.side
    if not cfg.control or side.n < 2:
        return _engine_under_test(run, scenarios, target), None
    if side.add:
        run.console.print(esc("control engine: started after the run, not beside it (two engines "
                              f"side by side would need {' '.join(side.add)}, which would change "
                              "the engine under test; give them in the profile to start both "
                              "at once)"), highlight=False)
        return _engine_under_test(run, scenarios, target), None
    spec = _control_variant(cfg).spec(target)
    run.console.print("control engine: starting beside the engine under test "
                      f"({esc(side.why)})", highlight=False)
    eng, ctl = run_side_by_side(
        [lambda: _engine_under_test(run, scenarios, target),
         lambda: run.engine(target, spec=spec, log_name="control-engine",
                            what="control engine", gather=False)], 2)
    if isinstance(eng, BaseException):
        raise eng  # the session's close stops the control engine too
    return eng, ctl


def _confirm_reproducers(run: _Run, eng: Engine, target: Target, beside: int = 0) -> None:
    """Replay every reproducer the suite wrote (``tables["reproducers"]``) ``--confirm-runs``
    times, each on a freshly started engine of the run's configuration (the engine under test is
    stopped first: one engine at a time), or on the attached engine when there is no launch
    (:mod:`pleharness.reproduce`). The rates land in the table's rows and in
    ``summary.reproducers``. ``beside``: engines already up beside them (a control engine
    started with the engine under test): fewer confirmations side by side."""
    from .reproduce import ReplayTarget, confirm_run_reproducers, judging_options
    cfg = run.cfg
    spec = eng.server.spec if eng.server is not None else None
    assert run.session is not None
    run.session.stop(eng)
    rt = ReplayTarget(runner=run_stress, launch=spec, url=None if spec is not None else cfg.url,
                      api_key=cfg.api_key, explicit_facts=dict(cfg.explicit_facts),
                      **judging_options(run.manifest.run_options),
                      start_timeout_s=cfg.start_timeout_s, timeouts=cfg.timeouts,
                      parallel=max(1, run.side.n - beside), engine_args_add=list(run.side.add))
    if run.side.n > 1 and spec is not None:
        run.console.print(esc(f"confirmations: {run.side.why}"), highlight=False)
    rows = confirm_run_reproducers(run.manifest, run.run_dir, rt, cfg.confirm_runs,
                                   log=lambda x: run.console.print(esc(x), highlight=False))
    run.manifest.summary.reproducers = [{"path": r["path"], "verdict": r.get("verdict")}
                                           for r in rows]
    run.save()


def _reference_pass(run: _Run, scenarios: list[Scenario], target: Target) -> dict:
    """``--reference engine``: launch the reference configuration (:data:`REFERENCE_INHERITS`),
    take every scenario's single-request references there, stop it. The boundary lengths come
    from the engine under test's facts (its launch arguments), not the reference engine's.
    Returns the references by request key. Raises EngineError when the reference engine fails."""
    cfg, m = run.cfg, run.manifest
    spec = _reference_variant(cfg).spec(target)
    m.engine.reference_engine = {"launch": launch_record(spec, cfg.profile),
                                    "engine_log": "reference-engine.log",
                                    "inherits": REFERENCE_INHERITS,
                                    "dropped": list(cfg.reference_drop_args),
                                    "added": list(cfg.reference_engine_args)}
    # the engine under test's launch arguments first (its lengths need references); the
    # reference engine's own resolved values fill what they leave open
    eng = run.engine(target, spec=spec, log_name="reference-engine", what="reference engine",
                     facts_engine_args=target.engine_args, engine_first=False)
    try:
        m.engine.reference_engine.update(eng.record())
        with _progress(run.console) as progress:
            ctx = _context(cfg, eng, m, run.mpath, eng.facts, progress, collect_only=True,
                           reference_source="engine")
            for sc in scenarios:
                with ctx.in_scenario(sc.name, phase_prefix="ref-engine/"):
                    sc.run(ctx.scenario_view)
        return dict(ctx.references)
    finally:
        run.session.stop(eng)


def _control_pass(run: _Run, scenarios: list[Scenario], facts, target: Target,
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
    control engine already started beside the engine under test (:func:`_start_engines`), or
    the exception its start raised; None: launch it now."""
    from .attribution import attribute
    cfg, manifest = run.cfg, run.manifest
    spec = _control_variant(cfg).spec(target)
    rec = manifest.engine.control_engine = {
        "launch": launch_record(spec, cfg.profile), "engine_log": "control-engine.log",
        "manifest": "control-manifest.json", "dropped": list(cfg.control_drop_args),
        "added": list(cfg.control_engine_args), "profile": cfg.control_profile}
    cm = Manifest(run_id=manifest.run_id + "-control", harness=manifest.harness,
                  invocation=manifest.invocation, scenarios=manifest.scenarios,
                  run_options={**manifest.run_options, "role": "control run"},
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
                      f"without it, its divergences unattributed): {esc(rec['error'])}")
        return None
    try:
        rec.update(eng.record())
        cm.engine = {"mode": "launched", "command": redact_argv(eng.server.command),
                     "url": eng.server.url}
        with _progress(run.console) as progress:
            ctx = _context(cfg, eng, cm, cpath, facts, progress)
            _run_suite(ctx, scenarios, cfg.repeat)
        cm.status = "complete"
    except EngineError as exc:
        cm.status = "engine_died"
        rec["error"] = f"{exc.args[0] if exc.args else exc}; root cause: {exc.root_cause}"
        rec["root_cause"] = exc.root_cause
        run.err.print(f"[red]control engine died[/red] (exit 3): {esc(rec['error'])}")
    finally:
        cm.ended_at = now_iso()
        write_manifest(cpath, cm)
        run.session.stop(eng)
    counts = attribute(manifest, cm)
    manifest.summary.update(counts)
    rec["attribution"] = counts
    run.save()
    return cm


def _control_outcome(m: Manifest, code: int) -> int:
    """A requested control engine that failed to start or died is part of the outcome (issue
    32 item 4): status ``control_failed``, the reason and root cause recorded, exit 3 (the
    engine code) whatever the run's own verdict, which stays as judged without the control."""
    err = (m.engine.control_engine or {}).get("error")
    if not err:
        return code
    m.status = "control_failed"
    m.reason = f"the control engine failed: {err}"
    m.root_cause = m.root_cause or (m.engine.control_engine or {}).get("root_cause")
    return ExitCode.ENGINE


def _write_reports(m: Manifest, run_dir: Path) -> None:
    from .manifest import write_atomic
    from .render import to_junit, to_markdown
    try:
        write_atomic(run_dir / "summary.md", to_markdown(m))
        write_atomic(run_dir / "junit.xml", to_junit(m))
    except Exception as exc:  # noqa: BLE001 - reports never hide the manifest
        m.summary.report_error = str(exc)


def _summarize(m: Manifest) -> None:
    load = [p for p in m.phases if p.role == "load"]
    compared = [r for r in m.requests if r.match is not None]
    m.summary.update({
        "phases_completed": sum(1 for p in load if p.status in ("pass", "fail")),
        "phases_failed": sum(1 for p in load if p.status == "fail"),
        "hashes_compared": len(compared),
        "hashes_matched": sum(1 for r in compared if r.match),
        "near_ties": sum(1 for r in m.requests if r.tolerated
                         and r.divergence.attribution != "also_in_control"),
        "also_in_control": sum(1 for r in m.requests if r.divergence
                               and r.divergence.attribution == "also_in_control"),
        "only_under_test": sum(1 for r in m.requests if r.divergence
                               and r.divergence.attribution == "only_under_test"),
        "hard_divergences": sum(1 for r in m.requests if r.divergence and r.divergence.fails),
        "request_errors": sum(1 for r in m.requests if r.request_error),
        "checks_failed": sum(1 for r in m.requests for c in r.failed_checks
                             if c.name != "parity"),
        "model_behaviour_notes": sum(1 for r in m.requests for c in r.checks
                                     if c.status == "note"),
    })
    from .summary import throughput_by_concurrency
    m.summary.throughput_by_concurrency = throughput_by_concurrency(m)
    from .evidence import run_evidence
    engaged, vacuous = run_evidence(m)
    m.summary.engaged = engaged
    m.summary.vacuous = vacuous
    m.summary.vacuous_run_level = [v for v in vacuous if not v.startswith("phase ")]
    m.summary.headline = headline(m)


def _verdict(m: Manifest) -> int:
    """Summarize ``m`` and set its verdict: fail when a request is a problem
    (:attr:`RequestRecord.is_problem`: an untolerated parity difference, a request error, a failed
    check) or a phase failed (phase checks such as health_after_phase). Returns the exit code."""
    _summarize(m)
    failed = (any(r.is_problem for r in m.requests) or any(p.status == "fail" for p in m.phases)
              or bool(m.run_options.strict and m.summary.vacuous_run_level))
    m.verdict = "fail" if failed else "pass"
    return ExitCode.FAIL if failed else ExitCode.OK


