"""The run context: how scenarios issue phases, take references and record requests.

Exit codes are documented in :mod:`pleharness.errors` (re-exported here).
"""
from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from .engine.client import Completion, EngineClient
from .errors import EXIT_ENGINE, EXIT_FAIL, EXIT_OK, EXIT_USAGE, EngineError, UsageError  # noqa: F401
from .engine.facts import EngineFacts
from .engine.launch import EngineServer
from .manifest import (CheckResult, Divergence, Manifest, PhaseRecord, ReferenceRecord,
                       RequestRecord, SideEvidence, now_iso, write_manifest)
from .divergence import (DEFAULT_NEAR_TIE_NATS, analyse, first_divergence, golden_side,
                         is_half_precision, majority_side, margins, noise_floor, solo_gaps)
from .parity import token_hash
from .checks import DEFAULT_PHASE_CHECKS, PHASE_REGISTRY
from .request import Outcome, RequestSpec


def new_run_dir(results_dir: Path, run_id: str | None = None) -> tuple[str, Path]:
    """Create a fresh run folder ``results_dir/<run-id>``; never reuses an existing one.

    Raises UsageError when the folder cannot be created or ``run_id`` exists already.
    """
    if run_id is not None and (not run_id or "/" in run_id or run_id in (".", "..")
                               or "\\" in run_id or run_id.startswith(".")
                               or any(not c.isprintable() for c in run_id)):
        raise UsageError(f"--run-id {run_id!r}: a plain folder name is needed (no '/', no "
                         "leading '.', no control characters such as a newline)")
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"results directory {results_dir} cannot be created: {exc}") from None
    for _ in range(100):
        rid = run_id or datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        d = results_dir / rid
        try:
            d.mkdir(mode=0o700)  # owner only, like every file the run writes (issue 25)
            return rid, d
        except FileExistsError:
            if run_id:
                raise UsageError(f"run folder {d} exists already; results are never "
                                 "overwritten") from None
        except OSError as exc:
            raise UsageError(f"results directory {results_dir} is not writable: {exc}") from None
    raise UsageError(f"could not create a new run folder under {results_dir}")






class RequestTimeoutAbort(Exception):
    """Raised after a phase with timed-out requests when the policy is ``--on-timeout abort``."""


class _Watchdog:
    """Polls the engine while a phase runs (every ``interval_s``): the launched process must be
    alive and /health must answer 200. Two failed polls in a row mark the engine dead and cut off
    every request in flight, so a dead engine is noticed within a few seconds instead of after
    the request timeouts."""

    def __init__(self, ctx: "RunContext", interval_s: float = 2.0):
        import threading
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
    against a tolerance measured in the run (:meth:`RunContext.finish_judgement`).
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


class RunContext:
    """What scenarios use to issue phases: client, facts, references, manifest, progress.

    Built complete: ``options`` (a frozen :class:`RunOptions`) says how requests are issued and
    judged, ``golden`` is the golden model (:class:`pleharness.golden.GoldenModel`, or None) and
    ``references`` the references known up front (``--reference manifest:PATH`` / ``engine``).
    Request checks come from ``check_registry`` (default: every registered check,
    :data:`pleharness.checks.REGISTRY`; pass ``{}`` to run none, which records each as skipped).
    Phases are recorded in the manifest, which is written atomically after each one.
    """

    def __init__(self, client: EngineClient, manifest: Manifest, manifest_path: Path,
                 facts: EngineFacts, console: Console, server: EngineServer | None = None,
                 progress: Progress | None = None, check_registry: Mapping | None = None, *,
                 options: RunOptions = RunOptions(), golden=None,
                 references: Mapping[tuple, ReferenceRecord] | None = None):
        from .checks import REGISTRY
        self.client = client
        self.manifest = manifest
        self.manifest_path = manifest_path
        self.facts = facts
        self.console = console
        self.server = server
        self.progress = progress
        self.options = options
        self.golden = golden
        self.references: dict[tuple, ReferenceRecord] = dict(references or {})
        self.check_registry = REGISTRY if check_registry is None else check_registry
        self._req_counter = 0
        self._prompt_builders: dict[tuple[str, int], Any] = {}
        self.golden_error: str | None = None  # why the golden classifier stopped being used
        self.scenario_name = ""  # set by in_scenario()
        self.phase_prefix = ""
        self.repeat_index = 1
        # (record, prompt, output) of the solo reference runs: the half-precision noise floor
        self._solo_runs: list[tuple[RequestRecord, list[int], list[int]]] = []

    # the options, read-only (a context is built with them; they do not change during a run)
    on_timeout = property(lambda self: self.options.on_timeout)
    logprobs = property(lambda self: self.options.logprobs)
    near_tie_nats = property(lambda self: self.options.near_tie_nats)
    strict = property(lambda self: self.options.strict)
    reference_mode = property(lambda self: self.options.reference_mode)
    reference_cache_state = property(lambda self: self.options.reference_cache_state)
    reference_source = property(lambda self: self.options.reference_source)
    collect_only = property(lambda self: self.options.collect_only)

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

    # -- for scenarios ----------------------------------------------------------------------------
    def issue(self, spec: RequestSpec, on_token: Callable[[int], None] | None = None
              ) -> Completion:
        """Send one request now and wait for it (blocking; no phase, no record): for scenarios'
        custom ``issue`` functions of :meth:`run_phase` (e.g. to scrape /metrics around it).
        ``on_token(n)``: called with the streamed token count so far, on the client's event loop
        thread (keep it short), e.g. to trigger an insert (:mod:`pleharness.scenarios.inserting`).
        Returns the Completion (errors recorded in it, never raised)."""
        return self.client.complete(**self._request_args(spec), on_token=on_token)

    def prompt_builder(self, filler: str, tail: int):
        """The engine's :class:`pleharness.prompts.ChatPromptBuilder` for ``filler`` (one token)
        and ``tail`` (generation-prompt tail tokens), built once per context (it asks the
        engine's tokenizer). Raises ValueError when ``filler`` is not exactly one token."""
        from .prompts import ChatPromptBuilder
        key = (filler, tail)
        if key not in self._prompt_builders:
            self._prompt_builders[key] = ChatPromptBuilder(self.client, filler, tail)
        return self._prompt_builders[key]

    def add_phase_check(self, ph: PhaseRecord, check: CheckResult,
                        reason: str | None = None) -> None:
        """Add a scenario's own check to phase ``ph`` (already recorded); a failing check fails
        the phase, with ``reason`` (default: the check's detail) added to ``ph.reason``."""
        ph.checks.append(check)
        if check.status == "fail":
            ph.status = "fail"
            ph.reason = (ph.reason + "; " if ph.reason else "") + (reason or check.detail)

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

    # -- references -------------------------------------------------------------------------------
    def take_references(self, specs: Sequence[RequestSpec], phase_name: str = "references",
                        cache_state: str | None = None) -> PhaseRecord | None:
        """Run each not-yet-referenced (prompt, max_tokens) alone, one request in flight.

        The outputs become the single-request references that later phases are compared with.
        ``cache_state`` (default ``self.reference_cache_state``): ``cold`` keeps each prompt's
        first run; ``warm`` runs each prompt alone twice (phases ``<name>-cold`` and ``<name>``),
        compares the second (prefix-cached) run with the first (a difference is analysed like any
        divergence: a near tie is a warning, a hard one fails) and keeps the second. Later load
        requests are warm too, so warm references compare like with like; cold-vs-warm is then
        judged once per prompt here, and by the boundary scenario. Seen on an H200 with a
        random-weight bf16 model: a prompt whose cold run and warm runs broke an exact top-1/top-2
        tie differently (docs/gpu-runs/README.md).

        Returns the phase record of the kept outputs, or None when nothing was run (every
        reference exists already, or references come from elsewhere: ``--reference
        manifest:PATH`` / ``engine``, where a missing reference is an explicit parity failure).
        """
        if self.reference_mode not in ("solo", "golden") and not self.collect_only:
            return None
        state = cache_state or self.reference_cache_state
        todo, seen = [], set()
        for s in specs:
            if s.ref_key not in self.references and s.ref_key not in seen:
                seen.add(s.ref_key)
                # a copy keeps the sampling (temperature, seed); references always stream
                todo.append(replace(s, compare=False, stream=True))
        if not todo:
            return None
        if self.reference_mode == "golden" and not self.collect_only:
            return self._golden_references(todo, phase_name, state)
        if state == "warm":
            cold = self.run_phase(phase_name + "-cold", 1, todo, role="reference")
            self.store_references(cold, "cold")
            again = [replace(s, compare=True) for s in todo]
            outcomes = self.run_phase(phase_name, 1, again, role="reference")
            self.store_references(outcomes, "warm")
        else:
            outcomes = self.run_phase(phase_name, 1, todo, role="reference")
            self.store_references(outcomes, "cold")
        return self.manifest.phases[-1]

    def _golden_references(self, todo: Sequence[RequestSpec], phase_name: str,
                           state: str) -> PhaseRecord:
        """``--reference golden``: each prompt's reference is the golden model's greedy
        continuation (:mod:`pleharness.golden`); the engine's own single-request runs (cold, then
        warm when ``state`` is warm) are then compared with it like any other request."""
        from .golden import GoldenError
        if self.golden is None:
            raise GoldenError("--reference golden: no golden model")
        for s in todo:
            g = self.golden.generate(list(s.prompt.ids), s.max_tokens)
            ref = ReferenceRecord(
                prompt_key=s.prompt.key, prompt_hash=s.prompt.hash, prompt_len=len(s.prompt),
                max_tokens=s.max_tokens, output_hash=token_hash(g.ids), output_ids=list(g.ids),
                margins=g.margins(), top_ids=[[t for t, _ in top] for top in g.top],
                source="golden", cache_state="n/a")
            self.references[s.ref_key] = ref
            self.manifest.references.append(ref)
        self.save()
        solo = [RequestSpec(s.prompt, s.max_tokens, compare=True, logprobs=s.logprobs,
                            checks=s.checks) for s in todo]
        if state == "warm":
            self.run_phase(phase_name + "-cold", 1, solo, role="reference")
        self.run_phase(phase_name, 1, solo, role="reference")
        return self.manifest.phases[-1]

    def store_references(self, outcomes: Sequence[Outcome], cache_state: str) -> None:
        """Make successful outcomes the references of their (prompt, max_tokens), replacing a
        previous (cold) reference of the same key and keeping its hash as ``cold_output_hash``."""
        for o in outcomes:
            c = o.completion
            if c.error is not None:
                continue
            old = self.references.get(o.spec.ref_key)
            ref = ReferenceRecord(
                prompt_key=o.spec.prompt.key, prompt_hash=o.spec.prompt.hash,
                prompt_len=len(o.spec.prompt), max_tokens=o.spec.max_tokens,
                output_hash=token_hash(c.token_ids), output_ids=list(c.token_ids),
                margins=margins(c.logprobs), source=self.reference_source,
                top_ids=[sorted(t) for t in c.logprobs] if c.logprobs is not None else None,
                cache_state=cache_state, request_id=o.record.id,
                cold_output_hash=old.output_hash if old is not None else None,
                temperature=o.spec.temperature, seed=o.spec.seed)
            if old is not None:
                self.manifest.references = [r for r in self.manifest.references if r is not old]
            self.references[o.spec.ref_key] = ref
            self.manifest.references.append(ref)
        self.save()

    # -- phases -----------------------------------------------------------------------------------
    def run_phase(self, name: str, concurrency: int, specs: Sequence[RequestSpec], *,
                  counts_for_throughput: bool = True, role: str = "load",
                  issue: Callable[[RequestSpec], Completion] | None = None,
                  on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """Issue ``specs`` keeping exactly ``concurrency`` requests in flight; record the phase.

        ``on_outcome(outcome)``: called for each finished request once its record is made and
        before the phase is judged and written, so that a scenario can add checks to
        ``outcome.record`` (records are appended to the records file when the phase is written
        and not rewritten afterwards). Returns the outcomes in the order of ``specs``. Raises EngineError when requests failed
        because the engine died (the phase is recorded first).
        """
        if concurrency < 1:
            raise UsageError(f"phase {name}: concurrency must be >= 1")
        if self.collect_only and role != "reference":
            return []  # reference pass on the reference engine: only references are taken
        name = self.phase_prefix + name
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
        # the default request path runs on the client's event loop (no thread per request);
        # a custom ``issue`` (which may block) runs in a pool of ``concurrency`` threads
        job = self._aissue if issue is None else issue

        def done(_i: int) -> None:
            if task is not None:
                self.progress.advance(task)

        from . import evidence
        from .engine import metrics
        before = metrics.snapshot(self.client)
        t0 = time.monotonic()
        batch = self.client.run_batch(specs, concurrency, job, on_done=done)
        watchdog = _Watchdog(self)
        try:
            completions = batch.wait()
        except BaseException:
            # interrupted: keep (record and compare) the requests that had finished, abandon the
            # ones in flight; the phase is "interrupted" (or "not_run" when none had finished)
            finished = [(specs[i], c) for i, c in batch.finished()]
            batch.cancel()  # start no further request
            self.client.abort_all("harness interrupted")
            ph.wall_s = time.monotonic() - t0
            if finished:
                outs = [Outcome(s, c, self._record(ph, s, c)) for s, c in finished]
                self._finish_phase(ph, outs)
            ph.status = "interrupted" if finished else "not_run"
            ph.reason = (f"interrupted after {len(finished)} of {len(specs)} requests finished"
                         + (f" ({ph.reason})" if finished and ph.reason else ""))
            ph.ended_at = now_iso()
            if task is not None:
                self.progress.remove_task(task)
            self.save()
            raise
        finally:
            watchdog.stop()
        ph.wall_s = time.monotonic() - t0
        ph.ended_at = now_iso()
        if task is not None:
            self.progress.remove_task(task)
        outcomes = [Outcome(s, c, self._record(ph, s, c)) for s, c in zip(specs, completions)]
        ph.engaged = evidence.phase_evidence(before, metrics.snapshot(self.client), completions,
                                             [len(s.prompt) for s in specs],
                                             self.facts.get("max_num_batched_tokens"))
        if on_outcome is not None:
            for o in outcomes:
                on_outcome(o)
        if any(o.record.match is False for o in outcomes):  # kept for `ple-harness explain`
            for o in outcomes:
                self.manifest.prompts.setdefault(o.spec.prompt.hash, list(o.spec.prompt.ids))
        for name in DEFAULT_PHASE_CHECKS:
            ph.checks.append(PHASE_REGISTRY[name](self, ph))
        healthy = all(c.status != "fail" for c in ph.checks if c.name == "health_after_phase")
        self._finish_phase(ph, outcomes)
        peak = ph.engaged.get("in_flight_peak")
        if role == "load" and concurrency > 1 and len(specs) > 1 and peak == 1:
            evidence.mark_vacuous(self, ph, f"C{concurrency} phase: at most 1 of its requests "
                                  "was in flight at any time (each ended before the next began)")
        self.save()
        if watchdog.dead is not None:
            ph.reason = (ph.reason + "; " if ph.reason else "") + f"engine died: {watchdog.dead}"
            self.save()
            self.ensure_engine_alive()
            raise EngineError(f"engine died during phase {name}: {watchdog.dead}",
                              self.server.root_cause() if self.server else None,
                              str(self.server.log_path) if self.server else None)
        if not healthy or any(o.completion.error in ("connection", "aborted")
                              for o in outcomes):
            self.ensure_engine_alive()
        if self.on_timeout == "abort" and any(o.completion.error == "timeout" for o in outcomes):
            raise RequestTimeoutAbort(f"phase {name}: request(s) timed out and the policy is "
                                      "--on-timeout abort")
        return outcomes

    def _request_args(self, spec: RequestSpec) -> dict[str, Any]:
        lp = spec.logprobs if spec.logprobs is not None else self.logprobs
        return {"prompt_ids": list(spec.prompt.ids), "max_tokens": spec.max_tokens,
                "logprobs": lp, "temperature": spec.temperature, "seed": spec.seed,
                "stream": spec.stream}

    def _issue(self, spec: RequestSpec, on_token: Callable[[int], None] | None = None
               ) -> Completion:  # the old name; scenarios call issue()
        return self.issue(spec, on_token=on_token)

    async def _aissue(self, spec: RequestSpec) -> Completion:
        """Issue one spec on the client's event loop (the default request path of run_phase)."""
        return await self.client.acomplete(**self._request_args(spec))

    def _record(self, ph: PhaseRecord, spec: RequestSpec, c: Completion) -> RequestRecord:
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
            seed=spec.seed, stream=spec.stream,
            error_expected=bool(spec.accept_4xx and c.error == "http" and c.http_status is not None
                                and 400 <= c.http_status < 500))
        if spec.compare:
            ref = self.references.get(spec.ref_key)
            if ref is None:
                rec.match = False
                rec.checks.append(CheckResult(name="parity", status="fail",
                                              detail="no single-request reference for this prompt"))
            elif c.error is None:
                rec.reference_hash = ref.output_hash
                rec.match = rec.output_hash == ref.output_hash
                if not rec.match:
                    rec.first_divergence = first_divergence(ref.output_ids, c.token_ids)
                    rec.output_ids = list(c.token_ids)
            else:
                rec.reference_hash = ref.output_hash
                rec.match = False
        for check_name, params in spec.checks.items():
            check = self.check_registry.get(check_name)
            if check is None:
                rec.checks.append(CheckResult(name=check_name, status="skip",
                                              detail="check not registered"))
            else:
                rec.checks.append(check(self, spec, c, params))
        if rec.match is False and c.error is None and rec.first_divergence is not None:
            self._judge(ph, rec, spec, c, self.references[spec.ref_key])
        if (ph.role == "reference" and c.error is None and self.golden is not None
                and is_half_precision(self.options.serving_dtype)):
            self._solo_runs.append((rec, list(spec.prompt.ids), list(c.token_ids)))
        self.manifest.requests.append(rec)
        return rec

    def _judge(self, ph: PhaseRecord, rec: RequestRecord, spec: RequestSpec, c: Completion,
               ref: ReferenceRecord, again: bool = False) -> Divergence:
        """Analyse the divergence of ``rec`` (output ``c``) from ``ref``, judge which side is wrong
        where the golden model can (:func:`pleharness.divergence.golden_side`; else the majority
        pass at the end of the run, :func:`judge_sides`), add the parity check. A corrupt
        reference (the golden model finds the reference's token implausible) fails its own run
        (:meth:`_corrupt_reference`) and is replaced by the golden continuation, against which
        ``rec`` is judged again."""
        failed = [ch.name for ch in rec.checks if ch.status == "fail" and ch.name != "parity"]
        pos = rec.first_divergence
        g = self._golden_evidence(spec, ref.output_ids, c.token_ids, pos)
        d = analyse(ref.output_ids, c.token_ids, pos, ref.margins, self.near_tie_nats, failed,
                    golden=g,
                    reference_top=ref.top_ids[pos] if ref.top_ids and pos < len(ref.top_ids)
                    else None,
                    observed_top=c.logprobs[pos] if c.logprobs and pos < len(c.logprobs)
                    else None)
        if self.strict or spec.temperature > 0:  # a seeded sample has no near-tie excuse
            d.fails = True
        ev = SideEvidence(reference_run=ref.request_id, reference_source=ref.source,
                          observed_run=rec.id, observed_role=ph.role)
        if g is not None:
            side, why = golden_side(d.reference_token, d.observed_token, g, self.near_tie_nats)
            lps = {int(k): float(v) for k, v in g["logprobs"].items()}
            ev.method, ev.tolerance_nats, ev.detail = "golden", self.near_tie_nats, why
            if d.reference_token in lps:
                ev.golden_logprob_reference = round(lps[d.reference_token], 6)
            if d.observed_token in lps:
                ev.golden_logprob_observed = round(lps[d.observed_token], 6)
            d.corrupt_side = side
        d.side_evidence = ev
        rec.divergence = d
        m = "n/a (no reference logprobs)" if d.margin_nats is None else \
            f"{d.margin_nats:.4f} nats"
        gg = "" if d.golden_gap_nats is None else f", golden gap {d.golden_gap_nats:.4f} nats"
        if d.classified_by == "golden" and not d.observed_in_golden_top:
            gg += " (observed token not in the golden top-k)"
        rec.checks = [ch for ch in rec.checks if ch.name != "parity"]
        rec.checks.append(CheckResult(
            name="parity", status="fail" if d.fails else "warn",
            detail=(side_sentence(d, rec.prompt_key) + "; " if d.corrupt_side in
                    ("reference", "load") else "")
                   + f"{d.cls} at position {d.position}: reference "
                   f"{d.reference_token} vs observed {d.observed_token}, reference "
                   f"top-1/top-2 margin {m}{gg}; threshold {self.near_tie_nats:g} nats"
                   + (" (strict)" if self.strict else "")
                   + (" (seeded sample: never a near tie)" if spec.temperature > 0 else "")))
        if d.corrupt_side == "reference" and d.fails and ref.source != "golden" and not again:
            self._corrupt_reference(ph, rec, spec, c, ref, d)
        return d

    def _corrupt_reference(self, ph: PhaseRecord, rec: RequestRecord, spec: RequestSpec,
                           c: Completion, ref: ReferenceRecord, d: Divergence) -> None:
        """The golden model says ``ref`` is the corrupt side of ``rec``'s divergence: the run it
        came from fails (check ``corrupt_reference``; on ``rec`` itself when that run is not in
        this manifest), the kept reference is replaced by the golden continuation (recorded with
        ``replaces``), and ``rec`` is judged again against it."""
        from .golden import GoldenError
        text = side_sentence(d, rec.prompt_key)
        mark_corrupt_reference(self.manifest, ref, rec, text)
        self.manifest.summary.setdefault("corrupt_references", []).append(
            {"reference_run": ref.request_id, "reference_source": ref.source,
             "prompt_key": ref.prompt_key, "prompt_hash": ref.prompt_hash,
             "max_tokens": ref.max_tokens, "method": "golden", "evidence": text,
             "revealed_by": rec.id, "judged_against": "golden continuation"})
        if self.references.get(spec.ref_key) is not ref:
            return
        try:
            gold = self.golden.generate(list(spec.prompt.ids), spec.max_tokens)
        except GoldenError as exc:
            self.manifest.summary["corrupt_references"][-1]["judged_against"] = \
                f"the corrupt reference (golden continuation failed: {exc})"
            return
        new = ReferenceRecord(
            prompt_key=ref.prompt_key, prompt_hash=ref.prompt_hash, prompt_len=ref.prompt_len,
            max_tokens=ref.max_tokens, output_hash=token_hash(gold.ids),
            output_ids=list(gold.ids), margins=gold.margins(),
            top_ids=[[t for t, _ in top] for top in gold.top], source="golden",
            cache_state="n/a", temperature=ref.temperature, seed=ref.seed,
            replaces=f"{ref.request_id or ref.source}: {text}")
        self.references[spec.ref_key] = new
        self.manifest.references = [r for r in self.manifest.references if r is not ref] + [new]
        rejudge(rec, new, "the golden continuation (it replaced the corrupt reference "
                f"{ref.request_id or ref.source})")
        if rec.match is False:
            rec.first_divergence = first_divergence(new.output_ids, c.token_ids)
            self._judge(ph, rec, spec, c, new, again=True)

    def finish_judgement(self) -> None:
        """After the suite, on a half-precision engine with a golden model: measure the noise
        floor (every solo reference run that did not fail teacher-forced through the golden model,
        :func:`pleharness.divergence.noise_floor`), record the tolerance and where it came from in
        ``run_options["golden_tolerance"]``, and judge every golden divergence again against it
        (a gap below it is a near tie; above it stays hard). Float32 engines: nothing changes."""
        if self.golden is None or not is_half_precision(self.options.serving_dtype):
            return
        from .golden import GoldenError
        gaps: list[float] = []
        # a solo run that failed (a corrupt reference, a failed check) is no noise floor: its
        # corrupted tokens would open the tolerance for the very corruption they show
        runs = [(p, o) for r, p, o in self._solo_runs if not r.failed_checks]
        try:
            for prompt, out in runs:
                gaps += solo_gaps(self.golden.force(prompt, out), out)
        except GoldenError as exc:
            self.manifest.run_options["golden_tolerance"] = {
                "source": f"not measured (golden model failed: {exc})",
                "tolerance_nats": self.near_tie_nats}
            return
        tol, info = noise_floor(gaps, self.options.serving_dtype, self.near_tie_nats)
        info["solo_runs_scored"] = len(runs)
        info["solo_runs_left_out"] = len(self._solo_runs) - len(runs)
        self.manifest.run_options["golden_tolerance"] = info
        changed = set()
        for r in self.manifest.requests:
            d = r.divergence
            if d is None or d.classified_by != "golden" or r.match is not False:
                continue
            d.golden_tolerance_nats = tol
            cls = "near_tie" if d.golden_gap_nats is not None and d.golden_gap_nats < tol \
                else "hard"
            if cls == d.cls:
                continue
            d.cls = cls
            d.fails = (cls != "near_tie" or bool(d.checks_failed) or self.strict
                       or r.temperature > 0)
            for ch in r.checks:
                if ch.name == "parity":
                    ch.status = "fail" if d.fails else "warn"
                    ch.detail += (f"; {cls} against the measured half-precision golden "
                                  f"tolerance {tol:g} nats")
            changed.add(r.phase)
        refinish(self.manifest, changed)
        self.save()

    def _golden_evidence(self, spec: RequestSpec, reference: Sequence[int],
                         observed: Sequence[int], pos: int) -> dict | None:
        """Teacher-forced golden logprobs at the first divergent position ``pos`` (the common
        prefix is prompt + observed[:pos]); None without a golden model. A golden model that
        fails is recorded once (``golden_error``) and not asked again."""
        if self.golden is None or self.golden_error is not None:
            return None
        toks = [t for t in (reference[pos] if pos < len(reference) else None,
                            observed[pos] if pos < len(observed) else None) if t is not None]
        if len(toks) < 2:
            return None
        from .golden import GoldenError
        try:
            lps, top = self.golden.score(list(spec.prompt.ids), list(observed[:pos]), toks)
        except GoldenError as exc:
            self.golden_error = str(exc)
            self.manifest.run_options["golden_classifier_error"] = self.golden_error
            from rich.markup import escape
            self.console.print(f"[yellow]warning:[/yellow] golden classifier off: "
                               f"{escape(self.golden_error)}")
            return None
        return {"logprobs": lps, "top": top}

    @staticmethod
    def _finish_phase(ph: PhaseRecord, outcomes: list[Outcome]) -> None:
        recs = [o.record for o in outcomes]
        ph.matched = sum(1 for r in recs if r.match is True)
        ph.near_ties = sum(1 for r in recs if r.tolerated)
        ph.mismatched = sum(1 for r in recs if r.parity_failed)
        ph.errors = sum(1 for r in recs if r.request_error)
        ph.completion_tokens = sum(r.output_len for r in recs if r.error is None)
        ph.requests = len(recs)
        if ph.wall_s:
            ph.decode_tok_per_s = ph.completion_tokens / ph.wall_s
        ttfts = [r.ttft_s for r in recs if r.ttft_s is not None]
        lats = [r.latency_s for r in recs if r.latency_s is not None and r.error is None]
        ph.ttft_s_median = statistics.median(ttfts) if ttfts else None
        ph.latency_s_median = statistics.median(lats) if lats else None
        # parity failures are counted as mismatches, not as failed checks
        failed_checks = [c for r in recs for c in r.failed_checks if c.name != "parity"]
        failed_checks += [c for c in ph.checks if c.status == "fail"]
        if any(r.is_problem for r in recs) or failed_checks:
            ph.status = "fail"
            why = []
            if ph.mismatched:
                why.append(f"{ph.mismatched} hash mismatch(es)")
            if ph.errors:
                why.append(f"{ph.errors} request error(s)")
            if failed_checks:
                why.append(f"{len(failed_checks)} failed check(s)")
            ph.reason = ", ".join(why) or "failed request(s)"
        else:
            ph.status = "pass"
            aic = sum(1 for r in recs if r.tolerated
                      and r.divergence.attribution == "also_in_control")
            why = []
            if ph.near_ties - aic:
                why.append(f"{ph.near_ties - aic} near-tie divergence(s) (warning)")
            if aic:
                why.append(f"{aic} divergence(s) also in the control run (warning)")
            ph.reason = "; ".join(why)


# -- which side is wrong: shared by the golden path above and the majority pass ----------------

def _tok(t) -> str:
    return "its end" if t is None else f"token {t}"


def side_sentence(d: Divergence, prompt_key: str) -> str:
    """'the reference run r00003 of prompt chat-len4 is the outlier: golden logprob of its token
    60 is -3.46, of the load run r00017's token 120 is -0.06' (or the majority's vote counts)."""
    ev = d.side_evidence or SideEvidence()
    ref_run = (f"the reference run {ev.reference_run}" if ev.reference_run else
               f"the reference ({ev.reference_source or 'elsewhere'})")
    obs_run = f"the {ev.observed_role or 'load'} run {ev.observed_run}"
    if d.corrupt_side == "reference":
        who, other, own_tok, other_tok = ref_run, obs_run, d.reference_token, d.observed_token
        own_lp, other_lp = ev.golden_logprob_reference, ev.golden_logprob_observed
        own_votes, other_votes = ev.votes_reference, ev.votes_observed
    elif d.corrupt_side == "load":
        who, other, own_tok, other_tok = obs_run, ref_run, d.observed_token, d.reference_token
        own_lp, other_lp = ev.golden_logprob_observed, ev.golden_logprob_reference
        own_votes, other_votes = ev.votes_observed, ev.votes_reference
    else:
        return (f"undecided which side of prompt {prompt_key}'s divergence is wrong "
                f"({ev.detail or 'no evidence'})")
    head = f"{who} of prompt {prompt_key} is the outlier: "
    if ev.method == "golden" and own_lp is not None and other_lp is not None:
        return (head + f"golden logprob of its {_tok(own_tok)} is {own_lp:.2f}, of {other}'s "
                f"{_tok(other_tok)} is {other_lp:.2f}")
    if ev.method == "majority":
        return (head + f"{own_votes} of {ev.votes_total} runs of this prompt gave its output, "
                f"{other_votes} gave {other}'s")
    return head + ev.detail


def refinish(manifest: Manifest, phase_names: set[str]) -> None:
    """Recompute the aggregates and status of the named phases from their records, and say that
    records were changed in place (:meth:`Manifest.records_changed`)."""
    if not phase_names:
        return
    from types import SimpleNamespace
    by_phase: dict[str, list] = {}
    for r in manifest.requests:
        by_phase.setdefault(r.phase, []).append(SimpleNamespace(record=r))
    for ph in manifest.phases:
        if ph.name in phase_names:
            RunContext._finish_phase(ph, by_phase.get(ph.name, []))
    manifest.records_changed()


def mark_corrupt_reference(manifest: Manifest, ref: ReferenceRecord, rec: RequestRecord,
                           text: str) -> None:
    """Fail the run that produced the corrupt reference ``ref`` (check ``corrupt_reference``,
    with ``text``); when that run is not in ``manifest`` (a reference from another engine or
    manifest), the check goes on ``rec``, the run that revealed it. Phases are re-finished."""
    target = next((r for r in manifest.requests if ref.request_id and r.id == ref.request_id),
                  None) or rec
    if not any(ch.name == "corrupt_reference" for ch in target.checks):
        target.checks.append(CheckResult(name="corrupt_reference", status="fail", detail=text))
    if target is not rec:
        refinish(manifest, {target.phase})


def rejudge(rec: RequestRecord, new: ReferenceRecord, what: str) -> None:
    """Judge ``rec`` again against ``new`` (the output that replaced a corrupt reference): equal
    means it matches (its divergence from the corrupt reference is kept as evidence, no longer
    failing); otherwise it stays a mismatch (the caller analyses it again)."""
    if rec.output_hash == new.output_hash:
        rec.match = True
        rec.reference_hash = new.output_hash
        d = rec.divergence
        if d is not None:
            d.fails = False
            if d.side_evidence is not None:
                d.side_evidence.judged_against = what
        for ch in rec.checks:
            if ch.name == "parity":
                ch.status = "pass"
                ch.detail = f"matches {what}; it differed from the corrupt reference: " + ch.detail
    else:
        rec.reference_hash = new.output_hash


def _vote_key(r: RequestRecord) -> tuple:
    """(prompt hash, max_tokens, temperature, seed): the runs that vote together, and (with the
    reference hash) the key of a corrupt reference: a greedy and a seeded request of one prompt
    can have equal references (a one-token answer often is the greedy token) and are still
    judged apart."""
    return (r.prompt_hash, r.max_tokens, r.temperature, r.seed)


def judge_sides(main: Manifest, control: Manifest | None = None) -> dict[str, int]:
    """The majority pass, after the suite (and the control run): every divergence whose side the
    golden model did not decide is judged by the majority over every run of the same prompt,
    sampling and max_tokens in the run: the cold and warm solo references, the load repeats, and
    the control run's twins (``control``, any concurrency) (:func:`majority_side`). A reference
    judged corrupt fails the run that produced it (check ``corrupt_reference``), is replaced in
    ``main.references`` by the majority output (source ``majority``, ``replaces`` says which
    run), and every run compared with it is judged again against that output. Only a failing
    divergence (hard or unknown, not a near tie or a control-explained one) makes its reference
    corrupt; a near tie still records which side is the outlier
    (``side_evidence.judged_against``; ``summary.corrupt_references`` lists each).

    Returns counts by corrupt side {"reference", "load", "undecided"} over all divergences."""
    votes: dict[tuple, dict[str, list[str]]] = {}
    for src, ms in (("", main), ("control:", control)):
        for r in (ms.requests if ms is not None else []):
            if r.error is None and r.output_hash is not None:
                votes.setdefault(_vote_key(r), {}).setdefault(r.output_hash, []).append(
                    src + r.id)
    ids_by_hash = {r.output_hash: r.output_ids for r in main.requests if r.output_ids}
    refs = {(x.prompt_hash, x.max_tokens, x.temperature, x.seed, x.output_hash): x
            for x in main.references}
    run_ids = {r.id for r in main.requests}
    corrupt: dict[tuple, tuple[str, list[RequestRecord]]] = {}
    changed: set[str] = set()
    for r in main.requests:
        d = r.divergence
        if d is None or d.corrupt_side in ("reference", "load"):
            continue
        ev = d.side_evidence or SideEvidence(observed_run=r.id)
        v = votes.get(_vote_key(r), {})
        if ev.reference_run is None or ev.reference_run not in run_ids:
            v = {**v, r.reference_hash or "": list(v.get(r.reference_hash or "", []))
                 + [f"reference ({ev.reference_source or 'elsewhere'})"]}
        if ev.reference_source == "golden":
            continue  # the golden model's own continuation: judged by the golden model only
        side, why = majority_side(r.reference_hash, r.output_hash, v)
        ev.method, ev.detail = "majority", why
        ev.votes_reference = len(v.get(r.reference_hash or "", ()))
        ev.votes_observed = len(v.get(r.output_hash or "", ()))
        ev.votes_total = sum(len(x) for x in v.values())
        ev.voters = {h[:12]: ids[:20] for h, ids in v.items()}
        d.side_evidence, d.corrupt_side = ev, side
        changed.add(r.phase)
        if side == "reference" and d.fails:  # a near tie is an outlier, not corruption
            corrupt.setdefault(_vote_key(r) + (r.reference_hash,), (r.output_hash, []))[1] \
                .append(r)
        if side == "load":
            for ch in r.checks:
                if ch.name == "parity" and "is the outlier" not in ch.detail:
                    ch.detail = side_sentence(d, r.prompt_key) + "; " + ch.detail
    for key, (_, revealed) in corrupt.items():
        ph_, mt, bad_hash = key[0], key[1], key[-1]
        v = votes.get(key[:-1], {})
        best = max((h for h in v if h != bad_hash), key=lambda h: len(v[h]))
        first = revealed[0]
        d = first.divergence
        text = side_sentence(d, first.prompt_key)
        ref = refs.get(key) or ReferenceRecord(
            prompt_key=first.prompt_key, prompt_hash=ph_, prompt_len=first.prompt_len,
            max_tokens=mt, output_hash=bad_hash or "", output_ids=[],
            request_id=d.side_evidence.reference_run, source=d.side_evidence.reference_source
            or "solo")
        mark_corrupt_reference(main, ref, first, text)
        what = (f"the majority output {best[:12]} ({len(v[best])} of "
                f"{sum(len(x) for x in v.values())} runs; it replaced the corrupt reference "
                f"{ref.request_id or ref.source})")
        best_ids = ids_by_hash.get(best)
        if best_ids is None:  # every record with it matched: the reference it matched has it
            best_ids = next((x.output_ids for x in main.references if x.output_hash == best), [])
        new = ReferenceRecord(
            prompt_key=first.prompt_key, prompt_hash=ph_, prompt_len=first.prompt_len,
            max_tokens=mt, output_hash=best, output_ids=list(best_ids), source="majority",
            cache_state="n/a", temperature=first.temperature, seed=first.seed,
            replaces=f"{ref.request_id or ref.source}: {text}")
        if ref in main.references:
            main.references = [x for x in main.references if x is not ref] + [new]
        main.summary.setdefault("corrupt_references", []).append(
            {"reference_run": ref.request_id, "reference_source": ref.source,
             "prompt_key": first.prompt_key, "prompt_hash": ph_, "max_tokens": mt,
             "method": "majority", "evidence": text, "revealed_by": first.id,
             "judged_against": what})
        for r in main.requests:
            if _vote_key(r) + (r.reference_hash,) != key \
                    or r.match is None or r.divergence is None:
                continue
            rejudge(r, new, what)
            if r.match is False and best_ids and r.output_ids:
                pos = first_divergence(best_ids, r.output_ids)
                r.first_divergence = pos
                nd = analyse(best_ids, r.output_ids, pos, None, r.divergence.threshold_nats
                             or DEFAULT_NEAR_TIE_NATS, r.divergence.checks_failed)
                nd.corrupt_side = "load"
                nd.side_evidence = SideEvidence(
                    method="majority", observed_run=r.id, reference_source="majority",
                    judged_against=what, detail="differs from the majority output too")
                r.divergence = nd
                for ch in r.checks:
                    if ch.name == "parity":
                        ch.status = "fail" if nd.fails else "warn"
                        ch.detail = (f"differs from {what} at position {pos} too ({nd.cls}); "
                                     + ch.detail)
            changed.add(r.phase)
    refinish(main, changed)
    counts = {"reference": 0, "load": 0, "undecided": 0}
    for r in main.requests:
        if r.divergence is not None and r.divergence.corrupt_side in counts:
            counts[r.divergence.corrupt_side] += 1
    main.summary["corrupt_side"] = counts
    return counts
