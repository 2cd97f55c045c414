"""The ``fuzz`` job: search schedules with hypothesis on one engine, shrink a failure to its
reproducer, confirm the reproducer on fresh engines, verdict (docs/fuzz.md).

:func:`run_fuzz` reads as its list of phases, the way hypothesis' runner does (issue 34), each a
step of :mod:`pleharness.jobrun`, of :mod:`pleharness.pipeline` or the ``fuzz`` kind's runner
(:mod:`pleharness.scenarios.fuzz.runner`), in the frame of a stress or fuzz run
(:func:`pleharness.jobrun.run_job`, in the job frame :class:`pleharness.jobrecord.JobFrame`:
the manifest's ``job`` record names the steps done):

1. engine: start or attach the engine under test, its facts (the search space is drawn from
   them) and the engine probe (whether seeded samples may be drawn);
2. search: hypothesis draws schedules and runs each as one example, every output compared
   with its single-request reference and checked; on a failure its shrinker, then the greedy
   shrink (phases, inserts, requests deleted while it still fails), then the recheck of the
   minimal schedule in this engine process, and the reproducer written (``repro.toml``);
3. sides: which side of each divergence is wrong, the tables from the final verdicts;
4. confirmation: the reproducer replayed ``--confirm-runs`` times, each on a freshly started
   engine of the same configuration (:func:`pleharness.pipeline.confirm_reproducers`, each
   replay a ``stress`` run; an attached engine: on it). Where the side-by-side plan lets them
   run beside the engine under test (a GPU, ``--parallel-engines N``), the first wave's engines
   are started as the search begins (:func:`pleharness.pipeline.confirmation_spares`) and the
   replays take them over, fresh: the replays no longer wait for engine starts after the
   shrink (issue 49); unused ones are stopped at the end;
5. verdict: exit 1 when a failing schedule was found.

The ``fuzz`` kind is also a scenario of any suite (``stress --scenario fuzz``, the nightly
suite's fuzz member): there the stress job runs the same search among the other scenarios.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from rich.console import Console

from .config import StressConfig, SuiteConfig
from .jobrun import (JobInput, JobRun, check_input, conclude, engine_under_test, evidence_step,
                     open_session, run_job, sides_step, suite_step)
from .pipeline import confirm_reproducers, confirmation_spares


def run_fuzz(cfg: StressConfig, params: dict[str, Any], console: Console | None = None,
             err_console: Console | None = None) -> int:
    """Run the fuzz job on ``cfg``'s engine with the ``fuzz`` kind's ``params`` (FuzzParams
    fields by name, checked by the kind: UsageError) as its one scenario; returns the exit code
    (0 no failing example, 1 a failing schedule found, 3 the engine failed, 4 internal error;
    :mod:`pleharness.errors`). Each confirming replay is a ``stress`` run
    (:func:`pleharness.pipeline.confirm_reproducers`). ``cfg.suite`` is replaced by the search.
    Raises UsageError (exit 2) for bad options or input, before anything starts."""
    console = console or Console(stderr=False)
    cfg = fuzz_config(cfg, params)
    return run_job(cfg, check_input(cfg, console), _phases, console, err_console,
                   job="fuzz")


def fuzz_config(cfg: StressConfig, params: dict[str, Any]) -> StressConfig:
    """``cfg`` with the search as its suite: one ``fuzz`` scenario of ``params`` (what a fuzz
    run records in its manifest's ``scenarios``)."""
    return replace(cfg, suite=SuiteConfig(scenarios=[("fuzz", dict(params))]))


def _phases(run: JobRun, stack: contextlib.ExitStack, inputs: JobInput) -> int:
    """The phases of the module docstring, in order; returns the exit code."""
    open_session(run, stack)
    with run.step("engine"):  # 1
        eng = engine_under_test(run, inputs.scenarios, inputs.target)
    spares = confirmation_spares(run, inputs.target)
    if spares is not None:
        stack.enter_context(spares)  # unused spares stop with the job
    with run.step("search"):  # 2 (and shrink, recheck)
        suite_step(run, stack, inputs, eng, references={})
    with run.step("sides"):  # 3: the envelope (--numerics-from), then sides
        evidence_step(run, control=None)
        sides_step(run, inputs.scenarios, control=None)
    if run.cfg.confirmation.runs and run.manifest.tables.get("reproducers"):
        with run.step("confirmation"):  # 4
            confirm_reproducers(run, eng, spares)
    with run.step("verdict"):  # 5
        return conclude(run)
