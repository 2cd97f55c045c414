"""Inserts into a running streamed decode: the trigger shared by the ``insert``, ``fuzz`` and
``replay`` scenario kinds.

A *carrier* is a streamed request; an *insert* is a request sent once the carrier has streamed
``after_tokens`` tokens (as the client sees them), so its prefill shares engine steps with the
carrier's decode (shared/DESIGN.md, "Ongoing decode + inserted prefill"). :class:`InsertTrigger`
is the ``issue`` function of :meth:`~pleharness.run.context.RunContext.run_phase`: the phase is run
with every request of it (carrier, inserts, any others) in flight at once, and the inserts' worker
threads wait for their trigger. Requests that are neither carrier nor insert are issued at once.

Triggers: the carrier's streamed token count reaching ``after_tokens`` (each insert its own), or
``after_s`` seconds after the carrier was sent when given (vLLM merges a request's pending
outputs into one chunk when its API server falls behind the engine, so the client-seen position
can lag), or the carrier ending (the insert then goes out at once and is *late*: it did not
share a step with the decode).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...evidence import mark_vacuous
from ...manifest import CheckResult

if TYPE_CHECKING:  # pragma: no cover
    from ...engine.completion import Completion
    from ...request import RequestSpec
    from ...run.scenario_context import ScenarioContext


@dataclass
class Sent:
    """When an insert went out: the carrier's client-seen token position, whether the carrier was
    still running (it had not ended and had streamed fewer than its max_tokens)."""

    position: int
    running: bool


class InsertTrigger:
    """``issue`` for run_phase: ``carrier`` (a streamed RequestSpec) and ``inserts`` (pairs of
    RequestSpec and the carrier's token count after which it is sent, >= 1).

    ``after_s``: also send an insert this many seconds after the carrier was sent (None: only the
    token count or the carrier's end). ``label`` names the carrier in the notes set on each
    insert (``inserted while the <label> ran (client-seen <label> position N)`` or ``sent after
    the <label> ended (N tokens)``). ``sent[id(spec)]``: a :class:`Sent` per insert that went
    out. Specs are told apart by identity, so equal copies can be distinct inserts.
    """

    def __init__(self, ctx: "ScenarioContext", carrier: "RequestSpec",
                 inserts: Sequence[tuple["RequestSpec", int]], *, after_s: float | None = None,
                 label: str = "carrier"):
        if not carrier.stream:
            raise ValueError("the carrier of an insert must be a streamed request")
        self.ctx = ctx
        self.carrier = carrier
        self.after = {id(s): max(1, int(n)) for s, n in inserts}
        self.after_s = after_s
        self.label = label
        self.sent: dict[int, Sent] = {}
        self._carrier_sent = threading.Event()
        self._done = threading.Event()
        self._t_sent = 0.0
        self._pos = 0
        self._lock = threading.Lock()
        self._waiting: list[tuple[int, threading.Event]] = []  # (after_tokens, event)

    def _on_token(self, n: int) -> None:
        with self._lock:
            self._pos = n
            for need, ev in self._waiting:
                if n >= need:
                    ev.set()

    def issue(self, spec: "RequestSpec") -> "Completion":
        if spec is self.carrier:
            self._t_sent = time.monotonic()
            self._carrier_sent.set()
            try:
                return self.ctx.issue(spec, on_token=self._on_token)
            finally:
                with self._lock:
                    self._done.set()
                    for _, ev in self._waiting:
                        ev.set()
        need = self.after.get(id(spec))
        if need is None:
            return self.ctx.issue(spec)
        total = self.ctx.client.timeouts.total_s
        self._carrier_sent.wait(timeout=total)
        ev = threading.Event()
        with self._lock:
            if self._pos >= need or self._done.is_set():
                ev.set()
            self._waiting.append((need, ev))
        wait = total if self.after_s is None else \
            max(0.0, self._t_sent + self.after_s - time.monotonic())
        ev.wait(timeout=wait)
        with self._lock:
            at = self._pos
            running = not self._done.is_set() and at < self.carrier.max_tokens
        self.sent[id(spec)] = Sent(at, running)
        what = (f"inserted while the {self.label} ran (client-seen {self.label} position {at})"
                if running else f"sent after the {self.label} ended ({at} tokens)")
        spec.note = f"{spec.note}; {what}" if spec.note else what
        return self.ctx.issue(spec)

    def late(self, specs: Sequence["RequestSpec"]) -> list["RequestSpec"]:
        """The inserts among ``specs`` that went out after the carrier had ended."""
        return [s for s in specs if id(s) in self.sent and not self.sent[id(s)].running]

    def not_landed(self, outcomes: Sequence) -> list:
        """The outcomes (of this trigger's phase) of the inserts not shown to have reached the
        engine while the carrier ran: sent after it ended, or whose first token (streamed; its
        whole answer when not streamed) arrived after the carrier's last one. Sent while the
        carrier ran is not enough: the carrier can end before the insert's request reaches the
        engine (a loaded host: the client sends it late, the engine is fast). Client clocks:
        ``started_at`` + ``ttft_s`` / ``latency_s`` of each Completion."""
        car = next((o.completion for o in outcomes if o.spec is self.carrier), None)
        if car is None or car.started_at is None or car.latency_s is None:
            return [o for o in outcomes if id(o.spec) in self.sent]
        end = car.started_at + car.latency_s
        out = []
        for o in outcomes:
            sent = self.sent.get(id(o.spec))
            if sent is None:
                continue
            c = o.completion
            first = c.ttft_s if c.streamed and c.ttft_s is not None else c.latency_s
            if not sent.running or c.started_at is None or first is None \
                    or c.started_at + first >= end:
                out.append(o)
        return out


def landing_check(ctx: "ScenarioContext", trig: "InsertTrigger | None", outcomes) -> None:
    """Phase check ``inserts_landed`` on the phase of ``outcomes`` (a PhaseResult of
    :func:`run_phase_with_inserts`): pass when every insert reached the engine while the carrier
    ran (:meth:`InsertTrigger.not_landed`), else warn and mark the phase vacuous (it did not
    exercise a prefill inserted into a running decode; a replay that passes so is inconclusive,
    not a failure to reproduce: :mod:`pleharness.reproduce`). Nothing without inserts or a
    phase record."""
    if trig is None or not outcomes or outcomes.phase is None:
        return
    bad = trig.not_landed(outcomes)
    n = sum(1 for o in outcomes if id(o.spec) in trig.sent)
    if not bad:
        ctx.add_phase_check(outcomes.phase, CheckResult(
            name="inserts_landed", status="pass",
            detail=f"{n} insert(s): each first token before the carrier's last"))
        return
    why = (f"{len(bad)} of {n} insert(s) did not reach the engine while the carrier ran "
           f"(first token after the carrier's last, client-seen): "
           f"{', '.join(o.record.id for o in bad)}")
    ctx.add_phase_check(outcomes.phase, CheckResult(name="inserts_landed", status="warn",
                                                    detail=why))
    mark_vacuous(ctx, outcomes.phase, why)


def run_phase_with_inserts(ctx: "ScenarioContext", name: str, concurrency: int,
                           specs: Sequence["RequestSpec"], carrier: "RequestSpec | None" = None,
                           inserts: Sequence[tuple["RequestSpec", int]] = (),
                           label: str = "carrier") -> tuple[list, InsertTrigger | None]:
    """Run one phase: ``specs`` (the carrier among them) issued together at ``concurrency``, and
    each insert (RequestSpec, after_tokens) sent once ``carrier`` has streamed that many tokens
    (``concurrency + len(inserts)`` workers, so the waiting inserts never hold a slot of the
    others). Without a carrier the inserts are ordinary requests of the phase. Returns the
    outcomes (specs first, then the inserts) and the trigger (None without inserts)."""
    ins = [s for s, _ in inserts]
    if carrier is None or not ins:
        return ctx.run_phase(name, concurrency, list(specs) + ins), None
    trig = InsertTrigger(ctx, carrier, inserts, label=label)
    return ctx.run_phase(name, concurrency + len(ins), list(specs) + ins, issue=trig.issue), trig
