"""One example of the ``fuzz`` kind: a drawn :class:`~.strategy.Schedule` made requests (its
prompts built once per run and cached) and run on the engine, references first, then phase by
phase with the carriers' inserts; the example's ``fuzz_examples`` row, with the failed
comparisons the reproducer names. :class:`FuzzExamples` is the part of the kind that runs one
example; the runner around it (search, shrink, confirm) is :mod:`.runner`."""
from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...prompts import Prompt, seeded_prompts
from ...request import RequestSpec
from ..fuzz_features import NONE, apply, base_spec, gate, messages_prompt
from ..shared.chat import ChatParams, chat_builder
from ..shared.inserting import run_phase_with_inserts
from .rows import ExampleRow
from .strategy import FuzzParams, FuzzRequest, PhaseSpecs, Schedule, Space, build_space

if TYPE_CHECKING:  # pragma: no cover
    from ...run.scenario_context import ScenarioContext

INSTRUCTION = "Reply with OK."


class Abort(BaseException):
    """Carries an engine error / interrupt through hypothesis (which would shrink an Exception)."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class FuzzExamples:
    """Running one example of the ``fuzz`` kind (a mixin of :class:`~.runner.Fuzz`): its prompts
    (``_prompts``, ``_messages`` and the chat template's ``_builder``, set up by
    :meth:`_prepare`), its RequestSpecs (:meth:`specs`) and its run (:meth:`run_example`)."""

    params: FuzzParams

    def _prepare(self, ctx: "ScenarioContext") -> Space:
        """The run's :class:`~.strategy.Space` (engine facts, the engine probe, the chat
        template and the constrained-output probe) with the prompt caches emptied."""
        p = self.params
        space = build_space(ctx.facts, p, ctx.engine_probe)
        self._prompts: dict[tuple, Prompt] = {}
        self._messages: dict[tuple, tuple] = {}
        if p.chat:
            self._chat_prompts(ctx, space)
        space.features, why_not = gate(ctx, space.features)  # constrained output: a probe
        space.notes += why_not
        return space

    # prompts ---------------------------------------------------------------------------------
    def _chat_prompts(self, ctx: "ScenarioContext", space: Space) -> None:
        """Chat-shaped prompts on: the chat template's builder kept and ``space.chat_min`` set
        to the template's length; without /tokenize (any error) random prompts only, said on
        the console."""
        try:
            b, why = chat_builder(ctx, ChatParams(instruction=INSTRUCTION))
            if b is None:
                raise ValueError(why)
            self._builder = b
            space.chat_min = len(self._builder.template(INSTRUCTION))
        except Exception as exc:  # noqa: BLE001 - no /tokenize: random prompts only
            ctx.console.print(f"fuzz: chat-shaped prompts off ({exc})")
            if "messages" in space.features:
                space.features = space.features - {"messages"}
                space.notes.append("features: chat-shaped requests to /v1/chat/completions "
                                   f"left out: no chat template ({str(exc)[:120]})")

    def _prompt(self, ctx: "ScenarioContext", r: FuzzRequest) -> Prompt:
        key = (r.length, r.shape, r.seed)
        p = self._prompts.get(key)
        if p is None:
            if r.shape == "messages":
                p, self._messages[key] = messages_prompt(
                    ctx.client, r.length, r.seed, f"fuzz-messages-len{r.length}-s{r.seed}", r.why)
            elif r.shape == "chat":
                p = self._builder.build(INSTRUCTION, r.length, key=f"fuzz-chat-len{r.length}",
                                        why=r.why)
            else:
                vocab = ctx.facts.vocab_or()
                h = int(hashlib.sha256(f"{r.length}/{r.seed}".encode()).hexdigest()[:8], 16)
                (raw,) = seeded_prompts(h, 1, r.length, r.length, min(16, vocab - 1), vocab)
                p = Prompt(key=f"fuzz-len{r.length}-s{r.seed}", ids=raw.ids, why=r.why)
            self._prompts[key] = p
        return p

    def _spec(self, ctx: "ScenarioContext", r: FuzzRequest, role: str = "") -> "RequestSpec":
        spec = RequestSpec(self._prompt(ctx, r), r.max_tokens, stream=r.stream,
                           note=f"fuzz {role}{r.source} {r.why}"
                                + ("" if r.stream else " (non-streamed)"))
        if r.sample_seed is not None:
            spec.temperature, spec.seed = self.params.temperature, r.sample_seed
            spec.note += f" (seeded sample: temperature {spec.temperature:g}, seed {spec.seed})"
        if r.shape == "messages":
            spec.messages = self._messages[(r.length, r.shape, r.seed)]
            spec.note += " (chat API)"
        if r.features:
            base = ctx.references.get(base_spec(spec).ref_key) if r.features.needs_base else None
            spec = apply(spec, r.features, base.output_ids if base is not None else None, ctx)
        return spec

    def _take_bases(self, ctx: "ScenarioContext", sched: Schedule, label: str) -> None:
        """The solo references whose outputs name the drawn stop / bias IDs
        (:func:`~pleharness.scenarios.fuzz_features.resolve`): each request of ``sched`` with
        ``stop_at`` or ``bias_at``, without its parameters (phase ``<label>/references-base``,
        only those not taken before)."""
        bases = []
        for ph in sched.phases:
            for r in ph.members():
                if r.features.needs_base:
                    bases.append(base_spec(self._spec(ctx, replace(r, features=NONE))))
        if bases:
            ctx.take_references(bases, phase_name=f"{label}/references-base")

    # requests and their run --------------------------------------------------------------------
    def specs(self, ctx: "ScenarioContext", sched: Schedule) -> list["PhaseSpecs"]:
        """The schedule's requests, phase by phase (default checks on each)."""
        out = []
        for ph in sched.phases:
            carrier = self._spec(ctx, ph.carrier, "carrier ") if ph.carrier else None
            out.append(PhaseSpecs(
                [self._spec(ctx, r) for r in ph.requests], carrier,
                [(self._spec(ctx, i.request, f"insert @{i.at} "), i.at) for i in ph.inserts]))
        return out

    def run_example(self, ctx: "ScenarioContext", sched: Schedule, label: str) -> dict[str, Any]:
        """Run one schedule (references first, then each phase); returns its table row.
        Raises :class:`Abort` on an engine error or interrupt."""
        start = ctx.mark()
        t0 = time.monotonic()
        late = 0
        sent: list[list] = []  # [phase (1-based), insert index, client-seen position, running]
        try:
            self._take_bases(ctx, sched, label)
            phases = self.specs(ctx, sched)
            # requests with logprobs first: a reference they create carries token logprobs
            # (logprob_parity) even where the run asks none (--logprobs 0)
            every = sorted((s for ph in phases for s in ph.all()),
                           key=lambda s: s.logprobs is None)
            # the references record their sampling (temperature, seed): run/references.py
            ctx.take_references(every, phase_name=f"{label}/references")
            for i, (ph, specs) in enumerate(zip(sched.phases, phases), 1):
                plain = specs.requests + ([specs.carrier] if specs.carrier else [])
                outs, trig = run_phase_with_inserts(
                    ctx, f"{label}/p{i}", ph.concurrency + (1 if specs.carrier else 0), plain,
                    specs.carrier, specs.inserts, label="carrier decode")
                if trig is not None:
                    late += len(trig.late([s for s, _ in specs.inserts]))
                    for j, (s, _) in enumerate(specs.inserts):
                        x = trig.sent.get(id(s))
                        if x is not None:
                            sent.append([i, j, x.position, x.running])
        except BaseException as exc:  # engine died, timeout abort, interrupt: not a property
            raise Abort(exc) from exc  # failure, never shrunk
        new_phases, reqs = ctx.since(start)
        bad = [r for r in reqs if r.is_problem]
        failed = any(p.status == "fail" for p in new_phases)
        return ExampleRow(
            example=label, key=sched.key(), phases=len(sched.phases),
            requests=sum(len(p.members()) for p in sched.phases),
            schedule=sched.summary(), status="fail" if failed else "pass",
            inserts=sum(len(p.inserts) for p in sched.phases), inserts_late=late,
            failing_requests=[f"{r.id} ({r.phase}, C{r.concurrency}, len "
                              f"{r.prompt_len}, max_tokens {r.max_tokens})" for r in bad],
            insert_sent=sent,
            failed=self._failed(ctx, bad, label, phases, reqs),
            wall_s=round(time.monotonic() - t0, 3))

    @staticmethod
    def _failed(ctx: "ScenarioContext", bad: list, label: str, phases: list["PhaseSpecs"],
                reqs: list) -> list[dict[str, Any]]:
        """The failed comparisons of one example, for the reproducer (replay's ``failed``):
        ``phase`` (1-based phase of the schedule, or ``references``), ``request`` (index in
        :meth:`PhaseSpecs.all` order, the repro's request order), which run it was and what
        it was compared with (the reference's source and cache state, and whether that
        reference was taken in an earlier example: engine state this example does not carry)."""
        out = []
        own_refs = {r.prompt_hash for r in reqs if r.phase.startswith(f"{label}/references")}
        for r in bad:
            d = r.divergence
            name = r.phase[len(label) + 1:]
            row: dict[str, Any] = {
                "phase": "references", "request": None, "prompt_len": r.prompt_len,
                "max_tokens": r.max_tokens,
                "first_divergence": r.first_divergence,
                "expected_token": d.reference_token if d else None,
                "observed_token": d.observed_token if d else None,
                "detail": "; ".join(f"{c.name}: {c.detail}" for c in r.failed_checks)[:300]
                or (f"request error {r.error}" if r.error else "")}
            if name.startswith("references"):
                cold = name.endswith("-cold")
                row.update(run="cold reference (1st solo run)" if cold else
                           "warm reference (2nd solo run)",
                           compared_with="checks only" if cold else
                           "the prompt's cold (1st solo) run")
            else:
                i = int(name[1:]) if name[1:].isdigit() else 0
                specs = phases[i - 1].all() if 0 < i <= len(phases) else []
                j = next((k for k, s in enumerate(specs) if s.prompt.hash == r.prompt_hash
                          and s.max_tokens == r.max_tokens and s.stream == r.stream
                          and (s.params or None) == r.params), None)
                ref = ctx.references.get(specs[j].ref_key) if j is not None else None
                where = ("taken in this example" if r.prompt_hash in own_refs else
                         "taken in an earlier example of the fuzz run (engine state the "
                         "reproducer does not carry; the replay takes its own)")
                row.update(phase=i, request=j, run=f"load (phase {i}, C{r.concurrency})",
                           compared_with=(f"its single-request reference ({ref.source}, "
                                          f"{ref.cache_state}), {where}") if ref is not None
                           else "its single-request reference")
            out.append(row)
        return out
