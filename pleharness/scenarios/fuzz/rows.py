"""The ``fuzz`` kind's manifest tables as row models: ``fuzz_summary`` (:class:`FuzzSummaryRow`,
one row, its reproduction columns filled by :mod:`pleharness.reproduce` when the reproducer is
confirmed), ``fuzz_shrink_steps`` (:class:`ShrinkStepRow`), ``fuzz_examples``
(:class:`ExampleRow`) and ``fuzz_failing`` (:class:`FailingRow`). Rows only: the runner
(:mod:`.runner`) writes them."""
from __future__ import annotations

from typing import Any

from ...manifest.tables import SparseRow, TableRow


class ShrinkStepRow(TableRow):
    """One failing example in the order seen (``fuzz_shrink_steps``): the first found, then
    every smaller one."""

    step: int
    example: str
    phases: int
    requests: int
    schedule: str


class FuzzSummaryRow(SparseRow):
    """The fuzz run in one row (``fuzz_summary``): counts, seed and budgets, the hypothesis
    database, seconds, the reproducer and its minimal schedule, the search space; ``None``
    until known. ``smallest_unconfirmed`` / ``repro_larger``: set when the smallest failing
    schedule did not fail on every recheck / a larger fallback reproducer was written; the
    ``reproduction*`` and ``confirmed*`` columns: set by the confirmation on fresh engines
    (:func:`pleharness.pipeline.confirm_run_reproducers`), the fields of
    :class:`~pleharness.manifest.tables.ReproductionColumns`, declared here in its order."""

    examples_run: int
    failing_examples: int
    examples_to_failure: int | None = None
    skipped_out_of_time: int
    seed: int | None = None
    max_examples: int
    time_budget_s: float | int | None = None
    database: str
    elapsed_s: float | int
    s_per_example: float | int | None = None
    repro: str | None = None
    minimal_schedule: str | None = None
    rechecked_in_process: bool | None = None
    confirmed: bool | None = None
    reproduction: str | None = None
    space: dict[str, Any]
    smallest_unconfirmed: str | None = None
    repro_larger: str | None = None
    reproduction_rate: str | None = None
    larger_reproduction_rate: str | None = None
    confirmed_on_fresh_engine: bool | None = None


class ExampleRow(SparseRow):
    """One example run (``fuzz_examples``): its label, schedule key, phases and requests, the
    schedule's summary, ``status`` (pass / fail), inserts sent and sent late, the failing
    requests, each insert as sent (``[phase, insert, position, running]``), the failed
    comparisons for the reproducer (replay's ``failed``), seconds; ``stage`` (search, shrink,
    delete, delete-retry, recheck) and ``elapsed_s`` (since the search started) set by the
    runner."""

    example: str
    key: str
    phases: int
    requests: int
    schedule: str
    status: str
    inserts: int
    inserts_late: int
    failing_requests: list[str]
    insert_sent: list[list[Any]]
    failed: list[dict[str, Any]]
    wall_s: float | int
    stage: str | None = None
    elapsed_s: float | int | None = None


class FailingRow(TableRow):
    """One request of the minimal failing schedule (``fuzz_failing``): its phase (1-based) and
    concurrency, ``role`` (request, carrier or insert), how it was drawn (source, length in
    tokens, why, shape, prompt seed, max_tokens, stream, sample seed), the carrier token it is
    inserted after, and the drawn ``features`` tag, ``logprobs``, ``params`` as sent and ``api``
    (:func:`~pleharness.scenarios.fuzz_features.failing_fields`)."""

    phase: int
    concurrency: int
    role: str
    source: str
    prompt_len: int
    why: str
    shape: str
    seed: int
    max_tokens: int
    stream: bool
    sample_seed: int | None
    insert_after_tokens: int | None
    features: str | None
    logprobs: int | None
    params: dict[str, Any] | None
    api: str | None
