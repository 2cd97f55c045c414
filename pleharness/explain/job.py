"""The explain job itself: :func:`explain` (load the run, plan, launch and replay, write the
report) and :func:`confirm_repros` (the reproducers replayed on fresh engines)."""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..defaults import DEFAULT_CONFIRM_RUNS, DEFAULT_PARALLEL_ENGINES, DEFAULT_START_TIMEOUT_S
from ..engine.launch import engine_python_check
from ..engine.session import EngineSession, Interrupted
from ..engine.side_by_side import SideBySide, model_bytes
from ..engine.side_by_side import plan as plan_side_by_side
from ..environment import gpu_inventory
from ..errors import UsageError
from ..jobrecord import JobFrame, JobRecord
from ..explain_plan import estimate, order_first_round
from ..attribution import effective_config, unused_drops
from ..option_rules import harness_set_flag, raise_all
from ..files import BusyError, exclusive_lock, private_dir
from ..manifest import Manifest, write_atomic
from ..manifest.tables import Confirmation
from ..render.explain import render, to_junit
from ..pipeline import replay_reproducer
from ..reproduce import (ReplayTarget, check_run_model, load_launched_run, restore_env, run_config,
                         run_target)
from ..scenarios import load_scenario_file
from .replay import RunGolden, replay_all
from .report import ExplainProgress, ExplainReport, case_report, write_repro
from .suspects import failing_cases, suspects_for


def _size(path: Path) -> tuple[int, int]:
    """(requests, prompt tokens) a reproducer replays: the smaller, the cheaper to confirm."""
    phases = load_scenario_file(str(path)).params.phases
    return (sum(len(ph.requests) for ph in phases),
            sum(len(r.prompt) for ph in phases for r in ph.requests))


def confirm_repros(report: ExplainReport, m: Manifest, run_dir: Path, runs: int, *,
                   engine_python: str | None = None,
                   start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                   console: Console | None = None, on_each: Any = None,
                   side: SideBySide | None = None, confirm_all: bool = False,
                   compile_cache: str | None = None) -> None:
    """Replay the cases' ``repro-N.toml`` ``runs`` times each, every replay on a freshly started
    engine of the configuration under test (:func:`pleharness.pipeline.replay_reproducer`, each
    replay a ``stress`` run); a replayed case gets ``reproduction`` (the result) and
    ``reproduction_verdict`` ("reproduced 3/3 on fresh engines", "0/3: not reproduced ...").
    What the diagnosis needs, not every case (issue 49): of the cases that share one diagnosis
    (their ``attribution`` line), only the smallest reproducer (fewest requests, then fewest
    prompt tokens) is replayed and the others say "same diagnosis as case N" (``confirm_all``:
    every case is replayed). Cases whose reproducers replay the same schedule (the cases of one
    phase, at its companions level) are replayed once and share the result
    (``same_schedule_as``). Replays run under ``RUN/explain/confirm/``, ``side.n`` side by side
    (each with ``side.add``); ``on_each()`` is called after every case. ``compile_cache``: the
    replays' ``VLLM_CACHE_ROOT`` (default: the run's). Raises Interrupted when a replay was
    interrupted (SIGINT / SIGTERM)."""
    console = console or Console(stderr=True)
    rt = ReplayTarget(config=run_config(m, engine_python, start_timeout_s, compile_cache),
                      parallel=side.n if side else 1,
                      engine_args_add=list(side.add) if side else [])
    done: dict[str, tuple[str, Confirmation]] = {}  # schedule key -> (repro, result)
    first: dict[str, Any] = {}  # diagnosis -> the case whose reproducer is confirmed for it
    if not confirm_all:
        for c in sorted(report.cases, key=lambda c: (_size(run_dir / c.repro), c.case)):
            if c.minimal_case is not None:  # a diagnosis exists only for a reproduced case
                first.setdefault(c.attribution, c)
    for c in report.cases:
        path = run_dir / c.repro
        lead = first.get(c.attribution)
        if lead is not None and lead is not c:
            c.reproduction_verdict = (f"same diagnosis as case {lead.case} (its smaller "
                                      "reproducer is confirmed; --confirm-all replays this one "
                                      "too)")
            if on_each:
                on_each()
            continue
        # cases of one phase share its schedule ("with its phase companions"): replayed once
        key = json.dumps([[ph.concurrency, [r.model_dump() for r in ph.requests]]
                          for ph in load_scenario_file(str(path)).params.phases],
                         sort_keys=True)  # phase names carry the case number: not compared
        if key in done:
            same, res = done[key]  # (not ``first``: that maps diagnoses to their lead case)
            c.reproduction = res.model_copy(update={"same_schedule_as": same})
            c.reproduction_verdict = f"{res.verdict} (the schedule of {same})"
            if on_each:
                on_each()
            continue
        console.print(f"confirming {escape(c.repro)}: {runs} replay(s), each on a freshly "
                      "started engine", highlight=False)
        res = replay_reproducer(path, rt, runs, path.parent / "confirm",
                                log=lambda x: console.print(escape(x), highlight=False))
        if res.reproduced:
            report.timeline.mark("confirmed")
        done[key] = (c.repro, res)
        c.reproduction = res
        c.reproduction_verdict = res.verdict
        console.print(f"{escape(c.repro)}: {escape(res.verdict)}", highlight=False)
        if on_each:
            on_each()


def explain(run: Path, *, suspects_extra: Sequence[str] = (), suspects_drop: Sequence[str] = (),
            auto_suspects: bool = True, include_warnings: bool = False, tries: int = 3,
            budget_s: float = 3600.0, engine_python: str | None = None,
            start_timeout_s: float = DEFAULT_START_TIMEOUT_S, console: Console | None = None,
            confirm_runs: int = DEFAULT_CONFIRM_RUNS,
            parallel_engines: int | None = DEFAULT_PARALLEL_ENGINES,
            confirm_all: bool = False, compile_cache: str | None = None) -> ExplainReport:
    """Explain the failing divergences of the run at ``run`` (folder or manifest); see the
    package's docstring (:mod:`pleharness.explain`). Returns the report (also written to
    ``RUN/explain/explain.json``, with ``explain.md`` and ``junit.xml``).

    ``confirm_runs``: replays of each reproducer on fresh engines (:func:`confirm_repros`, each
    replay a ``stress`` run of :mod:`pleharness.pipeline`; 0: skip; one per diagnosis unless
    ``confirm_all``).
    ``parallel_engines``: engines started side by side (None: auto;
    :func:`pleharness.engine.side_by_side.plan`). ``compile_cache``: the ``VLLM_CACHE_ROOT``
    of every launch (default: the run's, which is vLLM's default unless the run moved it).

    explain.json and explain.md are rewritten after every launch and every confirmation, and
    on SIGINT / SIGTERM, with ``status`` saying how far it got and every launch not reached
    "not tested yet" (a stopped explain keeps what it learned).

    Raises UsageError for a run that cannot be explained (attached engine, nothing failing, no
    prompt IDs kept, more side-by-side engines than fit); EngineError when the configuration
    under test cannot be started; Interrupted on SIGINT / SIGTERM (the engines running then
    are stopped first).
    """
    console = console or Console(stderr=True)
    m, run_dir, cases, unfinished = explainable_run(run, include_warnings, engine_python,
                                                    suspects_extra, suspects_drop, console)
    held = contextlib.ExitStack()
    try:
        held.enter_context(exclusive_lock(run_dir / ".explain.lock"))
    except BusyError:
        raise UsageError(f"{run}: another explain of this run is running (it writes "
                         f"{run_dir / 'explain'}): wait for it to end, or explain a copy of "
                         "the run folder") from None
    with held:
        out_dir = run_dir / "explain"
        kept = _keep_previous(out_dir)
        if kept is not None:
            console.print(f"the previous explain of this run is kept in {escape(str(kept))}",
                          highlight=False)
        private_dir(out_dir)
        report = ExplainReport(m.run_id, tries, budget_s, include_warnings=include_warnings)
        progress: ExplainProgress | None = None  # once planned (the closures read it then)

        def save(rec: JobRecord) -> None:  # explain.json (and explain.md once planned) now
            report.job = rec
            if progress is not None:
                progress.save(report.status)
            else:
                write_atomic(out_dir / "explain.json", report.to_json())

        def stopped(exc: BaseException, _rec: JobRecord) -> None:
            report.status = _stopped(exc, report)

        with JobFrame("explain", save, crash_dir=out_dir, on_error=stopped) as frame:
            if unfinished:
                console.print(f"{unfinished}: explaining the {len(cases)} failing case(s) it "
                              "recorded", highlight=False)
            if not cases:
                console.print("no failing divergences in this run: nothing to explain")
                report.status = "complete"
                frame.complete(0)
                return report
            with frame.step("plan"):
                target, gpus, side, golden = _plan(report, m, cases, out_dir, engine_python,
                                                   start_timeout_s, compile_cache,
                                                   parallel_engines, suspects_extra,
                                                   suspects_drop, auto_suspects, budget_s,
                                                   console)
            progress = ExplainProgress(report, cases, out_dir, run_dir)
            t0 = time.monotonic()
            try:
                with EngineSession(console, out_dir, gpus_before=gpus) as session:
                    report.timeline.engine_starts = session.starts  # the same list, as they start
                    with frame.step("launches"):
                        configs = replay_all(session, target, m, cases, report, budget_s, t0,
                                             console, progress, side, golden)
                        for c in cases:
                            path = out_dir / f"repro-{c.index}.toml"
                            write_repro(c, path, m.run_id)
                            report.cases.append(case_report(c, configs[1:],
                                                            str(path.relative_to(run_dir))))
                        if any(c.minimal_case is not None for c in report.cases):  # diagnosed
                            report.timeline.mark("diagnosis")
                    if confirm_runs:
                        with frame.step("confirmation"):
                            progress.save("confirming the reproducers")
                            confirm_repros(report, m, run_dir, confirm_runs,
                                           engine_python=engine_python,
                                           start_timeout_s=start_timeout_s, console=console,
                                           on_each=lambda: progress.save(
                                               "confirming the reproducers"),
                                           side=side, confirm_all=confirm_all,
                                           compile_cache=compile_cache)
            finally:
                if golden is not None:
                    golden.close()
                    if golden.error:
                        report.golden += f"; stopped: {golden.error}"
            report.elapsed_s = round(time.monotonic() - t0, 1)
            report.timeline.mark("ended")
            report.status = "complete"
            frame.complete(0)
        result = report.result()
        write_atomic(out_dir / "junit.xml", to_junit(result))
        render(result, console)
        return report


def explainable_run(run: Path, include_warnings: bool, engine_python: str | None,
                    suspects_extra: Sequence[str], suspects_drop: Sequence[str],
                    console: Console) -> tuple[Manifest, Path, list, str]:
    """What explain checks before any folder is made or moved: the run (launched, its
    manifest), its failing cases, ``--engine-python``, the suspects, the run's model and
    environment, and a writable run folder. Returns (manifest, run folder, the failing cases,
    why the run is unfinished or ""). Raises UsageError for each problem, naming it."""
    m, run_dir = load_launched_run(run, "explain")
    cases = failing_cases(m, include_warnings)
    if engine_python is not None:  # a typo must not wait for the first launch
        problem = engine_python_check(engine_python)
        if problem:
            raise UsageError(f"--engine-python: {problem}")
    unfinished = ""
    if m.status not in ("complete", "control_failed"):
        s = m.summary
        done = f" after {s.phases_completed} of {s.phases_planned} phases" \
            if s.phases_planned else ""
        unfinished = f"the run did not complete (status {m.status!r}{done})"
        if not cases:  # refused before any folder is made or moved
            raise UsageError(f"{run}: {unfinished}: no verdict, nothing to explain")
    raise_all(suspect_problems(m, suspects_extra, suspects_drop))
    if cases:  # what the launches need, before any folder is made or moved
        check_run_model(run, (m.engine.launch or {}).get("model"))
        for line in restore_env(m)[1]:
            console.print(f"note: the run's engine environment value of {escape(line)} (the "
                          "run recorded it as <redacted>)", highlight=False)
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UsageError(f"{run}: the run folder {run_dir} is not writable (read-only or not "
                         "yours): explain writes RUN/explain/ there; copy the run folder to a "
                         "writable place and explain the copy")
    return m, run_dir, cases, unfinished


def _plan(report: ExplainReport, m: Manifest, cases: list, out_dir: Path,
          engine_python: str | None, start_timeout_s: float, compile_cache: str | None,
          parallel_engines: int | None, suspects_extra: Sequence[str],
          suspects_drop: Sequence[str], auto_suspects: bool, budget_s: float,
          console: Console) -> tuple:
    """explain's plan: the run's engine target, the GPUs, the side-by-side plan, the suspects in
    launch order and the estimate (into ``report``), and the run's golden model
    (:meth:`RunGolden.of_run`). Returns (target, gpus, side-by-side plan, golden or None)."""
    target = run_target(m, engine_python, start_timeout_s, compile_cache)
    gpus = gpu_inventory()
    side = plan_side_by_side(parallel_engines, gpus=gpus, model=model_bytes(target.model_path),
                             engine_args=target.engine_args, engine_env=target.engine_env)
    suspects = order_first_round(m, suspects_for(m, suspects_extra, suspects_drop,
                                                 auto_suspects))
    report.suspects = list(suspects)
    report.side_by_side = side.record()
    report.estimate = estimate(m, 1 + len(suspects), side.n, budget_s)
    console.print(f"{len(cases)} failing case(s); {1 + len(suspects)} engine launch(es) "
                  "planned: the configuration under test, then without: "
                  f"{', '.join(s.name for s in suspects) or '(no suspects)'}", highlight=False)
    console.print(f"estimate: {report.estimate['text']}", highlight=False)
    if side.n > 1:
        console.print(escape(side.why), highlight=False)
    console.print(f"explain.json and explain.md: {escape(str(out_dir))} (rewritten after every "
                  "launch)", highlight=False)
    golden, report.golden = RunGolden.of_run(m, target, out_dir)
    return target, gpus, side, golden


def suspect_problems(m: Manifest, extra: Sequence[str], drops: Sequence[str]) -> list[str]:
    """Usage-error lines for ``--suspect`` / ``--suspect-drop`` values whose control would
    serve the configuration under test itself (its conclusion would then be about nothing): a
    value given twice, a value that is no flag (no leading ``--``), a dropped flag the harness
    sets itself (``--model``: it is not among the
    engine arguments and cannot be dropped) or one not among the run's engine arguments, and an
    added argument the run already has. Checked before any folder is made or engine started,
    as ``stress --control-drop-arg`` is."""
    args = list((m.engine.launch or {}).get("engine_args") or [])
    out = []
    for flag, items in (("--suspect", extra), ("--suspect-drop", drops)):
        twice = sorted({a for a in items if list(items).count(a) > 1})
        if twice:
            out.append(f"{flag} {', '.join(twice)}: given more than once (one control each is "
                       "enough)")
    for flag, items in (("--suspect", extra), ("--suspect-drop", drops)):
        for a in dict.fromkeys(items):
            if not a.startswith("--"):
                out.append(f"{flag}={a}: not an engine flag (a flag starts with --, e.g. "
                           f"{flag}=--{a.split('=', 1)[0].lstrip('-')})")
    extra = [a for a in extra if a.startswith("--")]
    drops = [d for d in drops if d.startswith("--")]
    for d in dict.fromkeys(drops):
        if harness_set_flag(d):
            out.append(f"--suspect-drop={d}: the harness sets {harness_set_flag(d)} itself on "
                       "every launch, so it cannot be dropped (the control would be the "
                       "configuration under test)")
        elif unused_drops(args, [d]):
            out.append(f"--suspect-drop={d}: not among the run's engine arguments "
                       f"({' '.join(args) or 'none'}), so dropping it changes nothing")
    base = effective_config(args, {})
    for a in dict.fromkeys(extra):
        if effective_config(args + [a], {}) == base:
            out.append(f"--suspect={a}: the run's engine arguments already say so "
                       f"({' '.join(args)}), so adding it changes nothing")
    return out


def _keep_previous(out_dir: Path) -> Path | None:
    """Move an earlier explain's folder (one with an explain.json) aside to
    ``explain-<its time>``, so that a new explain (which rewrites explain.json from its first
    launch on) loses nothing; returns where it went, or None."""
    if not (out_dir / "explain.json").exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S",
                          time.localtime((out_dir / "explain.json").stat().st_mtime))
    dest, n = out_dir.with_name(f"explain-{stamp}"), 1
    while dest.exists():
        n += 1
        dest = out_dir.with_name(f"explain-{stamp}-{n}")
    out_dir.rename(dest)
    return dest


def _stopped(exc: BaseException, report: "ExplainReport") -> str:
    """explain.json's ``status`` when explain ends early with ``exc``."""
    done = sum(1 for la in report.launches if la.get("command"))
    if isinstance(exc, (Interrupted, KeyboardInterrupt)):
        return f"interrupted ({exc or 'interrupted by SIGINT'}) after {done} launch(es)"
    return f"stopped by an error after {done} launch(es): {str(exc)[:300]}"
