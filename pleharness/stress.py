"""The ``stress`` job: launch or attach, run the selected scenarios, write the manifest, verdict.

:func:`run_stress` checks the options and input (:func:`pleharness.jobrun.check_input`), then runs
the named steps of :func:`_steps` in the frame every job's run goes through
(:func:`pleharness.jobrun.run_job`: the run folder and manifest, every engine, the signals and
the GPU-memory check owned by one :class:`~pleharness.engine.session.EngineSession`, every
exception mapped to a manifest status and an exit code in one place): references (on a
reference engine if asked), engines (the engine under test), suite, control (the engine under
test's launch as a :class:`~pleharness.engine.session.Variant`), evidence, sides,
confirmation, verdict.
The steps are :mod:`pleharness.jobrun`'s, the passes on each engine :mod:`pleharness.passes`.
"""
from __future__ import annotations

import contextlib

from rich.console import Console

from .config import StressConfig
from .jobrun import (JobInput, JobRun, check_input, conclude, confirm_reproducers,
                     evidence_step, open_session, run_job, sides_step, start_engines, suite_step)
from .passes import control_pass, reference_pass


def run_stress(cfg: StressConfig, console: Console | None = None,
               err_console: Console | None = None) -> int:
    """Run the job; returns the exit code (see :mod:`pleharness.errors`; 4 for an internal
    error, its traceback in ``<run>/harness-error.log``). Never leaves an engine. Reports go to
    ``console`` (stdout), errors and warnings to ``err_console`` (stderr). Raises UsageError
    (exit 2) for bad options or input, before anything is started or a run folder exists."""
    console = console or Console(stderr=False)
    return run_job(cfg, check_input(cfg, console), _steps, console, err_console)


def _steps(run: JobRun, stack: contextlib.ExitStack, inputs: JobInput) -> int:
    """The steps of a run, in this order, every engine in the run's session (closed with
    ``stack``); returns the exit code.

    1. references: taken on a reference engine (``--reference engine``; in the other modes the
       suite takes them, or they came from a manifest)
    2. engines: start or attach the engine under test (and the control engine beside it, when
       the side-by-side plan lets it)
    3. suite: the engine probe, the suite, and the judgement that needs all of it
    4. control: the suite again on the control engine, the divergences attributed
    5. evidence: the numerics envelope measured on the control run and every tolerance judged
       again at it, the control's solo answers compared with the run's (issue 47)
    6. sides: which side of each divergence is wrong; the tables from the final verdicts
    7. confirmation: the reproducers the suite wrote whose failure still fails after 4 to 6,
       replayed on fresh engines (``--confirm-runs``; issue 34: fresh engines are not spent on
       a failure the control run explains), each replay a run of this job
    8. verdict: the verdict and the exit code (a control engine that failed: exit 3)
    """
    cfg, scenarios, target = run.cfg, inputs.scenarios, inputs.target
    open_session(run, stack)
    references = inputs.references
    if cfg.reference_mode == "engine":  # 1 references
        references = reference_pass(run, scenarios, target)
    eng, control_eng = start_engines(run, scenarios, target)  # 2 engines
    suite_step(run, stack, inputs, eng, references)  # 3 suite
    control = None
    if cfg.control:  # 4 control
        run.session.stop(eng)  # the control suite runs alone, as the suite did
        control = control_pass(run, scenarios, eng.facts, target, started=control_eng)
    evidence_step(run, control)  # 5 evidence
    sides_step(run, scenarios, control)  # 6 sides
    if cfg.confirmation.runs and run.manifest.tables.get("reproducers"):  # 7 confirmation
        confirm_reproducers(run, eng, runner=run_stress)
    return conclude(run)  # 8 verdict
