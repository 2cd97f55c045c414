"""The ``fuzz`` kind's runner: the scenario kind :class:`Fuzz`, whose :meth:`Fuzz.run` reads as
its list of phases, the way hypothesis' runner does:

1. **search** (:meth:`Fuzz._search`): hypothesis draws schedules from the space of
   :mod:`.strategy` and runs each as one example (:mod:`.example`); on a failure its own
   shrinker tries smaller schedules;
2. **shrink** (:meth:`Fuzz._shrink`): a greedy pass deletes phases, inserts and requests while
   the schedule still fails;
3. **confirm** (:meth:`Fuzz._confirm`): the minimal schedule rechecked in this engine process;

then the reproducers (:mod:`.repro`) and the ``fuzz_summary`` row. What the kind draws, judges
and records: the package docstring (:mod:`pleharness.scenarios.fuzz`).

Who runs it: the ``fuzz`` job (:mod:`pleharness.fuzzjob`: engine, this search, sides, the
reproducer confirmed on fresh engines, verdict), and the stress job when a suite has a fuzz
member (the nightly suite), the way hypothesis' runner works inside one test among others. Both
give it the run's one engine session, references, judge and manifest."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...manifest import CheckResult
from ...manifest.tables import ReproducerRow
from ..base import Scenario, ScenarioError, register
from .example import Abort, FuzzExamples
from .repro import failing_rows, write_repro
from .rows import ExampleRow, FuzzSummaryRow, ShrinkStepRow
from .strategy import (FuzzParams, FuzzPhase, Schedule, Space, build_space, relabel,
                       schedules)

if TYPE_CHECKING:  # pragma: no cover
    from ...run.scenario_context import ScenarioContext


class _PropertyFailed(AssertionError):
    pass


@register
class Fuzz(FuzzExamples, Scenario):
    kind = "fuzz"
    summary = "property-based schedules (hypothesis) from the engine facts, shrunk to repro.toml"
    Params = FuzzParams
    writes_reproducers = True

    def planned_phases(self) -> int:
        return 0  # unknown in advance

    def plan(self, ctx: "ScenarioContext") -> None:
        """The plan without an engine (:meth:`Scenario.plan`): no search (its schedules depend
        on what hypothesis draws), the space it would draw from, as notes ``fuzz_plan``; left
        out when no schedule fits the engine (as :meth:`run`)."""
        p = self.params
        try:
            space = build_space(ctx.facts, p, ctx.engine_probe)
        except ScenarioError as exc:
            ctx.add_planned_phases(1)
            ctx.leave_out("fuzz", f"no schedule fits this engine: {exc}")
            return
        lens = [n for n, _ in space.lengths]
        ctx.note("fuzz_plan", [
            f"up to {p.max_examples} schedules of 1..{space.max_phases} phases"
            + (f", searched for at most {p.time_budget_s:g} s" if p.time_budget_s else "")
            + f"; max_tokens {space.max_tokens}, prompts up to {space.max_len} tokens",
            f"boundary lengths drawn: {lens[:12]}{' ...' if len(lens) > 12 else ''}",
            f"concurrency edges: {space.concurrency_edges} (at most {space.max_concurrency})"]
            + space.notes)

    def run(self, ctx: "ScenarioContext") -> None:
        """The search loop, phase by phase: search, shrink (with ``shrink``), confirm (with
        ``confirm``), then the reproducers of the minimal failing schedule and the summary."""
        p = self.params
        run_dir = Path(ctx.run_dir)
        try:
            space = self._prepare(ctx)
        except ScenarioError as exc:  # the engine leaves no room for a schedule: said, vacuous
            ctx.add_planned_phases(1)
            ctx.leave_out("fuzz", f"no schedule fits this engine: {exc}")
            return
        db_path = Path(p.db) if p.db else run_dir / "hypothesis-db"
        examples: list[ExampleRow] = []  # also the manifest's tables of these names (_keep)
        steps: list[ShrinkStepRow] = []
        ctx.add_table("fuzz_examples", [])
        ctx.add_table("fuzz_shrink_steps", [])
        memo: dict[str, ExampleRow] = {}
        state = {"n": 0, "failures": 0, "skipped": 0, "first_fail_t": None, "minimal": None,
                 "failing": []}
        t_start = time.monotonic()
        task = None
        if ctx.progress is not None:
            task = ctx.progress.add_task("fuzz", total=p.max_examples)

        def live() -> None:
            if task is not None:
                ctx.progress.update(task, completed=min(state["n"], p.max_examples),
                                    description=f"fuzz: {state['n']} examples, "
                                    f"{state['failures']} failing, "
                                    f"{time.monotonic() - t_start:.0f} s")

        prop = self._property(ctx, memo, state, examples, steps, live, t_start)
        test = self._hypothesis_test(prop, space, db_path)
        first = ctx.mark()
        live()
        try:
            minimal = self._search(ctx, test, state)
            if minimal is not None and p.shrink:
                minimal = self._shrink(ctx, minimal, memo, state, examples, steps, live, t_start)
        except Abort as a:
            if task is not None:
                ctx.progress.remove_task(task)
            raise a.exc from None
        if task is not None:
            ctx.progress.remove_task(task)
        elapsed = time.monotonic() - t_start
        summary = self._summary(state, space, examples, db_path, elapsed)
        if minimal is not None and p.confirm:
            smallest = minimal
            minimal, summary.rechecked_in_process = self._confirm(
                ctx, minimal, state["failing"], examples)
            if summary.rechecked_in_process and minimal.key() != smallest.key():
                summary.smallest_unconfirmed = smallest.summary()
                ctx.console.print("fuzz: the smallest failing schedule did not fail on every recheck; the "
                                  f"reproducer is the smallest one that did: {minimal.summary()}")
        if minimal is not None:
            repro = self._write_reproducers(ctx, minimal, state, examples, summary)
            ctx.console.print(f"fuzz: minimal failing schedule {minimal.summary()} "
                              f"(after {len(steps)} failing example(s)); reproducer: {repro}")
        else:
            ctx.console.print(f"fuzz: {state['n']} examples passed in {elapsed:.0f} s")
        ctx.set_table("fuzz_summary", [summary])
        ctx.add_planned_phases(sum(1 for ph in ctx.since(first)[0] if ph.role == "load"))
        if state["n"] == 0:  # a search of nothing is no pass
            self._searched_nothing(ctx, state)

    @staticmethod
    def _searched_nothing(ctx: "ScenarioContext", state: dict) -> None:
        """Record a failing ``search`` phase (check ``examples_run``) for a search that ran no
        example (e.g. a ``--time-budget`` that ended before the first one): it tested nothing,
        so the run must not pass."""
        why = (f"0 examples ran ({state['skipped']} skipped: the time budget ended the search "
               "before the first one; give a longer --time-budget)" if state["skipped"] else
               "0 examples ran")
        ctx.add_planned_phases(1)
        ph = ctx.leave_out("search", why)
        if ph is not None:
            ctx.add_phase_check(ph, CheckResult(name="examples_run", status="fail", detail=why))
        ctx.console.print(f"[red]fuzz: {why}: the run tested nothing[/red]")

    # -- search -----------------------------------------------------------------------------------
    @staticmethod
    def _search(ctx: "ScenarioContext", test, state: dict) -> Schedule | None:
        """Phase search: the hypothesis ``test`` (:meth:`_hypothesis_test`: its phases explicit,
        reuse, generate and, with ``shrink``, its own shrinker). Returns the smallest failing
        schedule seen, or None when none failed; an engine error or interrupt comes out as
        :class:`~.example.Abort`."""
        # lazy: hypothesis is imported when a fuzz run starts, not at module import (start-up)
        from hypothesis.errors import HypothesisException
        try:
            test()
        except _PropertyFailed:
            return state.get("last_fail") or state["minimal"]
        except HypothesisException as exc:  # e.g. Flaky: keep the smallest failure seen
            ctx.console.print(f"fuzz: hypothesis: {exc.__class__.__name__}: {exc}")
            return state["minimal"]
        return None

    def _property(self, ctx: "ScenarioContext", memo: dict, state: dict, examples: list,
                  steps: list, live, t_start: float):
        """The hypothesis property over one :class:`Schedule`: runs it once (a replayed key
        takes its ``memo`` row), skips it out of time (``time_budget_s`` while searching,
        ``shrink_budget_s`` after the first failure; counted in ``state["skipped"]``), keeps
        the rows (``fuzz_examples``, ``fuzz_shrink_steps``) and raises
        :class:`_PropertyFailed` on a failing example."""
        p = self.params

        def prop(sched: Schedule) -> None:
            k = sched.key()
            if k in memo:  # hypothesis replays: the engine result is kept, not re-run
                row = memo[k]
            else:
                now = time.monotonic()
                shrinking = state["first_fail_t"] is not None
                over = (p.time_budget_s is not None and not shrinking
                        and now - t_start > p.time_budget_s) or \
                       (shrinking and now - state["first_fail_t"] > p.shrink_budget_s)
                if over:
                    state["skipped"] += 1
                    return  # not run: out of time (counted, never a pass in the tables)
                state["n"] += 1
                row = self.run_example(ctx, sched, f"ex{state['n']}")
                row.stage = "shrink" if shrinking else "search"
                row.elapsed_s = round(time.monotonic() - t_start, 3)
                memo[k] = row
                _keep(ctx, examples, "fuzz_examples", row)
                if row.status == "fail":
                    state["failures"] += 1
                    if state["first_fail_t"] is None:
                        state["first_fail_t"] = time.monotonic()
                        state["examples_to_failure"] = state["n"]
                    _keep_step(ctx, steps, row)
                    state["minimal"] = sched  # hypothesis only tries smaller ones from here
                    state["failing"].append(sched)
                live()
            if row.status == "fail":
                state["last_fail"] = sched
                raise _PropertyFailed(f"{row.example}: {row.schedule}")

        return prop

    def _hypothesis_test(self, prop, space: Space, db_path: Path):
        """``prop`` as a hypothesis test over :func:`schedules` (seed, max_examples, the example
        database at ``db_path``, no deadline, shrinking only with ``shrink``)."""
        # lazy: hypothesis, only when a fuzz run starts
        from hypothesis import HealthCheck, Phase, given, seed, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
        p = self.params
        test = given(schedules(space))(prop)
        test = seed(p.seed)(test)
        return settings(max_examples=p.max_examples, deadline=None, derandomize=False,
                        database=DirectoryBasedExampleDatabase(str(db_path)),
                        phases=[Phase.explicit, Phase.reuse, Phase.generate]
                        + ([Phase.shrink] if p.shrink else []),
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                        print_blob=False)(test)

    # -- shrink -----------------------------------------------------------------------------------
    def _shrink(self, ctx, sched: Schedule, memo: dict, state: dict, examples: list,
                steps: list, live, t_start: float) -> Schedule:
        """Phase shrink, after hypothesis' own shrinker: delete whole phases, then single
        requests (the phase's concurrency one lower), greedily, keeping each deletion that still
        fails in one of two runs (stages ``delete`` / ``delete-retry``; within
        ``shrink_budget_s`` of the first failure). Hypothesis' shrinker can leave a harmless
        leading phase that it cannot delete without reshaping later draws."""
        def fails(cand: Schedule) -> bool:
            k = cand.key()
            tries = 0
            # a candidate that passes is run once more: a timing-dependent fault (e.g. "while
            # >= 3 in flight") can miss one run of a schedule that does trigger it
            while tries < 2 and (k not in memo or (memo[k].status == "pass" and tries)):
                if time.monotonic() - state["first_fail_t"] > self.params.shrink_budget_s:
                    return False
                tries += 1
                state["n"] += 1
                row = self.run_example(ctx, cand, f"ex{state['n']}")
                row.stage = "delete" if tries == 1 else "delete-retry"
                row.elapsed_s = round(time.monotonic() - t_start, 3)
                memo[k] = row
                _keep(ctx, examples, "fuzz_examples", row)
                if row.status == "fail":
                    state["failures"] += 1
                    state["failing"].append(cand)
                    _keep_step(ctx, steps, row)
                live()
                if row.status == "fail":
                    break
            return memo[k].status == "fail"

        i = 0
        while i < len(sched.phases) and len(sched.phases) > 1:
            cand = relabel(Schedule(sched.phases[:i] + sched.phases[i + 1:]))
            if fails(cand):
                sched = cand
            else:
                i += 1
        def with_phase(i: int, ph: FuzzPhase) -> Schedule:
            return relabel(Schedule(sched.phases[:i] + (ph,) + sched.phases[i + 1:]))

        for i in range(len(sched.phases)):
            # inserts (the last one goes with its carrier), then requests: with a carrier a
            # phase may lose all of them (the carrier and an insert are the whole schedule)
            j = 0
            while j < len(sched.phases[i].inserts):
                ph = sched.phases[i]
                ins = ph.inserts[:j] + ph.inserts[j + 1:]
                cand = with_phase(i, FuzzPhase(ph.concurrency, ph.requests,
                                               ph.carrier if ins else None, ins))
                if ph.concurrency == 0 and not ins:
                    j += 1  # nothing would be left of the phase
                    continue
                if fails(cand):
                    sched = cand
                else:
                    j += 1
            j = 0
            while j < len(sched.phases[i].requests) and \
                    len(sched.phases[i].requests) > (0 if sched.phases[i].carrier else 1):
                ph = sched.phases[i]
                reqs = ph.requests[:j] + ph.requests[j + 1:]
                cand = with_phase(i, FuzzPhase(len(reqs), reqs, ph.carrier, ph.inserts))
                if fails(cand):
                    sched = cand
                else:
                    j += 1
        return sched

    # -- confirm ----------------------------------------------------------------------------------
    CONFIRM_TRIES, CONFIRM_FALLBACKS = 3, 4

    def _confirm(self, ctx, minimal: Schedule, failing: list[Schedule],
                 examples: list) -> tuple[Schedule, bool]:
        """Re-run ``minimal`` in this engine process (CONFIRM_TRIES runs, stage ``recheck``; a
        recheck against references cached in this process, never counted as confirmation: that
        is a fresh engine's, :mod:`pleharness.reproduce`) and keep it when it fails on every
        run. When it does not (a timing-dependent fault whose shrunk schedule sits right at
        the edge, e.g. an insert one token too early, or two requests whose overlap decides
        it), walk back through the larger failing schedules seen (``failing``, newest first, up
        to CONFIRM_FALLBACKS) and keep the first that fails on every run; failing that, the
        first that failed on any run. Returns (schedule for the reproducer, whether it failed
        again).

        Why every run (seen on the H200, docs/gpu-runs/README.md run o): a shrunk C2 schedule
        whose fault needs both requests in flight failed 1 of 2 rechecks here, then 0 of 3
        replays on fresh engines, and the larger schedule's confirmation cost a second wave of
        engine starts (~60 s); a recheck costs seconds."""
        seen, tried, runs = set(), 0, 0
        flaky: Schedule | None = None
        for cand in [minimal] + failing[::-1]:
            if cand.key() in seen:
                continue
            seen.add(cand.key())
            if tried > self.CONFIRM_FALLBACKS:
                break
            tried += 1
            fails = 0
            for t in range(self.CONFIRM_TRIES):
                runs += 1
                row = self.run_example(ctx, cand, "recheck" + (f"-{runs}" if runs > 1 else ""))
                row.stage = "recheck"
                _keep(ctx, examples, "fuzz_examples", row)
                fails += row.status == "fail"
                if fails <= t:  # a run passed: not every run fails
                    break
            if fails == self.CONFIRM_TRIES:
                return cand, True
            if fails and flaky is None:
                flaky = cand
        return (flaky, True) if flaky is not None else (minimal, False)

    # -- the reproducers and the summary -----------------------------------------------------------
    def _summary(self, state: dict, space: Space, examples: list, db_path: Path,
                 elapsed: float) -> FuzzSummaryRow:
        """The ``fuzz_summary`` row before confirmation and reproducers (their keys None)."""
        p = self.params
        run_walls = [r.wall_s for r in examples]
        return FuzzSummaryRow(
            examples_run=state["n"], failing_examples=state["failures"],
            examples_to_failure=state.get("examples_to_failure"),
            skipped_out_of_time=state["skipped"], seed=p.seed,
            max_examples=p.max_examples, time_budget_s=p.time_budget_s,
            database=str(db_path), elapsed_s=round(elapsed, 3),
            s_per_example=round(sum(run_walls) / len(run_walls), 3) if run_walls else None,
            repro=None, minimal_schedule=None,
            rechecked_in_process=None, confirmed=None, reproduction=None,
            space={"q": space.q, "lengths": [x for x, _ in space.lengths],
                   "uniform_max_len": space.max_len,
                   "concurrency_edges": space.concurrency_edges,
                   "max_concurrency": space.max_concurrency,
                   "chat_min_len": space.chat_min, "max_inserts": space.max_inserts,
                   "carrier_tokens": space.carrier_tokens,
                   "carrier_max_len": space.carrier_max_len,
                   "sampled": space.sampled, "features": sorted(space.features),
                   "notes": space.notes})

    @staticmethod
    def _last_failing(examples: list[ExampleRow], sched: Schedule) -> ExampleRow | None:
        """The last failing example row of ``sched`` (None when none)."""
        k = sched.key()
        return next((r for r in reversed(examples) if r.key == k and r.status == "fail"), None)

    def _write_reproducers(self, ctx: "ScenarioContext", minimal: Schedule, state: dict,
                           examples: list, summary: FuzzSummaryRow) -> Path:
        """``repro.toml`` of ``minimal`` (and ``repro-larger.toml`` of the first failing
        schedule when it differs) at ``ctx.file_path`` (a ``control-`` prefix in the control
        run); the ``reproducers`` and ``fuzz_failing`` tables added and ``summary`` updated.
        Returns the reproducer's path."""
        repro = ctx.file_path("repro.toml")
        last = self._last_failing(examples, minimal)
        mml = ctx.facts.max_model_len
        write_repro(self.specs(ctx, minimal), minimal, repro, ctx.run_id,
                    sent=last.insert_sent if last else None,
                    failed=last.failed if last else None,
                    max_model_len=mml)
        summary.repro, summary.minimal_schedule = str(repro), minimal.summary()
        entry = ReproducerRow(source="fuzz", path=repro.name, schedule=minimal.summary(),
                              summary_table="fuzz_summary")
        larger = state["failing"][0] if state["failing"] else None
        if larger is not None and larger.key() != minimal.key():
            fb = ctx.file_path("repro-larger.toml")
            lrow = self._last_failing(examples, larger)
            write_repro(self.specs(ctx, larger), larger, fb, ctx.run_id,
                        sent=lrow.insert_sent if lrow else None,
                        failed=lrow.failed if lrow else None,
                        what="first failing schedule (before shrinking)",
                        max_model_len=mml)
            entry.fallback, entry.fallback_schedule = fb.name, larger.summary()
            summary.repro_larger = str(fb)
        ctx.add_table("reproducers", [entry])
        ctx.set_table("fuzz_failing", failing_rows(minimal, self.specs(ctx, minimal)))
        return repro

    @classmethod
    def markdown(cls, m) -> list[str]:
        """summary.md lines for the run's reproducers and their confirmation (table
        ``reproducers``, confirmed by :mod:`pleharness.reproduce`; [] when none)."""
        rows = ReproducerRow.rows(m, "reproducers")
        if not rows:
            return []
        out = ["", "### Reproducers", "", "| reproducer | from | schedule | confirmation |",
               "|---|---|---|---|"]
        for r in rows:
            v = r.verdict or "not confirmed (--confirm-runs 0)"
            out.append(f"| `{r.path}` | {r.source} | "
                       f"{r.schedule if 'schedule' in r.model_fields_set else ''} | {v} |")
        return out


def _keep_step(ctx: "ScenarioContext", steps: list[ShrinkStepRow], row: ExampleRow) -> None:
    """Keep the failing example ``row`` as the next shrink step (``fuzz_shrink_steps``)."""
    _keep(ctx, steps, "fuzz_shrink_steps", ShrinkStepRow(
        step=len(steps), example=row.example, phases=row.phases, requests=row.requests,
        schedule=row.schedule))


def _keep(ctx: "ScenarioContext", rows: list, table: str, row: Any) -> None:
    """Append ``row`` to ``rows`` (the fuzz run's own list) and to the manifest table ``table``
    (written at once: a long fuzz run's examples are on disk as they come)."""
    rows.append(row)
    ctx.add_table(table, [row])
