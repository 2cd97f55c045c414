"""Results manifest: schema (pydantic), atomic writer, append-only request records.

``results/<run-id>/manifest.json`` holds the summary, phases, references and provenance; it is
rewritten atomically (temporary file in the same folder, fsync, ``os.replace``) after every phase,
so a run that stops part-way leaves a valid file whose ``status`` says how it ended. The
per-request records go to an append-only JSON Lines file beside it (``requests.jsonl``, one
:class:`RequestRecord` per line, named by ``Manifest.requests_file``): each write appends only the
records added since the previous one, flushes and fsyncs them, and only then replaces the
manifest, so the cost of a write no longer grows with the run and a killed run leaves the records
of every phase its manifest lists. Schema version 1 manifests (records inline under ``requests``)
still load. Every number carries its unit in its name (``_s`` seconds, ``_tok_per_s`` tokens per
second). Token hashes use the canonical encoding of :mod:`pleharness.parity`.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer

from .files import write_private

SCHEMA_VERSION = 2  # 2: request records in a JSON Lines file (requests_file); 1: inline
READABLE_SCHEMA_VERSIONS = (1, 2)

# control_failed: the run under test completed and was judged, but the requested control engine
# failed to start or died (issue 32 item 4: exit 3, its divergences unattributed)
RunStatus = Literal["running", "complete", "incomplete", "failed", "engine_died", "interrupted",
                    "control_failed"]
Verdict = Literal["pass", "fail", "error"]
CheckStatus = Literal["pass", "fail", "warn", "note", "skip"]  # note: model behaviour, not a fault


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class CheckResult(BaseModel):
    """Outcome of one check on one request or phase; ``detail`` is the evidence or the skip reason."""

    name: str
    status: CheckStatus
    detail: str = ""


DivergenceClass = Literal["near_tie", "hard", "unknown"]
Attribution = Literal["also_in_control", "only_under_test", "no_twin"]


class _SetFieldsOnly(BaseModel):
    """A record whose JSON holds only the fields that were set (built, loaded or assigned), under
    their aliases: optional evidence that was never gathered is absent, not ``null``, so the file
    says what was known (and reads the same as before these records were typed)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

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


class _Section(BaseModel):
    """A manifest section with its known keys as typed fields and any other key a writer adds
    kept as it is (``extra="allow"``); its JSON holds only the keys that were set (loaded, built
    or assigned), so a section reads the same as when it was a plain dict. Strict types: a value
    of another JSON type is refused at load time, never coerced (the file is not rewritten).

    Readers use the attributes (None where the key is absent). Writers may still use the mapping
    methods (``s["k"] = v``, ``update``, ``setdefault``, ``get``, ``in``, ``items``) while they
    are moved to attributes; a key that is not set reads as absent there (KeyError / default)."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_serializer(mode="wrap")
    def _only_set(self, handler):
        data = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set}

    def keys(self):
        return [k for k in (*type(self).model_fields, *(self.__pydantic_extra__ or {}))
                if k in self.model_fields_set]

    def items(self):
        return [(k, getattr(self, k)) for k in self.keys()]

    def values(self):
        return [v for _, v in self.items()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.model_fields_set)

    def __bool__(self) -> bool:
        return bool(self.model_fields_set)

    def __contains__(self, key) -> bool:
        return key in self.model_fields_set

    def __getitem__(self, key):
        if key not in self.model_fields_set:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key, value) -> None:
        setattr(self, key, value)

    def get(self, key, default=None):
        return getattr(self, key) if key in self.model_fields_set else default

    def setdefault(self, key, default=None):
        if key not in self.model_fields_set:
            setattr(self, key, default)
        return getattr(self, key)

    def update(self, other=(), **kw) -> None:
        for k, v in (dict(other) | kw).items():
            setattr(self, k, v)

    def pop(self, key, *default):
        if key not in self.model_fields_set:
            if default:
                return default[0]
            raise KeyError(key)
        value = getattr(self, key)
        if key in type(self).model_fields:
            setattr(self, key, type(self).model_fields[key].default)
            self.model_fields_set.discard(key)
        else:
            del self.__pydantic_extra__[key]
            self.model_fields_set.discard(key)
        return value

    def __eq__(self, other) -> bool:
        if isinstance(other, dict):
            return dict(self.items()) == other
        return super().__eq__(other)


class EngineRecord(_Section):
    """``manifest.engine``: the engine under test as the run saw it (:mod:`pleharness.stress`,
    :mod:`pleharness.engine.session`)."""

    mode: str | None = None  # launched | attached
    url: str | None = None  # the OpenAI-compatible base URL (credentials redacted)
    model: str | None = None  # the served model id
    version: str | None = None  # vLLM version the server reports
    max_model_len: int | None = None  # tokens
    ready_s: float | int | None = None  # seconds from launch to ready
    command: list[str] | None = None  # the launch command (secrets redacted)
    launch: dict[str, Any] | None = None  # pleharness.engine.session.launch_record
    engine_log: str | None = None  # path of engine.log
    launcher_log: str | None = None  # path of the launcher's own log
    model_root: str | None = None  # folder of an embedded model
    model_digest: dict[str, Any] | None = None  # embedded model's weights_sha256 (verified)
    control_engine: dict[str, Any] | None = None  # the control engine (its "command", ...)
    reference_engine: dict[str, Any] | None = None  # the reference engine (its "command", ...)


class RunOptionsRecord(_Section):
    """``manifest.run_options``: the options that decide how outputs were judged."""

    reference: str | None = None  # solo | warm | golden | engine | manifest
    repeat: int | None = None
    strict: bool | None = None  # near ties fail (--strict)
    on_timeout: str | None = None  # --on-timeout policy
    logprobs: int | None = None  # top-k logprobs asked for
    near_tie_nats: float | int | None = None  # near-tie threshold, nats
    near_tie_source: str | None = None  # where the threshold came from (given | dtype default)
    serving_dtype: str | None = None
    golden: bool | None = None
    golden_classifier: str | None = None  # on | off (--no-golden) | unavailable: why
    golden_classifier_error: str | None = None  # why the golden classifier stopped mid-run
    golden_log: str | None = None
    golden_model: str | None = None  # the golden model's folder (explain's replays use it too)
    golden_tolerance: dict[str, Any] | None = None  # tolerance_nats and its source
    reference_cache_state: str | None = None
    api: str | None = None  # --api: completions | chat | both (pleharness.run.api)
    api_used: str | None = None  # completions when the model has no chat template
    chat_template: bool | None = None  # /tokenize with messages answered (None: not asked)
    api_note: str | None = None  # why --api fell back to completions


class Summary(_Section):
    """``manifest.summary``: the run's counts and headline (:func:`pleharness.verdict.summarize`
    writes it; counts are requests or outputs unless named otherwise)."""

    headline: str | None = None
    phases_planned: int | None = None
    phases_completed: int | None = None
    phases_failed: int | None = None
    hashes_compared: int | None = None
    hashes_matched: int | None = None
    near_ties: int | None = None
    hard_divergences: int | None = None
    checks_failed: int | None = None
    request_errors: int | None = None
    model_behaviour_notes: int | None = None
    also_in_control: int | None = None
    only_under_test: int | None = None
    no_twin: int | None = None
    # requests per endpoint per scenario (--api; pleharness.run.api.count)
    api_paths: dict[str, Any] | None = None
    corrupt_side: dict[str, Any] | None = None
    corrupt_references: list[dict[str, Any]] | None = None  # method, evidence (run/judge.py)
    engaged: dict[str, Any] | None = None  # what the run exercised (pleharness.evidence)
    throughput_by_concurrency: dict[str, Any] | None = None  # C -> median/min/max tok/s, repeats
    vacuous: list[Any] | None = None
    vacuous_run_level: list[Any] | None = None
    reproducers: list[dict[str, Any]] | None = None  # path and verdict of each replayed repro
    report_error: str | None = None  # why summary.md / junit.xml could not be written


_SECTIONS = {"engine": EngineRecord, "run_options": RunOptionsRecord, "summary": Summary}


class Manifest(BaseModel):
    """One run: provenance, engine facts, references, phases, summary and verdict.

    ``requests`` (the per-request records) is kept in memory but never serialized with the
    manifest: :func:`write_manifest` appends new records to ``requests_file`` (a JSON Lines file
    named relative to the manifest's folder) and :func:`load_manifest` reads them back;
    ``requests_count`` is how many lines of that file belong to the manifest. A record changed
    after it was written (control-run attribution) must be announced with
    :meth:`records_changed`, which makes the next write rewrite the file once.
    """

    schema_version: int = SCHEMA_VERSION
    run_id: str
    started_at: str = Field(default_factory=now_iso)
    ended_at: str | None = None
    status: RunStatus = "running"
    verdict: Verdict | None = None
    exit_code: int | None = None
    reason: str | None = None
    root_cause: str | None = None
    log_tail: list[str] = Field(default_factory=list)
    harness: dict[str, Any] = Field(default_factory=dict)
    invocation: list[str] = Field(default_factory=list)
    run_options: RunOptionsRecord = Field(default_factory=RunOptionsRecord)
    engine: EngineRecord = Field(default_factory=EngineRecord)
    facts: dict[str, Any] = Field(default_factory=dict)
    # what the engine probe measured at the start of the run (pleharness.engine_probe)
    engine_probe: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    scenarios: list[dict[str, Any]] = Field(default_factory=list)
    references: list[ReferenceRecord] = Field(default_factory=list)
    phases: list[PhaseRecord] = Field(default_factory=list)
    requests: list[RequestRecord] = Field(default_factory=list, exclude=True)
    requests_file: str | None = None  # JSON Lines file of the records, relative to the manifest
    requests_count: int = 0  # records in requests_file that this manifest covers
    tables: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    # token IDs of the prompts of every phase where an output diverged (prompt hash -> IDs), so
    # that `ple-harness explain` can replay the case
    prompts: dict[str, list[int]] = Field(default_factory=dict)
    summary: Summary = Field(default_factory=Summary)
    # (records file, records already in it) of the last write; not serialized
    _records_written: tuple[Path, int] | None = PrivateAttr(default=None)
    # (phase, its JSON) per phase at the last write: older phases are not serialized again
    _phase_json: list[tuple[PhaseRecord, str]] = PrivateAttr(default_factory=list)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SECTIONS and isinstance(value, dict):  # a writer assigns a whole section
            value = _SECTIONS[name].model_validate(value)
        super().__setattr__(name, value)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):
        """As :meth:`pydantic.BaseModel.model_copy`; a section given in ``update`` as a dict
        becomes its model (``model_copy`` does not validate)."""
        if update:
            update = {k: _SECTIONS[k].model_validate(v) if k in _SECTIONS and isinstance(v, dict)
                      else v for k, v in update.items()}
        return super().model_copy(update=update, deep=deep)

    def fact_values(self) -> dict[str, Any]:
        """{fact: value} of the recorded facts (``facts`` holds {fact: {"value", "source", ...}}),
        e.g. for :func:`pleharness.engine.facts.as_facts`."""
        return {k: v.get("value") if isinstance(v, dict) else v for k, v in self.facts.items()}

    def records_changed(self) -> None:
        """Say that records or phases already written were changed in place (other than the last
        :data:`PHASES_REFRESHED` phases, which every write serializes again): the next
        :func:`write_manifest` rewrites the records file (atomically) instead of appending, and
        serializes every phase again."""
        self._records_written = None
        self._phase_json = []


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, 0600 (:func:`pleharness.files.write_private`)."""
    write_private(path, text)


PHASES_REFRESHED = 8  # the last phases, serialized at every write (scenarios amend the last one)


def _manifest_json(manifest: Manifest) -> str:
    """The manifest's JSON (as ``model_dump_json()``, ``phases`` last): each phase older than the
    last :data:`PHASES_REFRESHED` is serialized once and its JSON reused while it is the same
    object, so a write costs about the same at phase 10 and at phase 2000. Code that changes an
    older phase in place calls :meth:`Manifest.records_changed`."""
    cache = manifest._phase_json
    stable = len(manifest.phases) - PHASES_REFRESHED
    parts = []
    for i, ph in enumerate(manifest.phases):
        if i < len(cache) and cache[i][0] is ph and i < stable:
            parts.append(cache[i][1])
            continue
        text = ph.model_dump_json()
        if i < len(cache):
            cache[i] = (ph, text)
        else:
            cache.append((ph, text))
        parts.append(text)
    del cache[len(manifest.phases):]
    head = manifest.model_dump_json(exclude={"phases"})
    return head[:-1] + ',"phases":[' + ",".join(parts) + "]}"


def requests_file_name(manifest_path: Path) -> str:
    """The records file beside a manifest: ``manifest.json`` -> ``requests.jsonl``,
    ``control-manifest.json`` -> ``control-requests.jsonl``."""
    stem = Path(manifest_path).name
    stem = stem[:-len(".json")] if stem.endswith(".json") else stem
    return (stem[:-len("manifest")] if stem.endswith("manifest") else stem + "-") + "requests.jsonl"


def _record_lines(records: list[RequestRecord]) -> str:
    return "".join(r.model_dump_json() + "\n" for r in records)


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write the run's records and manifest, in this order:

    1. the records added since the previous write to the same file are appended to
       ``requests_file`` (``requests.jsonl`` beside ``path``), flushed and fsynced (nothing is
       written when there are none); the file is rewritten atomically instead when it is new to
       this manifest, when records were removed, or after :meth:`Manifest.records_changed`;
    2. the manifest (compact JSON, without the records; earlier phases' JSON reused, see
       :func:`_manifest_json`) replaces ``path`` atomically.

    A kill between the two leaves the previous manifest, whose ``requests_count`` still names
    only the lines it covers. Raises OSError when either write fails.
    """
    path = Path(path)
    if manifest.requests_file is None:
        manifest.requests_file = requests_file_name(path)
    rpath = path.parent / manifest.requests_file
    recs = manifest.requests
    done = manifest._records_written
    if done is not None and done[0] == rpath and done[1] <= len(recs) and rpath.exists():
        if done[1] < len(recs):
            with open(rpath, "a") as f:
                f.write(_record_lines(recs[done[1]:]))
                f.flush()
                os.fsync(f.fileno())
    else:
        write_atomic(rpath, _record_lines(recs))
    manifest._records_written = (rpath, len(recs))
    manifest.requests_count = len(recs)
    manifest.schema_version = SCHEMA_VERSION  # the format just written (a loaded v1 moves on)
    write_atomic(path, _manifest_json(manifest))


def _read_records(mpath: Path, name: str, count: int) -> list[dict]:
    """The first ``count`` records of the JSON Lines file ``name`` beside ``mpath`` (later lines
    belong to a phase whose manifest write never happened). Raises ValueError naming the file."""
    if Path(name).name != name or name in (".", ".."):
        raise ValueError(f"{mpath}: requests_file {name!r} must be a file name in the run folder")
    rpath = mpath.parent / name
    try:
        lines = rpath.read_text().split("\n")[:-1]  # complete lines only (a kill mid-append)
    except OSError as exc:
        raise ValueError(f"{mpath}: its request records {rpath} cannot be read: {exc}") from None
    out = []
    for i, line in enumerate(lines[:count], 1):
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{rpath}, line {i}: not a JSON request record: {exc}") from None
    if len(out) < count:
        raise ValueError(f"{rpath}: {len(out)} request records, but {mpath.name} names "
                         f"{count} (requests_count)")
    return out


def lines_beyond(path: Path) -> int:
    """How many complete lines the run's JSON Lines request file holds after the records its
    manifest covers (``requests_count``): records of a phase whose manifest write never
    happened (a kill between the two), or lines not written by the harness. 0 when there is no
    such file or it cannot be read. ``path``: a run folder or its manifest.json."""
    path = Path(path)
    mpath = path / "manifest.json" if path.is_dir() else path
    try:
        data = json.loads(mpath.read_text())
        name, count = data.get("requests_file"), int(data.get("requests_count") or 0)
        if not name or "requests" in data or Path(name).name != name:
            return 0
        lines = (mpath.parent / name).read_text().split("\n")[:-1]
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
    return max(0, len(lines) - count)


def load_manifest(path: Path, with_requests: bool = True) -> Manifest:
    """Load a manifest (and its request records) from a file or a run folder.

    Reads schema versions 1 (records inline under ``requests``) and 2 (records in the JSON Lines
    file ``requests_file`` beside the manifest; a file that carries ``requests`` inline anyway
    uses those). ``with_requests=False`` skips the records file (``requests`` stays empty), for
    readers that need only references or provenance. Raises ValueError naming the file on bad
    input.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable ple-harness manifest: {exc}") from None
    if not isinstance(data, dict) or "run_id" not in data or "schema_version" not in data:
        raise ValueError(f"{path}: not a ple-harness manifest (no run_id / schema_version)")
    if data["schema_version"] not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(f"{path}: manifest schema version {data['schema_version']!r}; this "
                         f"ple-harness reads versions "
                         f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
    if "requests" not in data and data.get("requests_file") and with_requests:
        count = data.get("requests_count")
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"{path}: requests_count: expected a count >= 0, got {count!r}")
        data["requests"] = _read_records(path, data["requests_file"], count)
    try:
        return Manifest.model_validate(data)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise ValueError(f"{path}: not a valid ple-harness manifest: "
                         f"{' '.join(first[1:3]) if len(first) > 2 else first[0]}") from None
