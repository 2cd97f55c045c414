"""The records of a run's parts in the results manifest (:mod:`pleharness.manifest`): a check's
result (:class:`CheckResult`), a request's record (:class:`RequestRecord`, with its
:class:`Divergence` and the side / control evidence), a phase (:class:`PhaseRecord`) and a
reference (:class:`ReferenceRecord`). Their field order is the order of their JSON."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

CheckStatus = Literal["pass", "fail", "warn", "note", "skip"]  # note: model behaviour, not a fault


class CheckResult(BaseModel):
    """Outcome of one check on one request or phase; ``detail`` is the evidence or the skip reason."""

    name: str
    status: CheckStatus
    detail: str = ""


DivergenceClass = Literal["near_tie", "hard", "unknown"]
Attribution = Literal["also_in_control", "only_under_test", "no_twin"]


class SetFieldsOnly(BaseModel):
    """Base of a model whose JSON holds only the fields that were set (built, loaded or
    assigned), in field order, under their aliases where a field declares one: the records
    below, the manifest's sections and its sparse table rows."""

    @model_serializer(mode="wrap")
    def _only_set(self, handler):
        data = handler(self)
        keep = set()
        for name in self.model_fields_set:
            keep.add(name)
            alias = type(self).model_fields[name].alias
            if alias:
                keep.add(alias)
        return {k: v for k, v in data.items() if k in keep}


class _SetFieldsOnly(SetFieldsOnly):
    """A record whose JSON holds only the fields that were set (built, loaded or assigned), under
    their aliases: optional evidence that was never gathered is absent, not ``null``, so the file
    says what was known (and reads the same as before these records were typed)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class ControlEvidence(_SetFieldsOnly):
    """What the control run said about one divergence (:mod:`pleharness.attribution`)."""

    twins: int  # control-run requests with the same (prompt, max_tokens, concurrency)
    twins_diverged: int  # of those, how many diverged from the control run's own reference
    same_output: bool  # some twin produced the very same (divergent) output
    twin_first_divergences: list[int] = Field(default_factory=list)  # their first positions


CorruptSide = Literal["reference", "load", "undecided"]


class SideEvidence(_SetFieldsOnly):
    """Which side of a divergence is wrong, and why (:func:`pleharness.divergence.golden_side`,
    :func:`pleharness.divergence.majority_side`). ``reference_run`` / ``observed_run``: request IDs
    of the run the reference came from (None when it came from elsewhere: golden, another engine,
    a manifest) and of the compared run. ``method``: golden (teacher-forced logprobs of both
    tokens, nats) | majority (votes over every run of the same prompt, sampling and max_tokens in
    the run, control twins included; ``voters``: output hash prefix -> run IDs) | none."""

    method: str = "none"
    reference_run: str | None = None
    reference_source: str | None = None
    observed_run: str | None = None
    observed_role: str | None = None  # load | reference | warmup (the compared run's phase role)
    golden_logprob_reference: float | None = None
    golden_logprob_observed: float | None = None
    tolerance_nats: float | None = None
    votes_reference: int | None = None
    votes_observed: int | None = None
    votes_total: int | None = None
    voters: dict[str, list[str]] | None = None
    judged_against: str | None = None  # after a corrupt reference: what the run was re-judged by
    detail: str = ""


class Divergence(_SetFieldsOnly):
    """Evidence and class of one output's first divergence from its reference
    (:func:`pleharness.divergence.analyse`; positions are 0-based output-token indices, margins
    and gaps in nats). ``fails``: whether it fails the run (hard, unknown, a failed check on the
    output, ``--strict``, or a seeded sample); a near tie that does not fail is a warning.
    In the JSON the class is under ``"class"``."""

    position: int
    reference_window: list[int] = Field(default_factory=list)  # IDs around position
    observed_window: list[int] = Field(default_factory=list)
    window_start: int = 0  # output index of the windows' first token
    reference_token: int | None = None  # None: that output ended before position
    observed_token: int | None = None
    margin_nats: float | None = None  # reference's top-1 minus top-2 logprob at position
    threshold_nats: float | None = None  # near-tie threshold applied
    observed_in_reference_top: bool | None = None  # set only when the engine returned top-k
    reference_in_observed_top: bool | None = None
    classified_by: str | None = None  # golden | engine margin | none (...)
    golden_gap_nats: float | None = None  # |golden lp(reference) - lp(observed)|
    golden_top: list[tuple[int, float]] | None = None  # golden (id, logprob) top-k
    reference_in_golden_top: bool | None = None
    observed_in_golden_top: bool | None = None
    cls: DivergenceClass = Field(alias="class")
    reconverged: bool = False  # the outputs' tails agree again
    checks_failed: list[str] = Field(default_factory=list)  # reference-free checks that failed
    fails: bool
    attribution: Attribution | None = None  # set by a control run
    # the differential (issue 47): the control's own solo runs disagree at or before the
    # position, why in words (settle: the engine's numerics, a warning)
    control_split: str | None = None
    control_evidence: ControlEvidence | None = None
    golden_tolerance_nats: float | None = None  # half precision: the measured golden tolerance
    reclassified: str | None = None  # why the class was changed after the fact (control run)
    corrupt_side: CorruptSide | None = None  # which side is wrong (None: not judged yet)
    side_evidence: SideEvidence | None = None
    # issue 32: the evidence that decided (:func:`pleharness.divergence.settle`, in its order):
    # solo repeatability | control | golden | engine margin | none; plus strict / seeded sample /
    # checks when those made it fail
    decided_by: str | None = None
    solo_repeat: str | None = None  # both runs alone, same computation, engine repeats alone
    golden_informative: bool | None = None  # the run's measured verdict on the golden model


class ScoreDiffs(_SetFieldsOnly):
    """How far this run's logprobs of the same tokens are from its solo reference's, at matched
    positions (nats; :mod:`pleharness.checks.logprob_parity` for the emitted tokens,
    :mod:`pleharness.checks.prompt_logprobs` for the prompt's). Kept so that the check can be
    judged again once the run's numerics envelope is measured (:mod:`pleharness.envelope`).

    ``compared``: positions compared (the same token on both sides, and the token among both
    sides' top candidates: a far-tail position carries no probability and is no evidence);
    ``tail``: positions left out as far tail; ``max_nats``: the largest |difference|;
    ``bound_nats``: the dtype bound below which differences are not listed; ``over``:
    (position, this run's logprob, the reference's) of every compared position whose
    |difference| is above ``bound_nats``, in order, at most :data:`OVER_CAP`; ``missing``:
    positions where the reference has a score and this run none (prompt logprobs only),
    ``first_missing`` the first of them."""

    compared: int = 0
    tail: int = 0
    max_nats: float = 0.0
    bound_nats: float = 0.0
    over: list[tuple[int, float, float]] = Field(default_factory=list)
    missing: int = 0
    first_missing: int | None = None

    def over_tolerance(self, tolerance: float) -> list[tuple[int, float, float]]:
        """The listed positions whose |difference| is above ``tolerance`` (nats, at least
        ``bound_nats``: below it nothing is listed)."""
        return [x for x in self.over if not abs(x[1] - x[2]) <= tolerance]


OVER_CAP = 64  # positions listed in ScoreDiffs.over


class RequestRecord(BaseModel):
    """One request: what was sent, what came back, and how it compares with its reference.

    The one meaning of "this request failed" is :attr:`is_problem`; phases, the verdict, the
    console report, summary.md and junit.xml all use it (and :attr:`failed_checks`).
    """

    id: str
    scenario: str
    phase: str
    concurrency: int
    prompt_key: str
    prompt_len: int
    prompt_hash: str
    max_tokens: int
    output_hash: str | None = None
    output_len: int = 0
    reference_hash: str | None = None
    match: bool | None = None
    first_divergence: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    error: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    error_expected: bool = False  # e.g. a clean 4xx for a prompt beyond max_model_len
    output_ids: list[int] | None = None  # kept for mismatches and references only (compact)
    divergence: Divergence | None = None  # set for a compared output that differs
    checks: list[CheckResult] = Field(default_factory=list)
    note: str | None = None
    temperature: float = 0.0  # sampling sent (0: greedy)
    seed: int | None = None  # per-request seed sent, if any
    stream: bool = True  # streamed (SSE) or one JSON response
    params: dict[str, Any] | None = None  # request fields beyond the defaults (stop, penalties ...)
    api: str | None = None  # "chat": sent to /v1/chat/completions (None: /v1/completions)
    top_p: float | None = None  # nucleus sampling sent with a sampled request (None: not sent)
    top_k: int | None = None  # top-k sampling sent with a sampled request (None: not sent)
    n: int | None = None  # choices of the request this record is one of (None: n = 1)
    choice: int | None = None  # this record's choice index in that request (None: n = 1)
    # logprobs against the solo reference's at matched positions (issue 47: judged again with
    # the run's measured numerics envelope)
    logprob_diffs: ScoreDiffs | None = None  # the emitted tokens' (logprob_parity)
    prompt_logprob_diffs: ScoreDiffs | None = None  # the prompt tokens' (prompt_logprobs_parity)
    # a solo greedy run whose answer differs from the control engine's answer to the same
    # request (issue 47: :mod:`pleharness.differential`); check ``control_answer``
    differential: Divergence | None = None
    # the control's answer that ``differential`` differs from: {"run", "output_ids", "margins",
    # "threshold_nats": the control margin a difference had to reach to be hard}
    # (explain replays the request against it)
    control_answer: dict[str, Any] | None = None

    @property
    def failed_checks(self) -> list[CheckResult]:
        """The checks (reference-free ones and ``parity``) that failed on this request."""
        return [c for c in self.checks if c.status == "fail"]

    @property
    def request_error(self) -> bool:
        """The request failed (HTTP error, timeout, malformed stream ...), and that was not an
        acceptable answer (``error_expected``: a clean 4xx at an edge probe)."""
        return self.error is not None and not self.error_expected

    @property
    def tolerated(self) -> bool:
        """Its output differs from the reference, but the divergence is a warning (a near tie,
        or also in the control run), not a failure. A run re-judged equal to the output that
        replaced a corrupt reference (``match`` True) is no longer a divergence here."""
        return self.divergence is not None and not self.divergence.fails and self.match is False

    @property
    def parity_failed(self) -> bool:
        """An answer (no request error) whose tokens differ from the reference (or that had no
        reference), and that difference is not tolerated."""
        return self.match is False and self.error is None and not self.tolerated

    @property
    def is_problem(self) -> bool:
        """This request fails the run: a request error, an untolerated parity difference, or
        any failed check. Near ties and other warnings are not problems."""
        return self.request_error or self.parity_failed or bool(self.failed_checks)


class PhaseRecord(BaseModel):
    """Aggregates of one phase (a set of requests issued at one concurrency)."""

    index: int
    name: str
    scenario: str
    concurrency: int
    status: Literal["pass", "fail", "skip", "not_run", "interrupted", "running"] = "running"
    reason: str = ""
    requests: int = 0
    matched: int = 0
    mismatched: int = 0  # mismatches that fail (hard, unknown, or with a failed check; all if strict)
    near_ties: int = 0  # mismatches classified near_tie (warnings unless --strict)
    errors: int = 0
    role: Literal["load", "reference", "warmup"] = "load"
    repeat: int = 1
    counts_for_throughput: bool = True
    wall_s: float | None = None
    completion_tokens: int = 0
    decode_tok_per_s: float | None = None
    ttft_s_median: float | None = None
    latency_s_median: float | None = None
    started_at: str | None = None
    ended_at: str | None = None
    checks: list[CheckResult] = Field(default_factory=list)
    # what the phase exercised, from the engine's counters (:mod:`pleharness.evidence`); None
    # for phases recorded before this field existed
    engaged: dict[str, Any] | None = None
    vacuous: str | None = None  # why the phase tested nothing of what it is for (None: it did)


class ReferenceRecord(BaseModel):
    """A single-request reference output for one prompt (taken alone, one request in flight)."""

    prompt_key: str
    prompt_hash: str
    prompt_len: int
    max_tokens: int
    output_hash: str
    output_ids: list[int]
    margins: list[float | None] | None = None  # top-1 minus top-2 logprob per position, nats
    top_ids: list[list[int]] | None = None  # per position, the token IDs of the returned top-k
    token_logprobs: list[float | None] | None = None  # per position, the emitted token's logprob
    source: str = "solo"  # solo | engine | golden | manifest
    cache_state: str = "cold"  # cold: the prompt's first run; warm: a later, prefix-cached run
    cold_output_hash: str | None = None  # for a warm reference: the first run's hash
    temperature: float = 0.0  # sampling of the reference request (0: greedy)
    seed: int | None = None  # per-request seed of a sampled reference
    params: dict[str, Any] | None = None  # request fields beyond the defaults (RequestSpec.params)
    request_id: str | None = None  # the run (request record) this reference is the output of
    replaces: str | None = None  # this reference replaced a corrupt one: which run, and why
