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

The records of a run's parts (:class:`CheckResult`, :class:`RequestRecord` with its
:class:`Divergence`, :class:`SideEvidence` and :class:`ControlEvidence`, :class:`PhaseRecord`,
:class:`ReferenceRecord`) live in :mod:`.records`; this package exposes them as part of the
manifest's schema (``from pleharness.manifest import RequestRecord``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ..files import write_private
from ..jobrecord import JobRecord, JobStatus
from ..timeline import Timeline, now_iso
from .records import (CheckResult, ControlEvidence, Divergence, PhaseRecord, ReferenceRecord,
                      RequestRecord, ScoreDiffs, SetFieldsOnly, SideEvidence)

__all__ = ["CheckResult", "ControlEvidence", "Divergence", "EngineRecord", "Manifest",
           "PhaseRecord", "ReferenceRecord", "RequestRecord", "RunOptionsRecord", "ScoreDiffs",
           "SideEvidence",
           "Summary", "lines_beyond", "load_manifest", "now_iso", "requests_file_name",
           "write_atomic", "write_manifest"]
SCHEMA_VERSION = 2  # 2: request records in a JSON Lines file (requests_file); 1: inline
READABLE_SCHEMA_VERSIONS = (1, 2)

# control_failed: the run under test completed and was judged, but the requested control engine
# failed to start or died (issue 32 item 4: exit 3, its divergences unattributed)
RunStatus = JobStatus  # one vocabulary for every job (pleharness.jobrecord)
Verdict = Literal["pass", "fail", "error"]






class _Section(SetFieldsOnly):
    """A manifest section with its keys as typed fields, read and written as attributes (None
    where the key is absent); its JSON holds only the keys that were set (loaded, built or
    assigned), in field order, so a section reads the same as when it was a plain dict
    (``model_fields_set`` says which keys are present). Strict types: a value of another JSON
    type is refused at load time, never coerced (the file is not rewritten). Unknown keys are
    refused, from a writer (``AttributeError``-like ValueError) and in a file
    (:func:`load_manifest`'s ValueError names the file, the section and the key)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def assign(self, **values: Any) -> None:
        """Set several fields at once (``s.assign(api="chat", api_used="chat")``); a name that
        is not a field raises ValueError."""
        for k, v in values.items():
            setattr(self, k, v)

    def __iter__(self):
        # no mapping layer (issue 34): ``for k in section`` / ``k in section`` would iterate
        # pydantic's (name, value) pairs and quietly answer False; read the attributes instead
        raise TypeError(f"{type(self).__name__} is not iterable: read its attributes "
                        "(model_fields_set names the keys present)")


class EngineRecord(_Section):
    """``manifest.engine``: the engine under test as the run saw it (:mod:`pleharness.pipeline`,
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
    # said before the launch (pleharness.engine.fact_sources.positions_warning)
    launch_warnings: list[str] | None = None


class RunOptionsRecord(_Section):
    """``manifest.run_options``: the options that decide how outputs were judged."""

    reference: str | None = None  # solo | warm | golden | engine | manifest
    repeat: int | None = None
    strict: bool | None = None  # near ties fail (--strict)
    on_timeout: str | None = None  # --on-timeout policy
    logprobs: int | None = None  # top-k logprobs asked for
    # near-tie threshold, nats: resolved from --near-tie-nats and the serving dtype when the
    # engine's run context is made (passes.engine_context, its one writer; None before: a run
    # that never reached an engine), amended only by a measured envelope (envelope.apply)
    near_tie_nats: float | int | None = None
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
    role: str | None = None  # "control run" in a control run's manifest (pleharness.passes)
    # issue 47: the run's numerics envelope and the tolerances derived from it, with where each
    # came from (pleharness.envelope)
    numerics_envelope: dict[str, Any] | None = None
    # whether the run had an independent reference (a control run, a reference engine, a golden
    # or stored reference), and what it was; a run without one says so in its headline
    independent_reference: str | None = None


class Summary(_Section):
    """``manifest.summary``: the run's counts and headline (:func:`pleharness.verdict.summarize`
    writes it; counts are requests or outputs unless named otherwise)."""

    headline: str | None = None
    phases_planned: int | None = None
    phases_completed: int | None = None
    # planned load phases left out on this engine (status skip, vacuous with the reason:
    # RunContext.leave_out); a complete run has completed + left out = planned
    phases_left_out: int | None = None
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
    # solo greedy requests both the run under test and its control ran (issue 47,
    # pleharness.differential): compared, differing, differing hard
    differential: dict[str, Any] | None = None
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

    def add_corrupt_reference(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` (method, evidence, ...) to ``corrupt_references`` (created when
        absent)."""
        if self.corrupt_references is None:
            self.corrupt_references = []
        self.corrupt_references.append(entry)


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
    timeline: Timeline = Field(default_factory=Timeline)  # pleharness.timeline (issue 49)
    # the job's record (pleharness.jobrecord.JobRecord, as confirm.json, explain.json and
    # selftest.json embed it): the top-level status, exit code, reason, root cause and times
    # with the steps the job finished; None in a manifest of before issue 50
    job: JobRecord | None = None
    # (records file, records already in it) of the last write; not serialized
    _records_written: tuple[Path, int] | None = PrivateAttr(default=None)
    # (phase, its JSON) per phase at the last write: older phases are not serialized again
    _phase_json: list[tuple[PhaseRecord, str]] = PrivateAttr(default_factory=list)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SECTIONS and not isinstance(value, _SECTIONS[name]):  # e.g. a plain dict
            raise TypeError(f"manifest.{name} must be a {_SECTIONS[name].__name__}, got "
                            f"{type(value).__name__}")
        super().__setattr__(name, value)

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
    if rpath.exists() and not rpath.is_file():  # a FIFO would block the read
        raise ValueError(f"{mpath}: its request records {rpath} are not a regular file (a FIFO "
                         "or device): the run folder was not written by ple-harness as it is")
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
        if not name or "requests" in data or Path(name).name != name or \
                not (mpath.parent / name).is_file():
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
    if path.exists() and not path.is_file():  # a FIFO would block the read
        raise ValueError(f"{path}: not a regular file (a FIFO or device): not a manifest")
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
