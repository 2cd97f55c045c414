"""The run context: the one face scenarios (and checks) see of a run.

:class:`~pleharness.run.scenario_context.ScenarioContext` is the contract a scenario kind codes
against (docs/extending.md); :class:`RunContext` implements it: it issues phases
(:meth:`RunContext.run_phase`, which records, judges and persists each phase and returns its
:class:`~pleharness.run.phases.PhaseResult`; the phase's work is in :mod:`pleharness.run.phases`,
the request path in :mod:`pleharness.run.sending`), takes references
(:mod:`pleharness.run.references`), judges requests (:mod:`pleharness.run.judge`) and keeps the
scenario's tables and notes. A scenario never touches the manifest or saves it; on the reference
engine's collect-only pass (``--reference engine``) load phases, tables and notes are no-ops, so
a scenario never branches on the reference mode either. Checks see a :class:`CheckContext`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from ..divergence import DEFAULT_NEAR_TIE_NATS
from ..engine.client import EngineClient
from ..engine.completion import Completion
from ..engine.facts import EngineFacts
from ..engine.launch import EngineServer
from ..errors import EngineError, UsageError
from ..evidence import mark_vacuous
from ..manifest import (CheckResult, Manifest, PhaseRecord, ReferenceRecord, RequestRecord,
                        now_iso, write_manifest)
from ..manifest.tables import NoteRow
from ..prompts import ChatPromptBuilder
from ..request import Outcome, RequestSpec
from . import phases
from .judge import Judge, Rule
from .phases import PhaseResult
from .references import References
from .scenario_context import Mark, ScenarioContext
from .sending import Sender


class CheckContext:
    """What a check sees (``check(ctx, spec, completion, params)``, ``phase_check(ctx, ph)``):
    ``facts``, ``references`` (read-only), ``phase_role`` (load | reference | warmup),
    ``golden`` / ``golden_error`` (setting it stops the golden model, recorded once),
    ``client`` (detokenize, /health), ``engine_version``. One per run context (a check may
    cache on it)."""

    def __init__(self, run: "RunContext"):
        self._run = run

    facts = property(lambda self: self._run.facts)
    references = property(lambda self: self._run.references)
    phase_role = property(lambda self: self._run.phase_role)
    golden = property(lambda self: self._run.golden)
    client = property(lambda self: self._run.client)
    engine_version = property(lambda self: self._run.manifest.engine.version)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The engine's text of ``ids`` (:meth:`RunContext.detokenize`, cached per run)."""
        return self._run.detokenize(ids)

    @property
    def golden_error(self) -> str | None:
        """Why the golden model stopped being used (None while it is)."""
        return self._run.judge.golden_error

    @golden_error.setter
    def golden_error(self, why: str) -> None:
        self._run.judge.golden_failed(why)


@dataclass(frozen=True)
class RunOptions:
    """How a run context issues and judges requests; fixed for the context's life.

    ``logprobs``: top-k logprobs on every request (divergence margins; None: none asked).
    ``near_tie_nats``: a divergence whose top-1/top-2 gap (nats) is below this is a near tie.
    ``strict``: every divergence fails. ``on_timeout``: continue | abort (after a phase with
    timed-out requests). ``reference_mode``: solo | manifest | engine | golden.
    ``reference_cache_state``: cold | warm (see :meth:`RunContext.take_references`).
    ``reference_source``: recorded on the references taken here (solo, or engine on the reference
    engine). ``collect_only``: take references, skip load phases (the reference engine).
    ``serving_dtype``: the engine's dtype; on half precision golden divergences are judged
    against a tolerance measured in the run (:meth:`pleharness.run.judge.Judge.finish_judgement`).
    ``api``: which endpoint load requests whose prompt has a message form go to (completions,
    chat, or both: a chat twin beside each; :mod:`pleharness.run.api`).
    """

    on_timeout: str = "continue"
    logprobs: int | None = 2
    near_tie_nats: float = DEFAULT_NEAR_TIE_NATS
    strict: bool = False
    reference_mode: str = "solo"
    reference_cache_state: str = "warm"
    reference_source: str = "solo"
    collect_only: bool = False
    serving_dtype: str | None = None  # bfloat16 | float16 | float32 | None (unknown)
    api: str = "completions"  # completions | chat | both (pleharness.run.api)

    @property
    def rule(self) -> Rule:
        """The judge's rule (:class:`pleharness.run.judge.Rule`) of these options."""
        return Rule(self.near_tie_nats, self.strict, self.serving_dtype)


class RunContext:
    """The run context of one engine (:class:`ScenarioContext` for scenarios, see the module
    docstring).

    Built complete: ``options`` (a frozen :class:`RunOptions`) says how requests are issued and
    judged, ``golden`` is the golden model (:class:`pleharness.golden.GoldenModel`, or None) and
    ``references`` the references known up front (``--reference manifest:PATH`` / ``engine``).
    Request checks come from ``check_registry`` (default: every registered check,
    :data:`pleharness.checks.REGISTRY`; pass ``{}`` to run none, which records each as skipped).
    Phases are recorded in ``manifest``, which is written atomically to ``manifest_path`` after
    each one (and after each table change).
    """

    def __init__(self, client: EngineClient, manifest: Manifest, manifest_path: Path,
                 facts: EngineFacts, console: Console, server: EngineServer | None = None,
                 progress: Progress | None = None, check_registry: Mapping | None = None, *,
                 options: RunOptions = RunOptions(), golden=None,
                 references: Mapping[tuple, ReferenceRecord] | None = None):
        self.client = client
        self.manifest = manifest
        self.manifest_path = manifest_path
        self.facts = facts
        self.console = console
        self.server = server
        self.progress = progress
        self.options = options
        self.golden = golden
        self.refs = References(manifest, mode=options.reference_mode,
                               collect_only=options.collect_only,
                               cache_state=options.reference_cache_state,
                               source=options.reference_source, known=references,
                               golden=golden, run_phase=self.run_phase, save=self.save)
        self.judge = Judge(manifest, self.refs.by_key, options.rule, golden, check_registry,
                           save=self.save, warn=self._warn)
        self.checks_view = CheckContext(self)
        self.scenario_view = ScenarioContext(self)  # what scenario kinds' run(ctx) get
        self._req_counter = 0
        self._prompt_builders: dict[tuple[str, int], Any] = {}
        self._detok_cache: dict[tuple[int, ...], str] = {}
        self.sender = Sender(client, options, manifest, warn=self._warn)  # the request path
        self.scenario_name = ""  # set by in_scenario()
        self.phase_prefix = ""
        self.repeat_index = 1

    # the options, read-only (a context is built with them; they do not change during a run)
    on_timeout = property(lambda self: self.options.on_timeout)
    logprobs = property(lambda self: self.options.logprobs)
    near_tie_nats = property(lambda self: self.options.near_tie_nats)
    strict = property(lambda self: self.options.strict)
    reference_mode = property(lambda self: self.options.reference_mode)
    reference_cache_state = property(lambda self: self.options.reference_cache_state)
    check_registry = property(lambda self: self.judge.check_registry)
    references = property(lambda self: MappingProxyType(self.refs.by_key))
    engine_probe = property(lambda self: self.manifest.engine_probe)
    run_id = property(lambda self: self.manifest.run_id)
    run_dir = property(lambda self: Path(self.manifest_path).parent)

    def file_path(self, name: str) -> Path:
        """Where a scenario's own file ``name`` (a reproducer, a plot) goes in the run folder:
        ``run_dir/name`` for the run under test; a run whose manifest has a prefix (the control
        run's ``control-manifest.json`` shares the folder) gets ``run_dir/control-name``, so its
        files never replace the run's (a control fuzz run wrote ``repro.toml`` over the one the
        run under test was about to confirm)."""
        mname = Path(self.manifest_path).name
        prefix = mname[:-len("manifest.json")] if mname.endswith("manifest.json") else ""
        return self.run_dir / (prefix + name)

    @property
    def phase_role(self) -> str:
        """Role of the phase whose requests are being recorded (load | reference | warmup): the
        last phase in the manifest, "load" before any."""
        return self.manifest.phases[-1].role if self.manifest.phases else "load"

    @contextmanager
    def in_scenario(self, name: str, repeat_index: int = 1, phase_prefix: str = ""):
        """Record the phases issued inside as scenario ``name``'s (repeat ``repeat_index``,
        phase names prefixed with ``phase_prefix``); the previous values come back after."""
        old = self.scenario_name, self.repeat_index, self.phase_prefix
        self.scenario_name, self.repeat_index, self.phase_prefix = name, repeat_index, phase_prefix
        try:
            yield self
        finally:
            self.scenario_name, self.repeat_index, self.phase_prefix = old

    def _warn(self, text: str) -> None:
        if self.console is not None:
            self.console.print(f"[yellow]warning:[/yellow] {escape(text)}")

    # -- for scenarios ----------------------------------------------------------------------------
    def issue(self, spec: RequestSpec, on_token: Callable[[int], None] | None = None
              ) -> Completion:
        """Send one request now and wait for it (blocking; no phase, no record): for scenarios'
        custom ``issue`` functions of :meth:`run_phase` (e.g. to scrape /metrics around it).
        ``on_token(n)``: called with the streamed token count so far, on the client's event loop
        thread (keep it short), e.g. to trigger an insert
        (:mod:`pleharness.scenarios.shared.inserting`). Returns the Completion (errors recorded
        in it, never raised)."""
        return self.client._run(self.sender.aissue(spec, on_token))

    def prompt_builder(self, filler: str, tail: int) -> ChatPromptBuilder:
        """The engine's :class:`pleharness.prompts.ChatPromptBuilder` for ``filler`` (one token)
        and ``tail`` (generation-prompt tail tokens), built once per context (it asks the
        engine's tokenizer). Raises ValueError when ``filler`` is not exactly one token."""
        key = (filler, tail)
        if key not in self._prompt_builders:
            self._prompt_builders[key] = ChatPromptBuilder(self.client, filler, tail)
        return self._prompt_builders[key]

    # -- engine endpoints for scenarios (issue 26: disconnects, prefix-cache isolation) -----------
    def reference(self, spec: RequestSpec) -> ReferenceRecord | None:
        """The single-request reference ``spec`` is compared with (its ``output_ids``, per-position
        top-1/top-2 ``margins``, ``cache_state``, ...), or None when there is none yet."""
        return self.references.get(spec.ref_key)

    def reset_prefix_cache(self, attempts: int = 20, wait_s: float = 0.5) -> str | None:
        """Empty the engine's prefix cache (:meth:`EngineClient.reset_prefix_cache`): None once
        it did, else why not; never raises. Either way a new prefix-cache epoch starts for the
        judge (runs before and after are not the same computation: solo repeatability)."""
        self.judge.cache_epoch += 1
        return self.client.reset_prefix_cache(attempts, wait_s)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The engine's text of token IDs ``ids`` (POST /detokenize; special tokens such as EOS
        are kept, unlike in a completion's text), cached per ID list for the run: for checks
        that judge a completion's text against its IDs (``stop_string``). Raises EngineError
        when the engine cannot answer."""
        key = tuple(int(i) for i in ids)
        if key not in self._detok_cache:
            self._detok_cache[key] = self.client.detokenize(list(key)) if key else ""
        return self._detok_cache[key]

    def add_phase_check(self, ph: PhaseRecord, check: CheckResult,
                        reason: str | None = None) -> None:
        """Add a scenario's own check to phase ``ph`` (already recorded) and write the manifest;
        a failing check fails the phase, with ``reason`` (default: the check's detail) added to
        ``ph.reason``."""
        ph.checks.append(check)
        if check.status == "fail":
            ph.status = "fail"
            ph.reason = (ph.reason + "; " if ph.reason else "") + (reason or check.detail)
        self.save()

    def leave_out(self, name: str, reason: str, concurrency: int = 1) -> PhaseRecord | None:
        """Record load phase ``name`` (its prefix added) as planned but left out on this engine:
        what it needs does not fit the engine's facts or the outputs seen so far (a prompt
        longer than max_model_len, no chat template, no prefix caching ...). The phase has
        status ``skip``, no requests, and ``vacuous`` = ``reason`` with the ``engaged`` warning
        (a failure under ``--strict``: :func:`pleharness.evidence.mark_vacuous`); it counts as
        one of the scenario's planned phases, so a complete run accounts for every one (run or
        left out). Returns the record; None on the collect-only pass (nothing recorded)."""
        if self.options.collect_only:
            return None
        ph = PhaseRecord(index=len(self.manifest.phases), name=self.phase_prefix + name,
                         scenario=self.scenario_name, repeat=self.repeat_index,
                         concurrency=max(1, int(concurrency)), status="skip",
                         reason=f"left out: {reason}", counts_for_throughput=False,
                         started_at=now_iso(), ended_at=now_iso())
        self.manifest.phases.append(ph)
        mark_vacuous(self, ph, reason)  # writes the manifest
        if self.console is not None:
            self.console.print(f"[yellow]left out[/yellow] {escape(self.scenario_name)}: "
                               f"{escape(ph.name)}: {escape(reason)}", highlight=False)
        return ph

    def note(self, table: str, texts: str | Iterable[str], echo: bool = False) -> None:
        """Add note row(s) (:class:`~pleharness.manifest.tables.NoteRow`) to table ``table``
        (e.g. ``boundary_notes``); ``echo``: print each on the console too. Nothing on the
        collect-only pass."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self.add_table(table, [NoteRow(note=t) for t in texts])
        if echo and not self.options.collect_only and self.console is not None:
            for t in texts:
                self.console.print(f"[yellow]note[/yellow] {self.scenario_name}: {t}",
                                   highlight=False)

    def add_table(self, key: str, rows: Sequence[Any]) -> None:
        """Append ``rows`` (dicts, or :class:`pleharness.scenarios.base.TableRow` models) to the
        manifest table ``key`` (created empty when ``rows`` is) and write the manifest. Nothing
        on the collect-only pass (its engine is not the one under test)."""
        if self.options.collect_only:
            return
        self.manifest.tables.setdefault(key, []).extend(_row(r) for r in rows)
        self.save()

    def set_table(self, key: str, rows: Sequence[Any]) -> None:
        """Replace the manifest table ``key`` by ``rows`` (as :meth:`add_table`)."""
        if self.options.collect_only:
            return
        self.manifest.tables[key] = [_row(r) for r in rows]
        self.save()

    def add_planned_phases(self, n: int) -> None:
        """Count ``n`` more planned phases in the summary (a kind whose phase count is known only
        at run time). Nothing on the collect-only pass."""
        if self.options.collect_only:
            return
        s = self.manifest.summary
        s.phases_planned = (s.phases_planned or 0) + n
        self.save()

    def mark(self) -> Mark:
        """The point in the run now, for :meth:`since`."""
        return Mark(len(self.manifest.phases), len(self.manifest.requests))

    def since(self, mark: Mark) -> tuple[list[PhaseRecord], list[RequestRecord]]:
        """(phases, request records) recorded since ``mark``."""
        return self.manifest.phases[mark.phases:], self.manifest.requests[mark.requests:]

    # -- references -------------------------------------------------------------------------------
    def take_references(self, specs: Sequence[RequestSpec], phase_name: str = "references",
                        cache_state: str | None = None) -> PhaseResult | None:
        """Run each not-yet-referenced (prompt, max_tokens) alone, one request in flight.

        The outputs become the single-request references that later phases are compared with.
        ``cache_state`` (default ``reference_cache_state``): ``cold`` keeps each prompt's first
        run; ``warm`` runs each prompt alone twice (phases ``<name>-cold`` and ``<name>``),
        compares the second (prefix-cached) run with the first (a difference is analysed like any
        divergence: a near tie is a warning, a hard one fails) and keeps the second. Later load
        requests are warm too, so warm references compare like with like. Seen on an H200 with a
        random-weight bf16 model: a prompt whose cold run and warm runs broke an exact top-1/top-2
        tie differently (docs/gpu-runs/README.md).

        Returns the :class:`PhaseResult` of the kept outputs, or None when nothing was run for
        the run under test (every reference exists already; references come from elsewhere:
        ``--reference manifest:PATH`` / ``engine``, where a missing reference is an explicit
        parity failure; or this is the reference engine's collect-only pass). See
        :mod:`pleharness.run.references`."""
        return self.refs.take(specs, phase_name, cache_state)

    def keep_warm_references(self, outcomes: Sequence[Outcome]) -> None:
        """With warm solo references, make the matched ``outcomes`` (warm runs of prompts whose
        cold runs were just taken as references) the references, so that later (warm) runs
        compare like with like; nothing in other modes."""
        if self.refs.mode == "solo" and self.refs.cache_state == "warm" \
                and not self.refs.collect_only:
            self.refs.store([o for o in outcomes if o.record.match], "warm")

    def store_references(self, outcomes: Sequence[Outcome], cache_state: str) -> None:
        """Make successful outcomes the references of their keys
        (:meth:`pleharness.run.references.References.store`)."""
        self.refs.store(outcomes, cache_state)

    def finish_judgement(self) -> None:
        """After the suite: :meth:`pleharness.run.judge.Judge.finish_judgement`."""
        self.judge.finish_judgement()

    # -- manifest ---------------------------------------------------------------------------------
    def save(self) -> None:
        """Write the manifest atomically (:func:`pleharness.manifest.write_manifest`)."""
        write_manifest(self.manifest_path, self.manifest)

    def ensure_engine_alive(self) -> None:
        """Raise EngineError when the launched engine has exited or /health is no longer 200."""
        if self.server is not None and not self.server.alive():
            raise EngineError("engine process exited during the run", self.server.root_cause(),
                              str(self.server.log_path))
        if not self.client.health(timeout=10):
            cause = self.server.root_cause() if self.server else None
            raise EngineError("engine /health no longer answers 200", cause,
                              str(self.server.log_path) if self.server else None)

    # -- phases -----------------------------------------------------------------------------------
    def run_phase(self, name: str, concurrency: int, specs: Sequence[RequestSpec], *,
                  counts_for_throughput: bool = True, role: str = "load",
                  issue: Callable[[RequestSpec], Completion] | None = None,
                  on_outcome: Callable[[Outcome], None] | None = None,
                  together: bool = False) -> PhaseResult:
        """Issue ``specs`` keeping exactly ``concurrency`` requests in flight; record the phase,
        judge it and write the manifest.

        ``together``: send every spec in ONE completions request with a list of prompts
        (:meth:`EngineClient.acomplete_many`), so that the engine gets them all at once even on
        an overloaded host (``concurrency`` must then be ``len(specs)``; the specs must be
        streamed, not abandoned, and differ only in their prompts: UsageError otherwise).

        ``--api`` (:attr:`RunOptions.api`, :mod:`pleharness.run.api`): in a load phase, a
        spec whose prompt has a message form also goes (``both``: a chat twin sent after the
        phase's specs, recorded and judged, not returned) or only goes (``chat``) to
        ``/v1/chat/completions``; ``summary.api_paths`` counts the endpoints per scenario.

        Specs with ``n`` > 1 are the choices of requests for several choices
        (:mod:`pleharness.run.choices`): each request is sent once, ``concurrency`` counts
        requests, and every choice gets its own record (UsageError for choices that cannot
        form one request).

        ``issue``: a custom (blocking) request function, run in a pool of ``concurrency``
        threads (default: the client's event loop). ``on_outcome(outcome)``: called for each
        finished request once its record is made and before the phase is judged and written, so
        that a scenario can add checks to ``outcome.record`` (records are appended to the records
        file when the phase is written and not rewritten afterwards). Returns the
        :class:`PhaseResult` (outcomes in the order of ``specs``, and the phase record); an empty
        one without a phase for a load phase on the collect-only pass. Raises UsageError for
        ``concurrency`` < 1, EngineError when requests failed because the engine died (the phase
        is recorded first), RequestTimeoutAbort after timeouts under ``--on-timeout abort``.
        """
        if concurrency < 1:
            raise UsageError(f"phase {name}: concurrency must be >= 1")
        if self.options.collect_only and role != "reference":
            return PhaseResult()  # reference pass on the reference engine: only references
        return phases.run(self, self.phase_prefix + name, concurrency, specs,
                          counts_for_throughput=counts_for_throughput, role=role, issue=issue,
                          on_outcome=on_outcome, together=together)

    def record_request(self, ph: PhaseRecord, spec: RequestSpec, c: Completion) -> RequestRecord:
        """The record of ``spec``'s completion ``c`` in ``ph``, judged
        (:meth:`pleharness.run.judge.Judge.judge_request`) and appended to the manifest."""
        self._req_counter += 1
        rec = phases.request_record(f"r{self._req_counter:05d}", self.scenario_name, ph, spec, c)
        self.judge.judge_request(ph, spec, c, rec, self.checks_view)
        self.manifest.requests.append(rec)
        return rec


def _row(r: Any) -> Any:
    """A table row as stored: a pydantic model (TableRow) as its dict, anything else as is."""
    dump = getattr(r, "model_dump", None)
    return dump() if callable(dump) else r
