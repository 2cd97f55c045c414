"""explain's reporting room: the report (:class:`ExplainReport`, written as ``explain.json``
through :class:`~pleharness.manifest.explain.ExplainResult`), its cases,
the reproducers (``repro-N.toml``) and the rewriting of explain.json / explain.md as explain
goes (:class:`ExplainProgress`). The renderings themselves are in
:mod:`pleharness.render.explain`."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..jobrecord import JobRecord
from ..manifest import write_atomic
from ..manifest.explain import CaseReport, ExplainResult, SuspectRecord
from ..render.explain import to_markdown
from ..timeline import Timeline
from .suspects import Case, Suspect, narrow_down, suspect_label


def write_repro(case: Case, path: Path, run_id: str) -> None:
    """The case's minimal failing level as a ``replay`` scenario file, with the comparisons that
    failed there (``[[params.failed]]``: which request, compared with that engine's own warm
    single-request reference, first divergent position; :mod:`pleharness.scenarios.replay`)."""
    name = case.minimal or "with its phase companions"
    conc, reqs = case.levels.get(name) or case.levels["alone"]
    phase = f"case{case.index}-{name.replace(' ', '-')}"
    conc = min(conc, len(reqs))  # a phase never has more in flight than it has requests
    lines = [f"# ple-harness explain {run_id}, case {case.index}: {case.phase} (C{case.concurrency}),"
             f" requests {', '.join(case.requests)}",
             f"# minimal failing level: {name}. Replay: ple-harness stress --scenario {path.name} "
             "(with the run's engine arguments)"]
    if case.repeat > 1:  # issue 47 item 5: an intermittent failure, repeated to show with 95 %
        lines.append(f"# intermittent: {100 * case.rate:.0f} % of the run's alike runs failed; "
                     f"the level runs {case.repeat} times, so that one replay shows it with >= "
                     "95 %")
    lines += ['kind = "replay"', f'description = "explain case {case.index}: {name}"']
    for t in range(1, case.repeat + 1):
        lines += ["", "[[params.phases]]",
                  f'name = "{phase}"' if case.repeat == 1 else f'name = "{phase}-run{t}"',
                  f"concurrency = {conc}"]
        for ids, mt in reqs:
            lines += ["", "[[params.phases.requests]]", f"prompt = {json.dumps(ids)}",
                      f"max_tokens = {mt}"]
            if case.expected:  # a differential case: the control's answer (issue 47)
                e = case.expected
                lines += ["", "[params.phases.requests.expected]",
                          f"ids = {json.dumps(list(e['output_ids']))}",
                          f"source = {json.dumps('the explained run ' + str(e.get('run')))}"]
                if e.get("threshold_nats") is not None:
                    lines.append(f"threshold_nats = {float(e['threshold_nats'])!r}")
                if e.get("margins"):  # TOML has no null: nan stands for "unknown"
                    lines.append("margins = [" + ", ".join(
                        "nan" if m is None else repr(float(m)) for m in e["margins"]) + "]")
    lines += _failed_lines(case, name, phase if case.repeat == 1 else f"{phase}-run1", reqs)
    write_atomic(path, "\n".join(lines) + "\n")


def _failed_lines(case: Case, level: str, phase: str, reqs: list) -> list[str]:
    """``[[params.failed]]`` entries for a case's reproducer: the divergent requests of its
    minimal level on the configuration under test (each against that engine's warm solo
    reference: its 2nd solo run), else the run's own first divergence."""
    seen = (case.baseline.get(level) or {}).get("divergent") or []
    out: list[str] = []
    lens = [len(ids) for ids, _ in reqs]
    for d in seen[:8]:
        j = lens.index(d["prompt_len"]) if d.get("prompt_len") in lens else None
        out += ["", "[[params.failed]]", f'phase = "{phase}"']
        if j is not None:
            out.append(f"request = {j}")
        out += [f"prompt_len = {int(d['prompt_len'])}", 'run = "load (explain replay, try '
                f'{int(d.get("try") or 1)})"',
                'compared_with = "its warm single-request reference on the same engine (2nd '
                'solo run; the cold 1st run discarded)"']
        if d.get("first_divergence") is not None:
            out.append(f"first_divergence = {int(d['first_divergence'])}")
    if not seen:
        out += ["", "[[params.failed]]", f'phase = "{phase}"',
                f'run = "load ({case.phase}, C{case.concurrency}, requests '
                f'{", ".join(case.requests[:4])} of the explained run)"',
                'compared_with = "its single-request reference in the explained run"']
        if case.first_divergence is not None:
            out.append(f"first_divergence = {int(case.first_divergence)}")
    return out


def case_report(c: Case, suspects: Sequence[Suspect], repro: str) -> CaseReport:
    """The report of a finished :class:`Case`, diagnosed against ``suspects``."""
    return CaseReport(case=c.index, prompt_hash=c.prompt_hash, concurrency=c.concurrency,
                      phase=c.phase, requests=c.requests, first_divergence=c.first_divergence,
                      prompt_len=c.prompt_len, minimal_case=c.minimal, baseline=c.baseline,
                      controls=c.results, narrowing=narrow_down(c, suspects),
                      attribution=c.attribution(suspects), repro=repro)


@dataclass
class ExplainReport:
    """What ``ple-harness explain`` found, written as ``RUN/explain/explain.json``
    (:meth:`to_dict`).

    ``tries``: attempts per replay; ``budget_s``: the time cap (seconds); ``suspects``: every
    configuration tried besides the one under test, first round then second, in launch order;
    ``launches``: one dict per configuration, ``config`` (its label) with ``command`` (redacted
    argv) and ``ready_s`` (seconds), or ``skipped`` ("budget", "implied: ...", "not tested
    yet"), or ``error`` and ``root_cause``; ``elapsed_s``: seconds from the first launch to the
    end (None when nothing failed, absent from the JSON then); ``status``: "complete", or how
    far it got ("launch 2 of 4 done", "interrupted (...) after 2 launch(es)");
    ``side_by_side``: :meth:`pleharness.engine.side_by_side.SideBySide.record`; ``estimate``:
    :func:`pleharness.explain_plan.estimate`; ``golden``: the golden model the replays are
    judged with (the run's, :class:`~pleharness.explain.replay.RunGolden`), or why there is none;
    ``timeline``: :class:`pleharness.timeline.Timeline` (the diagnosis, the reproducer, the first
    confirmed reproducer, the engine starts); ``job``: the job's record
    (:class:`~pleharness.jobrecord.JobRecord`: status in the one vocabulary of every job, exit
    code, reason, root cause, times, the steps plan, launches, confirmation), None for a report
    made outside the job.
    """

    run_id: str
    tries: int
    budget_s: float
    cases: list[CaseReport] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    launches: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float | None = None
    include_warnings: bool = False  # replays count near ties too (--include-warnings); not in the JSON
    status: str = "starting"
    side_by_side: dict[str, Any] = field(default_factory=dict)
    estimate: dict[str, Any] = field(default_factory=dict)
    golden: str = ""  # the golden model the replays are judged with (the run's), or why none
    timeline: Timeline = field(default_factory=Timeline)  # diagnosis, confirmed after N s
    job: JobRecord | None = None  # the job's record (pleharness.jobrecord), while explain runs

    def result(self) -> ExplainResult:
        """The report as written (:class:`~pleharness.manifest.explain.ExplainResult`), what
        the renderings read."""
        return ExplainResult(run_id=self.run_id, status=self.status, tries=self.tries,
                             budget_s=self.budget_s, estimate=self.estimate,
                             side_by_side=self.side_by_side, golden=self.golden,
                             cases=self.cases,
                             suspects=[SuspectRecord(**asdict(x)) for x in self.suspects],
                             launches=self.launches, elapsed_s=self.elapsed_s,
                             timeline=self.timeline, job=self.job)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``explain.json``."""
        return self.result().model_dump()

    def to_json(self) -> str:
        """``explain.json``'s text."""
        return json.dumps(self.to_dict(), indent=1)


class ExplainProgress:
    """Writes explain.json and explain.md as explain goes (issue 33: a stopped explain keeps what
    it learned). Before the diagnosis is final, the cases are reported from their working
    state, with every configuration not reached yet ``{"skipped": "not tested yet"}`` in their
    controls and in the launches."""

    def __init__(self, report: "ExplainReport", cases: list[Case], out_dir: Path, run_dir: Path):
        self.report, self.cases, self.out_dir, self.run_dir = report, cases, out_dir, run_dir
        self.pending: list[Suspect | None] = []

    def save(self, status: str) -> None:
        """Rewrite explain.json and explain.md now, with ``status``."""
        rep = self.report
        rep.status = status
        shown = rep
        if not rep.cases:  # still launching: the working state, the rest not tested yet
            todo = [s for s in self.pending if s is not None]
            not_yet = {"skipped": "not tested yet"}
            cases = []
            for c in self.cases:
                path = self.out_dir / f"repro-{c.index}.toml"
                cr = case_report(c, rep.suspects, str(path.relative_to(self.run_dir))
                                 if path.exists() else "")
                cr.controls = {**c.results, **{s.name: dict(not_yet) for s in todo
                                               if s.name not in c.results}}
                cases.append(cr)
            seen = {la["config"] for la in rep.launches}
            launches = [*rep.launches, *({"config": suspect_label(s), "skipped": "not tested yet"}
                                         for s in self.pending if suspect_label(s) not in seen)]
            shown = replace(rep, cases=cases, launches=launches)
        write_atomic(self.out_dir / "explain.json", shown.to_json())
        write_atomic(self.out_dir / "explain.md", to_markdown(shown.result()))
