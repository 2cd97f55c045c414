"""explain's launching room: the engines of the configuration under test and of each suspect,
started (side by side where planned) in an engine session, and the replays of the cases on them,
judged by the explained run's own rule and golden model."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..divergence import margins
from ..engine.client import EngineClient
from ..engine.session import EngineSession, Target
from ..engine.side_by_side import SideBySide, run_side_by_side
from ..errors import EngineError
from ..explain_plan import implied_by
from ..golden import GoldenError, GoldenModel, golden_problem
from ..manifest import Manifest
from ..parity import token_hash
from ..redact import redact_argv
from ..run.judge import Rule, compare_outputs
from .report import ExplainProgress, ExplainReport, write_repro
from .suspects import (Case, Suspect, follow_ups, manifest_facts, narrow_down, rederive_length,
                       resize_prompt, suspect_label)


class RunGolden:
    """The explained run's golden model, used as the run's judge used it, so that a replay
    fails exactly where the run did. Seen on the H200 (docs/gpu-runs/2026-12-03-o-issue33): on a
    random-weight bf16 model, a planted fault at a position whose engine margin was 0.004 nats
    was hard by the golden model in the run, while explain's replays, judged by the engine
    margin alone, called the same divergence a near tie: "not reproduced on the configuration
    under test" beside its own reproducer confirmed 3/3 on fresh engines.

    ``floor``: the run's measured half-precision golden floor (``run_options.golden_tolerance``);
    ``error``: why the golden model stopped being asked (the engine margin decides then, as in
    the run). The worker starts on the first divergence (:class:`pleharness.golden.GoldenModel`)."""

    def __init__(self, model: Any, floor: dict[str, Any] | None):
        self.model, self.floor = model, floor
        self.error: str | None = None

    @classmethod
    def of_run(cls, m: Manifest, target: Target, out_dir: Path) -> tuple["RunGolden | None", str]:
        """The run's golden model (its folder from ``run_options.golden_model``, else the
        launched model; the engine's Python), or None where the run had none; and what
        explain.json says about it."""
        ro = m.run_options
        used = str(ro.golden_classifier or "")
        if ro.golden is False or not used.startswith("transformers"):
            return None, f"none (the run's golden classifier: {used or 'not recorded'})"
        model_dir = ro.golden_model or target.model_path
        problem = golden_problem(model_dir)
        if problem:
            return None, f"unavailable: {problem}"
        return (cls(GoldenModel(model_dir, target.python, log_path=out_dir / "golden.log"),
                    ro.golden_tolerance),
                f"the run's: transformers float32 on {model_dir}")

    def evidence(self, prompt: Sequence[int], reference: Sequence[int],
                 observed: Sequence[int]) -> Any:
        """``golden_at`` for :func:`pleharness.divergence.compare_outputs`: the teacher-forced
        golden logprobs of both tokens at a divergent position, or None."""

        def at(pos: int) -> dict[str, Any] | None:
            if self.error is not None or pos >= min(len(reference), len(observed)):
                return None
            try:
                lps, top = self.model.score(list(prompt), list(observed[:pos]),
                                            [reference[pos], observed[pos]])
            except GoldenError as exc:
                self.error = str(exc)
                return None
            return {"logprobs": lps, "top": top}
        return at

    def close(self) -> None:
        self.model.close()


class _Replayer:
    """Runs case levels on one engine and judges them against that engine's own warm solo
    references (cached per prompt) by the run's own rule (:func:`pleharness.run.judge.
    compare_outputs`: the near-tie threshold, ``--strict`` and logprobs the run used, from its
    ``run_options``), so a replay fails exactly where the run it explains would: a hard
    divergence fails, a near tie only when ``count_warnings`` (``--include-warnings``). With
    ``golden`` (:class:`RunGolden`), its golden model and measured half-precision floor weigh
    in exactly as they did in the run (:func:`pleharness.divergence.settle`)."""

    def __init__(self, client: EngineClient, rule: Rule = Rule(), logprobs: int | None = 2,
                 count_warnings: bool = False, golden: "RunGolden | None" = None):
        self.client = client
        self.rule = rule
        self.logprobs = logprobs
        self.count_warnings = count_warnings
        self.golden = golden
        self.refs: dict[tuple[str, int], tuple[list[int], list | None]] = {}

    @classmethod
    def for_run(cls, client: EngineClient, m: Manifest, count_warnings: bool,
                golden: "RunGolden | None" = None) -> "_Replayer":
        """The replayer of run ``m``: its near-tie threshold, strictness, logprobs, serving
        dtype, and (``golden``) its golden model and measured golden floor."""
        ro = m.run_options
        rule = Rule.of_run(ro)
        logprobs = ro.logprobs if "logprobs" in ro.model_fields_set else 2
        return cls(client, rule, logprobs or None, count_warnings, golden)

    def _solo(self, ids: list[int], mt: int) -> tuple[list[int], list | None]:
        key = (token_hash(ids), mt)
        if key not in self.refs:
            self.client.complete(ids, mt, logprobs=self.logprobs)  # cold run: discarded
            c = self.client.complete(ids, mt, logprobs=self.logprobs)
            if c.error:
                raise EngineError(f"reference request failed: {c.error}: {c.error_detail}")
            self.refs[key] = (list(c.token_ids), margins(c.logprobs))
        return self.refs[key]

    def run(self, level: tuple[int, list[tuple[list[int], int]]], tries: int,
            expected: dict[str, Any] | None = None) -> dict[str, Any]:
        """Replay ``level`` (concurrency, [(prompt IDs, max_tokens)]) up to ``tries`` times,
        until a try fails. Returns {"fails", "tries", "divergent": up to 8 failing comparisons
        (try, prompt_len, first_divergence, class, output and reference hashes)}. With
        ``expected`` (a differential case's control answer: ``output_ids``, ``margins``), a
        one-request level is judged against that answer instead of this engine's own solo
        reference."""
        conc, reqs = level
        refs = ([(list(expected["output_ids"]), expected.get("margins"))] if expected
                else [self._solo(ids, mt) for ids, mt in reqs])
        rule = expected_rule(self.rule, expected)
        seen = []
        for t in range(1, tries + 1):
            async def one(r, cl=self.client, lp=self.logprobs):
                return await cl.acomplete(r[0], r[1], logprobs=lp)
            # the client's batch path: exactly ``conc`` in flight on its event loop
            outs = self.client.run_batch(reqs, conc, one).wait()
            for (ids, _), (ref, ref_margins), c in zip(reqs, refs, outs):
                if c.error is not None:
                    continue
                d = compare_outputs(
                    ref, c.token_ids, rule, ref_margins,
                    golden_at=self.golden.evidence(ids, ref, c.token_ids) if self.golden else None,
                    golden_floor=self.golden.floor if self.golden else None)
                if d is not None and (d.fails or self.count_warnings):
                    seen.append({"try": t, "prompt_len": len(ids),
                                 "first_divergence": d.position, "class": d.cls,
                                 "decided_by": d.decided_by,
                                 "output_hash": token_hash(c.token_ids)[:16],
                                 "reference_hash": token_hash(ref)[:16]})
            if seen:
                break
        return {"fails": bool(seen), "tries": t, "divergent": seen[:8]}


def expected_rule(rule: Rule, expected: dict[str, Any] | None) -> Rule:
    """The rule a differential case's replays are judged by: ``rule`` with its near-tie
    threshold raised to the one that judged the difference in the run (``threshold_nats`` of
    the control's answer: the run's envelope between the two configurations,
    :mod:`pleharness.differential`), so a replay calls hard only what the run could; ``rule``
    itself for any other case."""
    t = (expected or {}).get("threshold_nats")
    if t is None or t <= rule.near_tie_nats:
        return rule
    return replace(rule, near_tie_nats=float(t))


def _applies(sus: Suspect, case: Case, first: Sequence[Suspect]) -> bool:
    """Whether ``case`` is replayed on ``sus``'s engine: every first-round suspect for a case that
    reproduced; a 2x2 cell for a case that needs both of its suspects; a numeric variant for a case
    that needs its feature, unless it is a differential case (its control answer is for its own
    prompt: a re-derived length has none to be judged against)."""
    if case.minimal is None:
        return False
    if not (sus.setting or sus.combines):
        return True
    if sus.setting and case.expected:  # the control's answer is for this length only
        return False
    n = narrow_down(case, first)
    if sus.combines:
        return set(sus.combines) <= {k["suspect"] for k in n["conditions"]}
    return sus.feature in {k["feature"] for k in n["conditions"]}


def _replay_suspect(rp: "_Replayer", sus: Suspect, c: Case, m: Manifest,
                    tries: int) -> dict[str, Any]:
    """The case's minimal level on ``sus``'s engine; for a numeric variant also with the case's
    prompt resized to its boundary length re-derived for the new value (:func:`rederive_length`).
    ``vanishes``: it fails at neither length."""
    level = c.levels[c.minimal]
    res = rp.run(level, tries, c.expected)
    out = {**res, "vanishes": not res["fails"]}
    if not sus.setting or c.prompt_len is None:
        return out
    new = rederive_length(manifest_facts(m), c.prompt_len, sus.setting["fact"], sus.setting["to"])
    out.update(length=c.prompt_len, new_length=c.prompt_len if new is None else new[0],
               formula=None if new is None else new[1])
    if new is None or new[0] == c.prompt_len:
        out["fails_at_new_length"] = res["fails"]
        return out
    ids = m.prompts[c.prompt_hash]
    conc, reqs = level
    resized = (conc, [(resize_prompt(q, new[0]) if q == ids else q, mt) for q, mt in reqs])
    r2 = rp.run(resized, tries)  # another prompt: no control answer, its own reference
    out.update(at_new_length=r2, fails_at_new_length=r2["fails"],
               vanishes=not res["fails"] and not r2["fails"])
    return out


def replay_all(session: EngineSession, target: Target, m: Manifest, cases: list[Case],
               report: ExplainReport, budget_s: float, t0: float, console: Console,
               progress: "ExplainProgress", side: SideBySide,
               golden: RunGolden | None = None) -> list[Suspect | None]:
    """Every configuration in turn (under test, the first round's suspects, then the second
    round's, :func:`follow_ups`), each on its own engine in ``session``, ``side.n`` engines
    started side by side (never across the two rounds); the cases that apply to it replayed
    there, one engine after another, the configuration under test first. A broader suspect
    whose narrower one already removed every case is skipped as implied
    (:func:`pleharness.explain_plan.implied_by`). Progress is saved after every launch.
    Returns the configurations (None: under test)."""
    suspects = list(report.suspects)
    configs: list[Suspect | None] = [None, *suspects]
    first_round = len(configs)
    n = 0
    second = False
    while True:
        if n >= len(configs):
            if second:
                break
            second = True  # the second round: 2x2 cells and numeric settings
            more = follow_ups(m, suspects, cases)
            report.suspects += more
            configs += more
            if more:
                console.print(f"second round: {len(more)} more launch(es): "
                              + ", ".join(s.name for s in more), highlight=False)
            if n >= len(configs):
                break
        end = first_round if n < first_round else len(configs)
        batch: list[tuple[int, Suspect | None]] = []
        while n < end and len(batch) < side.n:
            sus = configs[n]
            n += 1
            if sus is not None and not batch:  # decided on what the replays so far showed
                todo = [c for c in cases if _applies(sus, c, suspects)]
                if not todo:
                    continue
                imp = implied_by(sus, todo, suspects)
                if imp is not None:
                    why = f"implied: {imp.change} already removes it"
                    report.launches.append({"config": suspect_label(sus), "skipped": why})
                    for c in todo:
                        c.results[sus.name] = {"skipped": why}
                    continue
            if time.monotonic() - t0 > budget_s:
                report.launches.append({"config": suspect_label(sus), "skipped": "budget"})
                for c in cases:
                    if sus is not None and _applies(sus, c, suspects):
                        c.results[sus.name] = {"skipped": "budget"}
                continue
            batch.append((n, sus))
        if not batch:
            continue
        progress.pending = [sus for _, sus in batch] + configs[n:]  # until each is recorded
        _replay_batch(session, target, batch, len(configs), cases, suspects, m, report,
                      console, side, golden)
        if any(sus is None for _, sus in batch):  # the reproducers exist from then on
            for c in cases:
                write_repro(c, progress.out_dir / f"repro-{c.index}.toml", m.run_id)
            if any(c.minimal is not None for c in cases):  # one failed again: a reproducer
                report.timeline.mark("reproducer")
        progress.pending = configs[n:]
        progress.save(f"launch {sum(1 for la in report.launches if 'config' in la)} of "
                      f"{len(configs)} done")
    progress.pending = []
    return configs


def _replay_batch(session: EngineSession, target: Target, batch: list[tuple[int, Suspect | None]],
                  total: int, cases: list[Case], suspects: list[Suspect], m: Manifest,
                  report: ExplainReport, console: Console, side: SideBySide,
                  golden: RunGolden | None = None) -> None:
    """Start the engines of ``batch`` ((launch number, suspect)) side by side, then replay on
    each in order and stop it. A suspect's engine that fails to start is recorded (the launch
    and each case's result); the configuration under test failing raises EngineError."""
    for i, sus in batch:
        console.print(f"[{i}/{total}] launching the engine {escape(suspect_label(sus))} ...",
                      highlight=False)

    def starter(i: int, sus: Suspect | None):
        spec = target.launch_spec() if sus is None else sus.variant.spec(target)
        if side.add:
            spec = replace(spec, engine_args=[*spec.engine_args, *side.add])
        return lambda: session.start(target, spec=spec, log_name=f"engine-{i - 1}", gather=False)

    started = run_side_by_side([starter(i, sus) for i, sus in batch], side.n)
    for (i, sus), eng in zip(batch, started):
        label = suspect_label(sus)
        if isinstance(eng, BaseException):
            if sus is None or not isinstance(eng, EngineError):
                session.stop_all()
                raise eng
            report.launches.append({"config": label, "error": str(eng.args[0]),
                                    "root_cause": eng.root_cause})
            for c in cases:
                if _applies(sus, c, suspects):
                    c.results[sus.name] = {"error": str(eng.args[0])}
            continue
        try:
            todo = [c for c in cases if sus is None or _applies(sus, c, suspects)]
            rp = _Replayer.for_run(eng.client, m, report.include_warnings, golden)
            report.launches.append({"config": label, "command": redact_argv(eng.server.command),
                                    "ready_s": round(eng.server.ready_s or 0, 3)})
            for c in todo:
                if sus is None:
                    for name, level in c.levels.items():
                        # an intermittent failure: as many tries as show it with 95 %
                        res = rp.run(level, max(report.tries, c.repeat), c.expected)
                        c.baseline[name] = res
                        if res["fails"]:
                            c.minimal = name
                            break
                else:
                    c.results[sus.name] = _replay_suspect(rp, sus, c, m,
                                                          max(report.tries, c.repeat))
        finally:
            session.stop(eng)
