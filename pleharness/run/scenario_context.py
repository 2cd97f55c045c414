"""The contract a scenario kind codes against: :class:`ScenarioContext`, what its ``run(ctx)``
gets (docs/extending.md), each member typed and delegating to the run context
(:class:`pleharness.run.context.RunContext`, ``RunContext`` below), with no way to the
manifest or to saving it; and :class:`Mark`, a point in the run.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from ..engine.client import EngineClient
from ..engine.completion import Completion
from ..engine.facts import EngineFacts
from ..manifest import CheckResult, PhaseRecord, ReferenceRecord, RequestRecord
from ..prompts import ChatPromptBuilder
from ..request import Outcome, RequestSpec
from .phases import PhaseResult


@dataclass(frozen=True)
class Mark:
    """A point in the run (:meth:`ScenarioContext.mark`): how many phases and records
    existed."""

    phases: int
    requests: int


class ScenarioContext:
    """What a scenario kind's ``run(ctx)`` gets: the whole contract (docs/extending.md), a
    facade over the :class:`~pleharness.run.context.RunContext` that has no way to the manifest
    or to saving it.

    Its public members are the contract, each delegating to the run context's member of the
    same name: read-only properties (the engine's facts and client, the output, the
    references, the run's options and names) and the methods that issue phases and requests,
    take references and keep tables and notes. Any other name is an AttributeError that names
    the contract.
    """

    __slots__ = ("_run",)

    def __init__(self, run):
        self._run = run  # the pleharness.run.context.RunContext behind the facade

    def __getattr__(self, name: str) -> Any:
        # only names outside the contract get here (and a contract property whose getter
        # raised AttributeError: the run context's own error comes back)
        if not name.startswith("_") and name in vars(ScenarioContext):
            return getattr(self._run, name)
        raise AttributeError(f"a scenario's context has no {name!r} (the contract: "
                             "pleharness.run.scenario_context.ScenarioContext, docs/extending.md)")

    # -- read-only --------------------------------------------------------------------------------
    @property
    def facts(self) -> EngineFacts:
        """The engine's facts (:attr:`RunContext.facts`)."""
        return self._run.facts

    @property
    def client(self) -> EngineClient:
        """The engine client, for /metrics around a request (:attr:`RunContext.client`)."""
        return self._run.client

    @property
    def console(self) -> Console:
        """The console (:attr:`RunContext.console`)."""
        return self._run.console

    @property
    def progress(self) -> Progress | None:
        """The progress display, if any (:attr:`RunContext.progress`)."""
        return self._run.progress

    @property
    def references(self) -> Mapping[tuple, ReferenceRecord]:
        """The references by request key, read-only (:attr:`RunContext.references`)."""
        return self._run.references

    @property
    def strict(self) -> bool:
        """Whether every divergence fails (:attr:`RunContext.strict`)."""
        return self._run.strict

    @property
    def near_tie_nats(self) -> float:
        """The run's near-tie threshold in nats (:attr:`RunContext.near_tie_nats`)."""
        return self._run.near_tie_nats

    @property
    def reference_mode(self) -> str:
        """solo | manifest | engine | golden (:attr:`RunContext.reference_mode`)."""
        return self._run.reference_mode

    @property
    def reference_cache_state(self) -> str:
        """cold | warm (:attr:`RunContext.reference_cache_state`)."""
        return self._run.reference_cache_state

    @property
    def engine_probe(self) -> dict[str, Any]:
        """What the engine probe measured (:attr:`RunContext.engine_probe`)."""
        return self._run.engine_probe

    @property
    def run_dir(self) -> Path:
        """The run's directory (:attr:`RunContext.run_dir`)."""
        return self._run.run_dir

    def file_path(self, name: str) -> Path:
        """Where this run writes a scenario's file ``name`` (:meth:`RunContext.file_path`)."""
        return self._run.file_path(name)

    @property
    def run_id(self) -> str:
        """The run's id (:attr:`RunContext.run_id`)."""
        return self._run.run_id

    @property
    def scenario_name(self) -> str:
        """The scenario being run (:attr:`RunContext.scenario_name`)."""
        return self._run.scenario_name

    @property
    def phase_prefix(self) -> str:
        """The prefix of this scenario's phase names (:attr:`RunContext.phase_prefix`)."""
        return self._run.phase_prefix

    # -- phases and references --------------------------------------------------------------------
    def run_phase(self, name: str, concurrency: int, specs: Sequence[RequestSpec], *,
                  counts_for_throughput: bool = True, role: str = "load",
                  issue: Callable[[RequestSpec], Completion] | None = None,
                  on_outcome: Callable[[Outcome], None] | None = None,
                  together: bool = False) -> PhaseResult:
        """Issue, record, judge and write a phase (:meth:`RunContext.run_phase`)."""
        return self._run.run_phase(name, concurrency, specs,
                                   counts_for_throughput=counts_for_throughput, role=role,
                                   issue=issue, on_outcome=on_outcome, together=together)

    def take_references(self, specs: Sequence[RequestSpec], phase_name: str = "references",
                        cache_state: str | None = None) -> PhaseResult | None:
        """Take the single-request references (:meth:`RunContext.take_references`)."""
        return self._run.take_references(specs, phase_name, cache_state)

    def keep_warm_references(self, outcomes: Sequence[Outcome]) -> None:
        """Make warm outcomes the references (:meth:`RunContext.keep_warm_references`)."""
        return self._run.keep_warm_references(outcomes)

    def reference(self, spec: RequestSpec) -> ReferenceRecord | None:
        """The reference ``spec`` is compared with (:meth:`RunContext.reference`)."""
        return self._run.reference(spec)

    def add_phase_check(self, ph: PhaseRecord, check: CheckResult,
                        reason: str | None = None) -> None:
        """Add a scenario's own check to a phase (:meth:`RunContext.add_phase_check`)."""
        return self._run.add_phase_check(ph, check, reason)

    def leave_out(self, name: str, reason: str, concurrency: int = 1) -> PhaseRecord | None:
        """Record a planned phase left out, vacuous (:meth:`RunContext.leave_out`)."""
        return self._run.leave_out(name, reason, concurrency)

    # -- tables and notes -------------------------------------------------------------------------
    def note(self, table: str, texts: str | Iterable[str], echo: bool = False) -> None:
        """Add note rows to a table (:meth:`RunContext.note`)."""
        return self._run.note(table, texts, echo)

    def add_table(self, key: str, rows: Sequence[Any]) -> None:
        """Append rows to a manifest table (:meth:`RunContext.add_table`)."""
        return self._run.add_table(key, rows)

    def set_table(self, key: str, rows: Sequence[Any]) -> None:
        """Replace a manifest table (:meth:`RunContext.set_table`)."""
        return self._run.set_table(key, rows)

    def add_planned_phases(self, n: int) -> None:
        """Count more planned phases (:meth:`RunContext.add_planned_phases`)."""
        return self._run.add_planned_phases(n)

    # -- requests and the engine ------------------------------------------------------------------
    def issue(self, spec: RequestSpec, on_token: Callable[[int], None] | None = None
              ) -> Completion:
        """Send one request now and wait for it (:meth:`RunContext.issue`)."""
        return self._run.issue(spec, on_token)

    def prompt_builder(self, filler: str, tail: int) -> ChatPromptBuilder:
        """The engine's chat prompt builder (:meth:`RunContext.prompt_builder`)."""
        return self._run.prompt_builder(filler, tail)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The engine's text of token IDs (:meth:`RunContext.detokenize`)."""
        return self._run.detokenize(ids)

    def reset_prefix_cache(self, attempts: int = 20, wait_s: float = 0.5) -> str | None:
        """Empty the engine's prefix cache (:meth:`RunContext.reset_prefix_cache`)."""
        return self._run.reset_prefix_cache(attempts, wait_s)

    # -- points in the run ------------------------------------------------------------------------
    def mark(self) -> Mark:
        """The point in the run now (:meth:`RunContext.mark`)."""
        return self._run.mark()

    def since(self, mark: Mark) -> tuple[list[PhaseRecord], list[RequestRecord]]:
        """Phases and records since a mark (:meth:`RunContext.since`)."""
        return self._run.since(mark)
