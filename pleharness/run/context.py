"""The run context: the one face scenarios (and checks) see of a run.

:class:`ScenarioContext` is the contract a scenario kind codes against (docs/extending.md);
:class:`RunContext` implements it: it issues phases (:meth:`RunContext.run_phase`, which records,
judges and persists each phase and returns its :class:`PhaseResult`), takes references
(:mod:`pleharness.run.references`), judges requests (:mod:`pleharness.run.judge`) and keeps the
scenario's tables and notes. A scenario never touches the manifest or saves it; on the reference
engine's collect-only pass (``--reference engine``) load phases, tables and notes are no-ops, so
a scenario never branches on the reference mode either. Checks see a :class:`CheckContext`.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rich.console import Console
from rich.progress import Progress

from ..checks import DEFAULT_PHASE_CHECKS, PHASE_REGISTRY
from ..divergence import DEFAULT_NEAR_TIE_NATS
from ..engine.client import EngineClient
from ..engine.completion import Completion
from ..engine.facts import EngineFacts
from ..engine.launch import EngineServer
from ..errors import EngineError, RequestTimeoutAbort, UsageError
from ..manifest import (CheckResult, Manifest, PhaseRecord, ReferenceRecord, RequestRecord,
                        now_iso, write_manifest)
from ..parity import token_hash
from ..request import Outcome, RequestSpec
from . import api, choices
from .judge import Judge, Rule, finish_phase
from .references import References


class PhaseResult(list):
    """What :meth:`RunContext.run_phase` returns: the phase's outcomes (a list of
    :class:`~pleharness.request.Outcome`, in the order of the specs) and ``phase``, its
    :class:`~pleharness.manifest.PhaseRecord` (recorded, judged and written already; None when
    no phase was run: the collect-only pass of the reference engine)."""

    def __init__(self, outcomes: Iterable[Outcome] = (), phase: PhaseRecord | None = None):
        super().__init__(outcomes)
        self.phase = phase


@dataclass(frozen=True)
class Mark:
    """A point in the run (:meth:`RunContext.mark`): how many phases and records existed."""

    phases: int
    requests: int


class ScenarioContext:
    """What a scenario kind's ``run(ctx)`` gets: the whole contract (docs/extending.md), a
    facade over the :class:`RunContext` that has no way to the manifest or to saving it.

    Read-only: ``facts`` (:class:`pleharness.engine.facts.EngineFacts`), ``client`` (the engine
    client, for /metrics around a request), ``console`` / ``progress`` (output), ``references``
    (by request key), ``strict``, ``near_tie_nats``, ``reference_mode``,
    ``reference_cache_state``,
    ``engine_probe``, ``run_dir``, ``run_id``, ``scenario_name``, ``phase_prefix``.
    Methods: :meth:`RunContext.run_phase`, :meth:`RunContext.take_references`,
    :meth:`RunContext.keep_warm_references`, :meth:`RunContext.add_phase_check`,
    :meth:`RunContext.issue`, :meth:`RunContext.prompt_builder`, :meth:`RunContext.note`,
    :meth:`RunContext.add_table`, :meth:`RunContext.set_table`,
    :meth:`RunContext.add_planned_phases`, :meth:`RunContext.mark`, :meth:`RunContext.since`,
    :meth:`RunContext.detokenize`, :meth:`RunContext.reference`,
    :meth:`RunContext.reset_prefix_cache`.
    """

    __slots__ = ("_run",)
    FACE = ("facts", "client", "console", "progress", "references", "strict", "reference_mode",
            "reference_cache_state", "engine_probe", "run_dir", "run_id", "scenario_name",
            "phase_prefix", "run_phase", "take_references", "keep_warm_references",
            "add_phase_check", "issue", "prompt_builder", "note", "add_table", "set_table",
            "add_planned_phases", "mark", "since", "detokenize", "reference",
            "reset_prefix_cache", "near_tie_nats")

    def __init__(self, run: "RunContext"):
        self._run = run

    def __getattr__(self, name: str) -> Any:
        if name in ScenarioContext.FACE:
            return getattr(self._run, name)
        raise AttributeError(f"a scenario's context has no {name!r} (the contract: "
                             "pleharness.run.context.ScenarioContext, docs/extending.md)")


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


class _Watchdog:
    """Polls the engine while a phase runs (every ``interval_s``): the launched process must be
    alive and /health must answer 200. Two failed polls in a row mark the engine dead and cut off
    every request in flight, so a dead engine is noticed within a few seconds instead of after
    the request timeouts."""

    def __init__(self, ctx: "RunContext", interval_s: float = 2.0):
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
        self._route: dict[int, RequestSpec] = {}  # --api chat: phase spec id -> its chat form
        self._api_used: str | None = None  # --api once the chat template was asked
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
            from rich.markup import escape
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
        return self.client._run(self._aissue(spec, on_token))

    def prompt_builder(self, filler: str, tail: int):
        """The engine's :class:`pleharness.prompts.ChatPromptBuilder` for ``filler`` (one token)
        and ``tail`` (generation-prompt tail tokens), built once per context (it asks the
        engine's tokenizer). Raises ValueError when ``filler`` is not exactly one token."""
        from ..prompts import ChatPromptBuilder
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

    def note(self, table: str, texts: str | Iterable[str], echo: bool = False) -> None:
        """Add note row(s) ``{"note": text}`` to table ``table`` (e.g. ``boundary_notes``);
        ``echo``: print each on the console too. Nothing on the collect-only pass."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        self.add_table(table, [{"note": t} for t in texts])
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
        name = self.phase_prefix + name
        own = len(specs)
        specs, self._route, on_outcome = api.begin_phase(
            self.manifest.summary, self.scenario_name, specs, self._api_mode(specs, role),
            load=role == "load", batched=together, on_outcome=on_outcome)
        # the default request path runs on the client's event loop (no thread per request);
        # a custom ``issue`` (which may block) runs in a pool of ``concurrency`` threads
        job = self._aissue if issue is None else issue
        items: Sequence[Any] = specs
        groups = None  # requests for several choices (issue 35 item 2): spec indices per request
        if together:
            job, items = self._together(name, specs, concurrency, issue), [specs]
        elif choices.has_choices(specs):
            groups, job = choices.plan(name, specs, issue, self._aissue, self._request_args,
                                       self.client)
            items = [[specs[i] for i in g] for g in groups]
        ph = PhaseRecord(index=len(self.manifest.phases), name=name, scenario=self.scenario_name,
                         repeat=self.repeat_index,
                         concurrency=concurrency, requests=len(specs),
                         counts_for_throughput=counts_for_throughput and role == "load",
                         role=role, started_at=now_iso())
        self.manifest.phases.append(ph)
        task = None
        if self.progress is not None:
            task = self.progress.add_task(f"{self.scenario_name}: {name} (C{concurrency})",
                                          total=len(specs))

        def done(_i: int) -> None:
            if task is not None:
                self.progress.advance(task, len(specs) if together
                                      else len(groups[_i]) if groups else 1)

        from ..engine import metrics
        before = metrics.snapshot(self.client)
        t0 = time.monotonic()
        batch = self.client.run_batch(items, 1 if together else concurrency, job, on_done=done)
        watchdog = _Watchdog(self)
        try:
            completions = batch.wait()
            if together:
                completions = completions[0]
            elif groups is not None:
                completions = choices.ungroup(groups, completions, len(specs))
        except BaseException:
            self._interrupted(ph, specs, batch, t0, task, together, groups)
            raise
        finally:
            watchdog.stop()
            route, self._route = self._route, {}
        ph.wall_s = time.monotonic() - t0
        ph.ended_at = now_iso()
        if task is not None:
            self.progress.remove_task(task)
        outcomes = PhaseResult([Outcome(s, c, self._record(ph, route.get(id(s), s), c))
                                for s, c in zip(specs, completions)], ph)
        self._close_phase(ph, outcomes, before, on_outcome)
        self._after_phase(ph, outcomes, watchdog)
        return PhaseResult(outcomes[:own], ph) if len(outcomes) > own else outcomes

    def _interrupted(self, ph: PhaseRecord, specs: Sequence[RequestSpec], batch, t0: float,
                     task, together: bool = False, groups=None) -> None:
        """Interrupted: keep (record and compare) the requests that had finished, abandon the
        ones in flight; the phase is "interrupted" (or "not_run" when none had finished)."""
        if together:  # one item: the list of every spec's completion, or nothing
            finished = [x for _, cs in batch.finished() for x in zip(specs, cs)]
        elif groups is not None:  # an item per request: its choices' completions
            finished = [(specs[j], c) for g, cs in batch.finished() for j, c in zip(groups[g], cs)]
        else:
            finished = [(specs[i], c) for i, c in batch.finished()]
        finished = [(self._route.get(id(s), s), c) for s, c in finished]
        batch.cancel()  # start no further request
        self.client.abort_all("harness interrupted")
        ph.wall_s = time.monotonic() - t0
        if finished:
            finish_phase(ph, [self._record(ph, s, c) for s, c in finished])
        ph.status = "interrupted" if finished else "not_run"
        ph.reason = (f"interrupted after {len(finished)} of {len(specs)} requests finished"
                     + (f" ({ph.reason})" if finished and ph.reason else ""))
        ph.ended_at = now_iso()
        if task is not None:
            self.progress.remove_task(task)
        self.save()

    def _close_phase(self, ph: PhaseRecord, outcomes: PhaseResult, before,
                     on_outcome: Callable[[Outcome], None] | None) -> None:
        """Evidence, the scenario's per-request hook, phase checks, the phase's verdict; the
        manifest is written."""
        from .. import evidence
        from ..engine import metrics
        ph.engaged = evidence.phase_evidence(before, metrics.snapshot(self.client),
                                             [o.completion for o in outcomes],
                                             [len(o.spec.prompt) for o in outcomes],
                                             self.facts.max_num_batched_tokens)
        if on_outcome is not None:
            for o in outcomes:
                on_outcome(o)
        if any(o.record.match is False for o in outcomes):  # kept for `ple-harness explain`
            for o in outcomes:
                self.manifest.prompts.setdefault(o.spec.prompt.hash, list(o.spec.prompt.ids))
        for name in DEFAULT_PHASE_CHECKS:
            ph.checks.append(PHASE_REGISTRY[name](self.checks_view, ph))
        finish_phase(ph, [o.record for o in outcomes])
        peak = ph.engaged.get("in_flight_peak")
        if ph.role == "load" and ph.concurrency > 1 and len(outcomes) > 1 and peak == 1:
            evidence.mark_vacuous(self, ph, f"C{ph.concurrency} phase: at most 1 of its requests "
                                  "was in flight at any time (each ended before the next began)")
        self.save()

    def _after_phase(self, ph: PhaseRecord, outcomes: PhaseResult, watchdog: _Watchdog) -> None:
        """Raise when the engine died or a timeout aborts the run (the phase is written)."""
        healthy = all(c.status != "fail" for c in ph.checks if c.name == "health_after_phase")
        if watchdog.dead is not None:
            ph.reason = (ph.reason + "; " if ph.reason else "") + f"engine died: {watchdog.dead}"
            self.save()
            self.ensure_engine_alive()
            raise EngineError(f"engine died during phase {ph.name}: {watchdog.dead}",
                              self.server.root_cause() if self.server else None,
                              str(self.server.log_path) if self.server else None)
        if not healthy or any(o.completion.error in ("connection", "aborted")
                              for o in outcomes):
            self.ensure_engine_alive()
        if self.on_timeout == "abort" and any(o.completion.error == "timeout" for o in outcomes):
            raise RequestTimeoutAbort(f"phase {ph.name}: request(s) timed out and the policy is "
                                      "--on-timeout abort")

    def _api_mode(self, specs: Sequence[RequestSpec], role: str) -> str:
        """The ``--api`` mode of a phase of ``specs``: :attr:`RunOptions.api`, once the model's
        chat template answered (asked at the first load phase with a prompt of message form;
        none: completions for the rest of the run, said in ``run_options`` and a warning)."""
        mode = self.options.api
        if mode == "completions" or role != "load" or not any(s.prompt.messages
                                                               for s in specs):
            return mode
        if self._api_used is None:
            got = api.resolve(mode, self.client)
            self.manifest.run_options.update(got)
            self._api_used = got["api_used"]
            if got.get("api_note"):
                self._warn(got["api_note"])
        return self._api_used

    def _request_args(self, spec: RequestSpec) -> dict[str, Any]:
        lp = spec.logprobs if spec.logprobs is not None else self.logprobs
        extra = {k: v for k, v in spec.params.items() if k not in ("stop", "ignore_eos")}
        if spec.temperature > 0:  # nucleus / top-k sampling (vLLM's top_p, top_k fields)
            extra.update({k: v for k, v in (("top_p", spec.top_p), ("top_k", spec.top_k))
                          if v is not None})
        return {"prompt_ids": list(spec.prompt.ids), "max_tokens": spec.max_tokens,
                "logprobs": lp, "temperature": spec.temperature, "seed": spec.seed,
                "stream": spec.stream, "ignore_eos": spec.ignore_eos, "stop": spec.stop,
                "keep_chunks": spec.keep_chunks, "extra": extra or None,
                "abandon_after_tokens": spec.abandon_after_tokens}

    def _together(self, name: str, specs: Sequence[RequestSpec], concurrency: int,
                  issue) -> Callable:
        """The job of a ``together`` phase (see :meth:`run_phase`): one coroutine sending every
        spec's prompt in one request. Raises UsageError for specs that cannot share one."""
        args = [self._request_args(s) for s in specs]
        first = {k: v for k, v in args[0].items() if k != "prompt_ids"} if args else {}
        why = None
        if issue is not None:
            why = "a custom issue function"
        elif any(s.messages for s in specs):
            why = "chat requests (one prompt each)"
        elif concurrency != len(specs):
            why = f"concurrency {concurrency} != {len(specs)} requests"
        elif any({k: v for k, v in a.items() if k != "prompt_ids"} != first for a in args):
            why = "requests differ in more than their prompts"
        elif first and (not first["stream"] or first["abandon_after_tokens"] is not None
                        or first["keep_chunks"]):
            why = "not streamed, abandoned or keep_chunks"
        if why:
            raise UsageError(f"phase {name}: requests sent together in one "
                             f"request: {why}")
        many = {k: v for k, v in first.items()
                if k not in ("stream", "abandon_after_tokens", "keep_chunks")}

        async def job(group: Sequence[RequestSpec]) -> list[Completion]:
            return await self.client.acomplete_many([list(s.prompt.ids) for s in group], **many)
        return job

    async def _aissue(self, spec: RequestSpec, on_token=None) -> Completion:
        """Issue one spec on the client's event loop (the default request path of run_phase):
        ``/v1/completions``, or ``/v1/chat/completions`` for a spec with ``messages`` (or
        routed there by ``--api chat``)."""
        spec = self._route.get(id(spec), spec)
        args = self._request_args(spec)
        if spec.messages:
            return await self.client.achat(
                [{"role": r, "content": c} for r, c in spec.messages], spec.max_tokens,
                temperature=spec.temperature, ignore_eos=spec.ignore_eos,
                logprobs=args["logprobs"], seed=spec.seed, on_token=on_token,
                extra=args["extra"], stop=spec.stop, keep_chunks=spec.keep_chunks)
        return await self.client.acomplete(**args, on_token=on_token)

    def _record(self, ph: PhaseRecord, spec: RequestSpec, c: Completion) -> RequestRecord:
        """The record of ``spec``'s completion ``c`` in ``ph``, judged
        (:meth:`pleharness.run.judge.Judge.judge_request`) and appended to the manifest."""
        self._req_counter += 1
        rec = RequestRecord(
            id=f"r{self._req_counter:05d}", scenario=self.scenario_name, phase=ph.name,
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
        self.judge.judge_request(ph, spec, c, rec, self.checks_view)
        self.manifest.requests.append(rec)
        return rec


def _row(r: Any) -> Any:
    """A table row as stored: a pydantic model (TableRow) as its dict, anything else as is."""
    dump = getattr(r, "model_dump", None)
    return dump() if callable(dump) else r
