"""Running one phase of a run context (:meth:`pleharness.run.context.RunContext.run_phase`):
sending its requests while a watchdog polls the engine, recording and judging each finished
request, the phase's evidence and checks, what an interrupted phase keeps, and the errors raised
after it (engine died, ``--on-timeout abort``). The functions take the run context ``ctx``."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import evidence
from ..checks import DEFAULT_PHASE_CHECKS, PHASE_REGISTRY
from ..engine import metrics
from ..engine.client import Completion
from ..errors import EngineError, RequestTimeoutAbort
from ..manifest import PhaseRecord, RequestRecord, now_iso
from ..parity import token_hash
from ..request import Outcome, RequestSpec
from . import api, choices
from .judge import finish_phase


class PhaseResult(list):
    """What :meth:`pleharness.run.context.RunContext.run_phase` returns: the phase's outcomes (a
    list of :class:`~pleharness.request.Outcome`, in the order of the specs) and ``phase``, its
    :class:`~pleharness.manifest.PhaseRecord` (recorded, judged and written already; None
    when no phase was run: the collect-only pass of the reference engine)."""

    def __init__(self, outcomes: Iterable[Outcome] = (), phase: PhaseRecord | None = None):
        super().__init__(outcomes)
        self.phase = phase


class Watchdog:
    """Polls the engine while a phase runs (every ``interval_s``): the launched process must be
    alive and /health must answer 200. Two failed polls in a row mark the engine dead and cut off
    every request in flight, so a dead engine is noticed within a few seconds instead of after
    the request timeouts."""

    def __init__(self, ctx, interval_s: float = 2.0):
        self.ctx = ctx
        self.interval_s = interval_s
        self.dead: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ple-watchdog")
        self._thread.start()

    def _run(self) -> None:
        misses = 0
        while not self._stop.wait(self.interval_s):
            srv = self.ctx.server
            if srv is not None and not srv.alive():
                self.dead = f"engine process exited (code {srv.proc.poll()})"
            elif not self.ctx.client.health(timeout=min(5.0, self.interval_s * 2)):
                misses += 1
                if misses >= 2:
                    self.dead = "/health stopped answering 200"
            else:
                misses = 0
            if self.dead:
                self.ctx.client.abort_all(self.dead)
                return

    def stop(self) -> None:
        """Stop polling (joins the thread)."""
        self._stop.set()
        self._thread.join(timeout=10)


def run(ctx, name: str, concurrency: int, specs: Sequence[RequestSpec], *,
        counts_for_throughput: bool, role: str,
        issue: Callable[[RequestSpec], Completion] | None,
        on_outcome: Callable[[Outcome], None] | None, together: bool) -> PhaseResult:
    """Run phase ``name`` (its prefix already added) of ``specs`` on run context ``ctx``: the
    work of :meth:`pleharness.run.context.RunContext.run_phase` (see there) once its arguments
    are checked and the phase is to be run."""
    own = len(specs)
    specs, ctx.sender.route, on_outcome = api.begin_phase(
        ctx.manifest.summary, ctx.scenario_name, specs, ctx.sender.mode(specs, role),
        load=role == "load", batched=together, on_outcome=on_outcome)
    # the default request path runs on the client's event loop (no thread per request);
    # a custom ``issue`` (which may block) runs in a pool of ``concurrency`` threads
    job = ctx.sender.aissue if issue is None else issue
    items: Sequence[Any] = specs
    groups = None  # requests for several choices (issue 35 item 2): spec indices per request
    if together:
        job, items = ctx.sender.together(name, specs, concurrency, issue), [specs]
    elif choices.has_choices(specs):
        groups, job = choices.plan(name, specs, issue, ctx.sender.aissue, ctx.sender.args,
                                   ctx.client)
        items = [[specs[i] for i in g] for g in groups]
    ph = PhaseRecord(index=len(ctx.manifest.phases), name=name, scenario=ctx.scenario_name,
                     repeat=ctx.repeat_index,
                     concurrency=concurrency, requests=len(specs),
                     counts_for_throughput=counts_for_throughput and role == "load",
                     role=role, started_at=now_iso())
    ctx.manifest.phases.append(ph)
    task = None
    if ctx.progress is not None:
        task = ctx.progress.add_task(f"{ctx.scenario_name}: {name} (C{concurrency})",
                                     total=len(specs))

    def done(_i: int) -> None:
        if task is not None:
            ctx.progress.advance(task, len(specs) if together
                                 else len(groups[_i]) if groups else 1)

    before = metrics.snapshot(ctx.client)
    t0 = time.monotonic()
    batch = ctx.client.run_batch(items, 1 if together else concurrency, job, on_done=done)
    watchdog = Watchdog(ctx)
    try:
        completions = batch.wait()
        if together:
            completions = completions[0]
        elif groups is not None:
            completions = choices.ungroup(groups, completions, len(specs))
    except BaseException:
        interrupted(ctx, ph, specs, batch, t0, task, together, groups)
        raise
    finally:
        watchdog.stop()
        route, ctx.sender.route = ctx.sender.route, {}
    ph.wall_s = time.monotonic() - t0
    ph.ended_at = now_iso()
    if task is not None:
        ctx.progress.remove_task(task)
    outcomes = PhaseResult([Outcome(s, c, ctx.record_request(ph, route.get(id(s), s), c))
                            for s, c in zip(specs, completions)], ph)
    close_phase(ctx, ph, outcomes, before, on_outcome)
    after_phase(ctx, ph, outcomes, watchdog)
    return PhaseResult(outcomes[:own], ph) if len(outcomes) > own else outcomes


def interrupted(ctx, ph: PhaseRecord, specs: Sequence[RequestSpec], batch, t0: float,
                task, together: bool = False, groups=None) -> None:
    """Interrupted: keep (record and compare) the requests that had finished, abandon the
    ones in flight; the phase is "interrupted" (or "not_run" when none had finished)."""
    if together:  # one item: the list of every spec's completion, or nothing
        finished = [x for _, cs in batch.finished() for x in zip(specs, cs)]
    elif groups is not None:  # an item per request: its choices' completions
        finished = [(specs[j], c) for g, cs in batch.finished() for j, c in zip(groups[g], cs)]
    else:
        finished = [(specs[i], c) for i, c in batch.finished()]
    finished = [(ctx.sender.route.get(id(s), s), c) for s, c in finished]
    batch.cancel()  # start no further request
    ctx.client.abort_all("harness interrupted")
    ph.wall_s = time.monotonic() - t0
    if finished:
        finish_phase(ph, [ctx.record_request(ph, s, c) for s, c in finished])
    ph.status = "interrupted" if finished else "not_run"
    ph.reason = (f"interrupted after {len(finished)} of {len(specs)} requests finished"
                 + (f" ({ph.reason})" if finished and ph.reason else ""))
    ph.ended_at = now_iso()
    if task is not None:
        ctx.progress.remove_task(task)
    ctx.save()


def close_phase(ctx, ph: PhaseRecord, outcomes: PhaseResult, before,
                on_outcome: Callable[[Outcome], None] | None) -> None:
    """Evidence, the scenario's per-request hook, phase checks, the phase's verdict; the
    manifest is written."""
    ph.engaged = evidence.phase_evidence(before, metrics.snapshot(ctx.client),
                                         [o.completion for o in outcomes],
                                         [len(o.spec.prompt) for o in outcomes],
                                         ctx.facts.max_num_batched_tokens)
    if on_outcome is not None:
        for o in outcomes:
            on_outcome(o)
    # kept for `ple-harness explain`: a phase where an output diverged, and every solo
    # reference (the control's answers are compared with them after the suite: issue 47)
    if ph.role == "reference" or any(o.record.match is False for o in outcomes):
        for o in outcomes:
            ctx.manifest.prompts.setdefault(o.spec.prompt.hash, list(o.spec.prompt.ids))
    for name in DEFAULT_PHASE_CHECKS:
        ph.checks.append(PHASE_REGISTRY[name](ctx.checks_view, ph))
    finish_phase(ph, [o.record for o in outcomes])
    peak = ph.engaged.get("in_flight_peak")
    if ph.role == "load" and ph.concurrency > 1 and len(outcomes) > 1 and peak == 1:
        evidence.mark_vacuous(ctx, ph, f"C{ph.concurrency} phase: at most 1 of its requests "
                              "was in flight at any time (each ended before the next began)")
    ctx.save()


def after_phase(ctx, ph: PhaseRecord, outcomes: PhaseResult, watchdog: Watchdog) -> None:
    """Raise when the engine died or a timeout aborts the run (the phase is written)."""
    healthy = all(c.status != "fail" for c in ph.checks if c.name == "health_after_phase")
    if watchdog.dead is not None:
        ph.reason = (ph.reason + "; " if ph.reason else "") + f"engine died: {watchdog.dead}"
        ctx.save()
        ctx.ensure_engine_alive()
        raise EngineError(f"engine died during phase {ph.name}: {watchdog.dead}",
                          ctx.server.root_cause() if ctx.server else None,
                          str(ctx.server.log_path) if ctx.server else None)
    if not healthy or any(o.completion.error in ("connection", "aborted")
                          for o in outcomes):
        ctx.ensure_engine_alive()
    if ctx.on_timeout == "abort" and any(o.completion.error == "timeout" for o in outcomes):
        raise RequestTimeoutAbort(f"phase {ph.name}: request(s) timed out and the policy is "
                                  "--on-timeout abort")


def request_record(rid: str, scenario: str, ph: PhaseRecord, spec: RequestSpec,
                   c: Completion) -> RequestRecord:
    """The record ``rid`` of ``spec``'s completion ``c`` in phase ``ph`` of ``scenario``, not
    judged yet (:meth:`pleharness.run.context.RunContext.record_request` judges it)."""
    return RequestRecord(
        id=rid, scenario=scenario, phase=ph.name,
        concurrency=ph.concurrency, prompt_key=spec.prompt.key, prompt_len=len(spec.prompt),
        prompt_hash=spec.prompt.hash, max_tokens=spec.max_tokens,
        output_hash=token_hash(c.token_ids) if c.error is None else None,
        output_len=len(c.token_ids), finish_reason=c.finish_reason,
        prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
        ttft_s=c.ttft_s, latency_s=c.latency_s, error=c.error, error_detail=c.error_detail,
        http_status=c.http_status, note=spec.note, temperature=spec.temperature,
        seed=spec.seed, stream=spec.stream, params=spec.params or None,
        api="chat" if spec.messages else None,
        top_p=spec.top_p if spec.temperature > 0 else None,
        top_k=spec.top_k if spec.temperature > 0 else None,
        n=spec.n if spec.n > 1 else None, choice=spec.choice if spec.n > 1 else None,
        error_expected=bool(spec.accept_4xx and c.error == "http" and c.http_status is not None
                            and 400 <= c.http_status < 500)
                            or (c.error == "abandoned" and spec.abandon_after_tokens
                                is not None))
