"""The manifest's tables as row models (issue 34: typed all the way to the file).

On disk a table stays a list of JSON objects (``manifest.tables[KEY]``, the same keys as
ever); every table the harness writes is written from a row model and read back through it.
Here: the base of every row (:class:`TableRow`, which a scenario kind's own rows derive from,
see :mod:`pleharness.scenarios.base`), the rows of the tables that the run layer and the engine
facts write (notes, fact conflicts), the ``reproducers`` table that a scenario writes and the
confirmation (:mod:`pleharness.reproduce`) fills, and that confirmation's result
(:class:`Confirmation`, also explain's ``reproduction`` of a case). They sit on the manifest's
floor so that every writer and reader may import them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from .records import SetFieldsOnly

if TYPE_CHECKING:  # pragma: no cover
    from . import Manifest

__all__ = ["Confirmation", "FactConflictRow", "NoteRow", "ReplayRow", "ReproducerRow",
           "ReproductionColumns", "SparseRow", "TableRow"]


class TableRow(BaseModel):
    """Base for one row of a scenario's table in the manifest (``tables[KEY]``): the columns are
    the row model's fields, stored as a JSON object per row. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def rows(cls, m: "Manifest", key: str) -> list:
        """The rows of ``m.tables[key]`` as this model ([] when absent). Raises pydantic's
        ValidationError for a row that does not fit."""
        return [cls.model_validate(r) for r in m.tables.get(key) or []]


class SparseRow(TableRow, SetFieldsOnly):
    """A row whose optional columns are absent from its JSON until written: the JSON holds only
    the keys that were set (built, loaded or assigned), in field order."""


class NoteRow(TableRow):
    """One note (``RunContext.note``: ``boundary_notes``, ``insert_notes``, ... and the engine
    facts' ``fact_sources``)."""

    note: str


class FactConflictRow(TableRow):
    """Two sources that disagree on an engine fact (``fact_conflicts``): the value used and
    where it came from, the other value and its source
    (:meth:`pleharness.engine.facts.EngineFacts.resolve_conflicts`)."""

    fact: str
    used: Any
    used_source: str
    other: Any
    other_source: str


class ReplayRow(SparseRow):
    """One replay of a reproducer (:attr:`Confirmation.replays`): its number, exit code (1: it
    failed again), its manifest, and by outcome ``failing`` (the causes, exit 1),
    ``inconclusive`` (why a pass did not exercise the schedule) or ``error`` (the run's reason);
    ``engine_ready_s``: its engine's start, seconds. ``manifest`` is None for a replay refused
    before its run folder was made."""

    run: int
    exit_code: int
    reproduced: bool
    manifest: str | None = None
    failing: list[str] | None = None
    inconclusive: str | None = None
    error: str | None = None
    engine_ready_s: float | int | None = None


class Confirmation(SparseRow):
    """The confirmation of one reproducer (:func:`pleharness.pipeline.replay_reproducer`):
    ``runs`` counted replays (the inconclusive ones left out), how many ``reproduced`` and
    ended in ``errors``, ``fresh_engine`` (False when attached), ``rate`` ("3/3"), the one-line
    ``verdict``, ``side_by_side`` (replays at once) and each of the ``replays``.
    ``same_schedule_as``: explain's case whose reproducer replays the same schedule (this
    result is that one's)."""

    runs: int
    reproduced: int
    errors: int
    inconclusive: int
    fresh_engine: bool
    rate: str
    verdict: str
    side_by_side: int
    replays: list[ReplayRow]
    same_schedule_as: str | None = None


class ReproductionColumns(SparseRow):
    """The columns a reproducer's confirmation
    (:func:`pleharness.pipeline.confirm_run_reproducers`) writes into the first row of the
    summary table the reproducer names
    (``ReproducerRow.summary_table``, e.g. ``fuzz_summary``): ``confirmed`` (it failed on at
    least one replay), ``reproduction`` (the reproducer's verdict line), ``reproduction_rate`` and
    ``larger_reproduction_rate`` (of the larger fallback; "k/N"), ``confirmed_on_fresh_engine``
    (False: replayed on the attached engine). Any kind that writes reproducers declares these
    fields on its summary row model, in this order (a test holds fuzz's to it)."""

    confirmed: bool | None = None
    reproduction: str | None = None
    reproduction_rate: str | None = None
    larger_reproduction_rate: str | None = None
    confirmed_on_fresh_engine: bool | None = None

    def merged_into(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` (a summary table's JSON row, shape unchanged) with these columns written: a
        column ``row`` holds keeps its place, a new one goes at the end."""
        return {**row, **self.model_dump()}


class ReproducerRow(SparseRow):
    """One reproducer a run wrote (``reproducers``): ``source`` (e.g. fuzz), ``path`` relative
    to the run folder, ``schedule``, ``summary_table`` (the table whose row gets the
    reproduction, e.g. ``fuzz_summary``), ``fallback`` (a larger failing schedule to try when
    this one does not reproduce) with its ``fallback_schedule``; then, once confirmed,
    ``confirmation``, ``verdict`` (the line the reports show) and ``fallback_confirmation``."""

    source: str
    path: str
    schedule: str | None = None
    summary_table: str | None = None
    fallback: str | None = None
    fallback_schedule: str | None = None
    confirmation: Confirmation | None = None
    verdict: str | None = None
    fallback_confirmation: Confirmation | None = None
