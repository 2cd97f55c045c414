"""Planning a scenario without an engine (issue 48): :func:`plan_scenario` runs a kind's own
``run(ctx)`` against :class:`PlanRun`, a run context whose engine is synthetic and answers at
once, and records what the kind would issue on an engine with the given facts: its phases (name,
role, concurrency, requests, prompt lengths, max_tokens), the phases it leaves out and the ones
it marks vacuous with their reasons, its notes, the requests that would not fit max_model_len or
the vocabulary, and an exception, should the kind raise one. ``ple-harness scenarios --check
--facts`` prints it; the facts-matrix test (tests/test_facts_matrix.py) asserts it on every
shipped suite and profile.

The synthetic engine (:class:`SyntheticEngine`) behaves as :class:`Assumptions` say:

- outputs: ``healthy`` (every request gets its max_tokens IDs, greedy, stopping where a stop ID
  or stop string asks) or ``cut_short`` (every output ends after half its max_tokens, as a
  faulty engine's: :class:`pleharness.faults.builtin.CutShort` on every request);
- a chat template (a small role-tagged template) or none (/tokenize of messages fails as
  vLLM's does for a model without one);
- structured output served, or refused with a 400;
- ``POST /reset_prefix_cache`` served (a launched engine) or not (attached without dev mode);
- no /metrics (counters unknown: the kinds' counter checks are skipped, never guessed).

Text: a word-level tokenizer (a leading space and a word are one token, " " alone is one), IDs
from a stable hash below the vocabulary; an output ID the tokenizer never made reads " t<ID>".
Plans depend on the facts, not on these outputs, except where a kind takes something from its
outputs (stop strings, a stop ID): there the plan shows what a healthy engine would give.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rich.console import Console

from ..engine.completion import Completion
from ..engine.facts import EngineFacts, as_facts
from ..engine.inflight import Timeouts
from ..errors import EngineError, UsageError
from ..manifest import CheckResult, Manifest, PhaseRecord, ReferenceRecord, RequestRecord
from ..manifest.tables import NoteRow
from ..prompts import ChatPromptBuilder, Prompt
from ..request import Outcome, RequestSpec
from . import api
from .phases import PhaseResult, request_record
from .references import References
from .scenario_context import Mark, ScenarioContext

OUTPUTS = ("healthy", "cut_short")


@dataclass(frozen=True)
class Assumptions:
    """What the synthetic engine does beyond its facts (module docstring): ``outputs``
    (healthy | cut_short), ``chat_template``, ``structured_outputs``, ``prefix_cache_reset``."""

    outputs: str = "healthy"
    chat_template: bool = True
    structured_outputs: bool = True
    prefix_cache_reset: bool = True


_PIECE = re.compile(r"\s*\S+|\s+")
_OUT = re.compile(r" t(\d+)")


class SyntheticEngine:
    """The synthetic engine's client side (module docstring): /tokenize, /detokenize, a
    constrained-output probe, no /metrics. ``facts``: the engine's facts (vocabulary size V,
    256 when unknown); ``assume``: :class:`Assumptions`."""

    model = "planned"

    def __init__(self, facts: EngineFacts, assume: Assumptions):
        self.facts = facts
        self.assume = assume
        self.vocab = max(32, facts.vocab_or())
        self.timeouts = Timeouts()
        self._pieces: dict[int, str] = {}

    # -- text ---------------------------------------------------------------------------------
    def _id(self, piece: str) -> int:
        m = _OUT.fullmatch(piece)
        if m and 16 <= int(m.group(1)) < self.vocab:
            return int(m.group(1))
        i = 16 + zlib.crc32(piece.encode()) % (self.vocab - 16)
        self._pieces.setdefault(i, piece)
        return i

    def _text_ids(self, text: str) -> list[int]:
        return [self._id(p) for p in _PIECE.findall(text)]

    def tokenize(self, **payload: Any) -> list[int]:
        """/tokenize of ``prompt=`` text or ``messages=`` (EngineError without a chat
        template, as vLLM answers 400 for such a model)."""
        if "messages" not in payload:
            return self._text_ids(str(payload.get("prompt", "")))
        if not self.assume.chat_template:
            raise EngineError("/tokenize answered 400: this model has no chat template "
                              "(planned: --no-chat-template)")
        ids = [1]
        for msg in payload["messages"]:
            ids += [2, self._id(msg["role"]), 3] + self._text_ids(msg["content"]) + [4]
        if payload.get("add_generation_prompt"):
            ids += [2, self._id("assistant"), 3]
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        """/detokenize: the pieces the tokenizer made, " t<ID>" for any other ID."""
        return "".join(self._pieces.get(int(i), f" t{int(i)}") for i in ids)

    # -- endpoints ----------------------------------------------------------------------------
    def metrics_text(self) -> str | None:
        return None

    def version(self) -> str | None:
        return None

    def health(self, timeout: float = 5.0) -> bool:
        return True

    def reset_prefix_cache(self, attempts: int = 20, wait_s: float = 0.5) -> str | None:
        return None if self.assume.prefix_cache_reset else \
            "/reset_prefix_cache answered 404 (planned: not served)"

    def complete(self, prompt_ids: Sequence[int], max_tokens: int, **kw: Any) -> Completion:
        """One request outside a phase (the constrained-output probe): its choice when
        structured outputs are served, else a 400."""
        extra = kw.get("extra") or {}
        so = extra.get("structured_outputs")
        if so is not None and not self.assume.structured_outputs:
            return Completion(error="http", http_status=400, streamed=False,
                              error_detail="400: structured outputs not served (planned)")
        if so is not None and "choice" in so:
            text = str(so["choice"][0])
            return Completion(token_ids=self._text_ids(text), text=text, finish_reason="stop",
                              streamed=False)
        prompt = Prompt(key="probe", ids=tuple(int(t) for t in prompt_ids))
        return self.answer(RequestSpec(prompt, max_tokens, stream=False))

    def _run(self, coro) -> list[Completion]:
        """The one private use a kind makes of the client (``choices``' request for two
        greedy choices): answered as vLLM does, with a clean 400."""
        coro.close()
        return [Completion(error="http", http_status=400, streamed=False,
                           error_detail="400: n must be 1 when using greedy sampling")]

    # -- completions --------------------------------------------------------------------------
    def answer(self, spec: RequestSpec) -> Completion:
        """The synthetic completion of ``spec``: a 400 when prompt + max_tokens exceeds
        max_model_len; else its output IDs (seeded by the prompt), cut where a stop ID or stop
        string ends it (not before ``min_tokens``), or after half when outputs are cut short;
        logprobs, prompt scores, streamed deltas (of up to q IDs) and an abandoned stream as
        asked."""
        m = self.facts.max_model_len
        n_prompt = len(spec.prompt)
        if m is not None and n_prompt + spec.max_tokens > int(m):
            return Completion(error="http", http_status=400, streamed=spec.stream,
                              error_detail=f"400: {n_prompt} prompt + {spec.max_tokens} tokens "
                                           f"exceed max_model_len {m}")
        n = spec.max_tokens
        if self.assume.outputs == "cut_short":
            n = max(1, n // 2)
        if spec.structured is not None:
            n = min(n, 3)
        # the prompt (and seed, choice) fixes the output: a stride through [16, V)
        start = zlib.crc32(f"{spec.prompt.hash}/{spec.seed}/{spec.choice}".encode())
        span = self.vocab - 16
        ids = [16 + (start + 7919 * j) % span for j in range(n)]
        ids = self._stopped(spec, ids)
        if spec.abandon_after_tokens is not None:
            kept = ids[:spec.abandon_after_tokens]
            return Completion(token_ids=kept, text=self.detokenize(kept), streamed=True,
                              error="abandoned", error_detail="planned disconnect")
        q = self.facts.q
        chunks = None
        if spec.keep_chunks:
            chunks, i, size = [], 0, 1
            while i < len(ids):
                part = ids[i:i + size]
                chunks.append((part, self.detokenize(part)))
                i += len(part)
                size = size % q + 1
        lp = [{t: -0.1, (t + 1) % self.vocab: -2.5} for t in ids] if spec.logprobs else None
        plp = None
        if spec.prompt_logprobs is not None or spec.echo:
            plp = [None] + [{int(t): -1.0} for t in spec.prompt.ids[1:]]
        return Completion(
            token_ids=ids, text=self.detokenize(ids), streamed=spec.stream,
            finish_reason="length" if len(ids) == spec.max_tokens or
            self.assume.outputs == "cut_short" else "stop",
            prompt_tokens=n_prompt, completion_tokens=len(ids), ttft_s=0.0, latency_s=0.0,
            logprobs=lp, token_logprobs=[-0.1] * len(ids) if lp else None, chunks=chunks,
            prompt_token_ids=list(spec.prompt.ids), prompt_logprobs=plp,
            echo_ids=list(spec.prompt.ids) if spec.echo else None)

    def _stopped(self, spec: RequestSpec, ids: list[int]) -> list[int]:
        low = spec.min_tokens or 0
        if spec.stop_token_ids:
            for j, t in enumerate(ids):
                if j + 1 >= low and t in spec.stop_token_ids:
                    return ids[:j + 1]
        for s in spec.stop or ():
            for j in range(len(ids)):
                if j + 1 >= low and s in self.detokenize(ids[:j + 1]):
                    return ids[:j + 1]
        return ids


@dataclass
class PlannedPhase:
    """One phase a kind would issue (or left out): ``role`` (load | reference | warmup),
    ``status`` (run | left out), requests (with the chat twins ``--api both``, the default,
    adds to a load phase) and their prompt lengths (tokens, min and max) and
    largest max_tokens, ``vacuous`` (why it tests nothing of what it is for, or None),
    ``over_limit`` (requests whose prompt + max_tokens exceed max_model_len although no clean
    4xx is accepted for them, or whose IDs reach past the vocabulary)."""

    name: str
    role: str
    concurrency: int
    requests: int = 0
    prompt_lens: tuple[int, int] | None = None
    max_tokens: int = 0
    status: str = "run"
    vacuous: str | None = None
    over_limit: list[str] = field(default_factory=list)


@dataclass
class ScenarioPlan:
    """The plan of one scenario on one engine: its ``phases`` in order, ``planned`` (the load
    phases the run would count: the kind's :meth:`planned_phases` plus what it adds at run
    time), its ``notes`` ("table: note"), and ``error``: an exception the kind raised, as
    "Class: message" (None: it planned through)."""

    name: str
    kind: str
    planned: int = 0
    phases: list[PlannedPhase] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def load(self) -> list[PlannedPhase]:
        """The load phases (run or left out): a complete run accounts for ``planned`` of them."""
        return [p for p in self.phases if p.role == "load"]

    @property
    def requests(self) -> int:
        """Requests the run would send (every role)."""
        return sum(p.requests for p in self.phases)

    @property
    def vacuous(self) -> list[PlannedPhase]:
        """The phases left out or marked vacuous."""
        return [p for p in self.phases if p.vacuous]


class PlanRun:
    """Stands in for :class:`pleharness.run.context.RunContext` behind a
    :class:`~pleharness.run.scenario_context.ScenarioContext` (the whole contract): phases are
    recorded, not sent; every request is answered at once by :class:`SyntheticEngine`; the
    references are the synthetic solo answers; nothing is judged and nothing is written."""

    strict = False
    near_tie_nats = 0.5
    reference_mode = "solo"
    reference_cache_state = "cold"
    run_id = "planned"
    repeat_index = 1
    progress = None
    phase_prefix = ""

    def __init__(self, facts, scenario_name: str, assume: Assumptions = Assumptions(),
                 run_dir: Path | None = None):
        self.facts = as_facts(facts)
        self.client = SyntheticEngine(self.facts, assume)
        self.console = Console(quiet=True)
        self.engine_probe: dict[str, Any] = {}
        self.scenario_name = scenario_name
        self.run_dir = Path(run_dir or ".")
        self.manifest = Manifest(run_id="planned")
        self.refs = References(self.manifest, mode="solo", cache_state="cold",
                               run_phase=self.run_phase)
        self.plan = ScenarioPlan(scenario_name, "")
        self.added = 0
        self.tables: dict[str, list[Any]] = {}
        self._builders: dict[tuple[str, int], ChatPromptBuilder] = {}
        self._by_record: dict[int, PlannedPhase] = {}  # id(PhaseRecord) -> its planned phase
        self._answers: dict[tuple, Completion] = {}
        self._n = 0
        self.scenario_view = ScenarioContext(self)

    references = property(lambda self: MappingProxyType(self.refs.by_key))

    def file_path(self, name: str) -> Path:
        return self.run_dir / name

    # -- requests -------------------------------------------------------------------------------
    def issue(self, spec: RequestSpec, on_token: Callable[[int], None] | None = None
              ) -> Completion:
        c = self.client.answer(spec)
        if on_token is not None:
            for i in range(1, len(c.token_ids) + 1):
                on_token(i)
        return c

    def prompt_builder(self, filler: str, tail: int) -> ChatPromptBuilder:
        key = (filler, tail)
        if key not in self._builders:
            self._builders[key] = ChatPromptBuilder(self.client, filler, tail)
        return self._builders[key]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.client.detokenize(ids)

    def reset_prefix_cache(self, attempts: int = 20, wait_s: float = 0.5) -> str | None:
        return self.client.reset_prefix_cache(attempts, wait_s)

    # -- phases ---------------------------------------------------------------------------------
    def run_phase(self, name: str, concurrency: int, specs: Sequence[RequestSpec], *,
                  counts_for_throughput: bool = True, role: str = "load",
                  issue: Callable[[RequestSpec], Completion] | None = None,
                  on_outcome: Callable[[Outcome], None] | None = None,
                  together: bool = False) -> PhaseResult:
        """Record phase ``name`` and answer ``specs`` (a custom ``issue`` is not called: its
        timing is the engine's). Raises UsageError for ``concurrency`` < 1, as the run does."""
        if concurrency < 1:
            raise UsageError(f"phase {name}: concurrency must be >= 1")
        ph = PhaseRecord(index=len(self.manifest.phases), name=name,
                         scenario=self.scenario_name, concurrency=concurrency,
                         requests=len(specs), role=role,
                         counts_for_throughput=counts_for_throughput and role == "load")
        self.manifest.phases.append(ph)
        outs = []
        for s in specs:
            key = (s.ref_key, s.stream, s.abandon_after_tokens, s.keep_chunks, s.choice,
                   s.logprobs, s.structured is not None)
            c = self._answers.get(key)
            if c is None:  # the same request gets the same (read-only) answer
                c = self._answers[key] = self.client.answer(s)
            self._n += 1
            rec = request_record(f"r{self._n:05d}", self.scenario_name, ph, s, c)
            ref = self.refs.by_key.get(s.ref_key)
            if s.compare and ref is not None and c.error is None:
                rec.reference_hash = ref.output_hash
                rec.match = rec.output_hash == ref.output_hash
            self.manifest.requests.append(rec)
            outs.append(Outcome(s, c, rec))
        for o in outs:
            if on_outcome is not None:
                on_outcome(o)
        ph.status = "pass"
        # --api both (the default): a load request whose prompt is a chat template of messages
        # also goes to /v1/chat/completions as a twin, counted with the phase's requests
        sent = len(api.plan(specs, "both", load=True, batched=together).send) \
            if role == "load" and self.client.assume.chat_template else len(specs)
        self._record(ph, specs, sent)
        return PhaseResult(outs, ph)

    def _record(self, ph: PhaseRecord, specs: Sequence[RequestSpec], sent: int) -> None:
        m, v = self.facts.max_model_len, self.facts.vocab_size
        over = []
        for s in specs:
            if m is not None and len(s.prompt) + s.max_tokens > int(m) and not s.accept_4xx:
                over.append(f"{s.prompt.key}: {len(s.prompt)} + {s.max_tokens} > M = {m}")
            if v is not None and any(not 0 <= int(t) < int(v) for t in s.prompt.ids):
                over.append(f"{s.prompt.key}: a token ID outside [0, {v})")
        lens = [len(s.prompt) for s in specs]
        self.plan.phases.append(PlannedPhase(
            ph.name, ph.role, ph.concurrency, sent,
            (min(lens), max(lens)) if lens else None,
            max((s.max_tokens for s in specs), default=0), over_limit=over))
        self._by_record[id(ph)] = self.plan.phases[-1]

    def leave_out(self, name: str, reason: str, concurrency: int = 1) -> PhaseRecord:
        ph = PhaseRecord(index=len(self.manifest.phases), name=name, scenario=self.scenario_name,
                         concurrency=max(1, int(concurrency)), status="skip",
                         reason=f"left out: {reason}", vacuous=reason,
                         counts_for_throughput=False)
        self.manifest.phases.append(ph)
        self.plan.phases.append(PlannedPhase(name, "load", ph.concurrency, status="left out",
                                             vacuous=reason))
        self._by_record[id(ph)] = self.plan.phases[-1]
        return ph

    def add_phase_check(self, ph: PhaseRecord, check: CheckResult,
                        reason: str | None = None) -> None:
        ph.checks.append(check)  # roles and vacuous reasons are read in finish()

    def take_references(self, specs: Sequence[RequestSpec], phase_name: str = "references",
                        cache_state: str | None = None) -> PhaseResult | None:
        return self.refs.take(specs, phase_name, cache_state)

    def keep_warm_references(self, outcomes: Sequence[Outcome]) -> None:
        return None

    def reference(self, spec: RequestSpec) -> ReferenceRecord | None:
        return self.refs.by_key.get(spec.ref_key)

    # -- tables, notes, marks -------------------------------------------------------------------
    def note(self, table: str, texts, echo: bool = False) -> None:
        texts = [texts] if isinstance(texts, str) else list(texts)
        self.plan.notes += [f"{table}: {t}" for t in texts]
        self.add_table(table, [NoteRow(note=t) for t in texts])

    def add_table(self, key: str, rows: Sequence[Any]) -> None:
        self.tables.setdefault(key, []).extend(rows)

    def set_table(self, key: str, rows: Sequence[Any]) -> None:
        self.tables[key] = list(rows)

    def add_planned_phases(self, n: int) -> None:
        self.added += n

    def mark(self) -> Mark:
        return Mark(len(self.manifest.phases), len(self.manifest.requests))

    def since(self, mark: Mark) -> tuple[list[PhaseRecord], list[RequestRecord]]:
        return self.manifest.phases[mark.phases:], self.manifest.requests[mark.requests:]

    def finish(self) -> None:
        """Bring the planned phases in line with their records (roles and vacuous reasons set
        after the phase was recorded)."""
        for ph in self.manifest.phases:
            planned = self._by_record.get(id(ph))
            if planned is not None:
                planned.role = ph.role
                planned.vacuous = planned.vacuous or ph.vacuous


def plan_scenario(scenario, facts: EngineFacts | Mapping[str, Any],
                  assume: Assumptions = Assumptions(), run_dir: Path | None = None
                  ) -> ScenarioPlan:
    """The plan of ``scenario`` (a :class:`pleharness.scenarios.Scenario`) on an engine with
    ``facts``: its ``plan(ctx)`` (by default its ``run(ctx)``) against a :class:`PlanRun`.
    Never raises for what the kind raises: it is the plan's ``error``."""
    run = PlanRun(facts, scenario.name, assume, run_dir)
    plan = run.plan
    plan.kind = scenario.kind
    try:
        scenario.plan(run.scenario_view)
    except Exception as exc:  # noqa: BLE001 - the plan reports what the kind raised
        plan.error = f"{exc.__class__.__name__}: {exc}"
    run.finish()
    plan.planned = scenario.planned_phases() + run.added
    return plan


