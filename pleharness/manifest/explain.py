"""``explain.json``'s schema (issue 34: typed all the way to the file): :class:`ExplainResult`,
what ``ple-harness explain`` found, with its cases (:class:`CaseReport`) and the configurations
it tried (:class:`SuspectRecord`). The explain job builds it
(:meth:`pleharness.explain.ExplainReport.result`) and the renderings read it
(:mod:`pleharness.render.explain`); it sits with the manifest's schema so that both may import
it. Its JSON is the file's, key order included."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ..jobrecord import JobRecord
from ..timeline import Timeline
from .tables import Confirmation

__all__ = ["CaseReport", "ExplainResult", "SuspectRecord"]


class SuspectRecord(BaseModel):
    """One configuration tried besides the one under test, as explain.json lists it
    (:class:`pleharness.explain.Suspect`'s fields)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    why: str
    add: list[str]
    drop: list[str]
    feature: str
    within: str | None
    change: str
    setting: dict[str, Any] | None
    combines: list[str]


class CaseReport(BaseModel):
    """One case in the report (``explain.json``'s ``cases[]``; :class:`Case` is its working
    state). ``baseline``: level name -> replay result on the configuration under test;
    ``controls``: suspect name -> replay result on its engine; ``narrowing``:
    :func:`narrow_down`'s dict; ``attribution``: the one-line diagnosis; ``repro``: the
    reproducer's path relative to the run folder; ``reproduction`` / ``reproduction_verdict``:
    set by :func:`~pleharness.explain.job.confirm_repros` (absent from the JSON until then)."""

    model_config = ConfigDict(extra="forbid")

    case: int
    prompt_hash: str
    concurrency: int
    phase: str
    requests: list[str]
    first_divergence: int | None
    prompt_len: int | None
    minimal_case: str | None
    baseline: dict[str, Any]
    controls: dict[str, dict[str, Any]]
    narrowing: dict[str, Any]
    attribution: str
    repro: str
    reproduction: Confirmation | None = None
    reproduction_verdict: str | None = None

    @model_serializer(mode="wrap")
    def _reproduction_once_set(self, handler):
        data = handler(self)
        return {k: v for k, v in data.items()
                if v is not None or k not in ("reproduction", "reproduction_verdict")}


class ExplainResult(BaseModel):
    """What ``ple-harness explain`` found (``RUN/explain/explain.json``): the fields of
    :class:`pleharness.explain.ExplainReport` as written (``elapsed_s`` absent while None,
    ``timeline`` while it holds nothing, ``job``: the job's record,
    :class:`~pleharness.jobrecord.JobRecord`, absent in an explain.json of before issue 50)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    status: str
    tries: int
    budget_s: float | int
    estimate: dict[str, Any]
    side_by_side: dict[str, Any]
    golden: str
    cases: list[CaseReport]
    suspects: list[SuspectRecord]
    launches: list[dict[str, Any]]
    elapsed_s: float | int | None = None
    timeline: Timeline = Field(default_factory=Timeline)  # diagnosis, confirmed after N s
    job: JobRecord | None = None  # the job's record (pleharness.jobrecord), absent while None

    @model_serializer(mode="wrap")
    def _elapsed_once_known(self, handler):
        data = handler(self)
        if data.get("job") is None:
            data.pop("job", None)
        if data.get("elapsed_s") is None:
            data.pop("elapsed_s", None)
        if data.get("timeline") == Timeline().model_dump():  # an explain.json of before issue 49
            data.pop("timeline", None)
        return data
