"""Results manifest: schema (pydantic), atomic writer.

``results/<run-id>/manifest.json`` is rewritten atomically (temporary file in the same folder, fsync,
``os.replace``) after every phase, so a run that stops part-way leaves a valid file whose ``status``
says how it ended. Every number carries its unit in its name (``_s`` seconds, ``_tok_per_s`` tokens
per second). Token hashes use the canonical encoding of :mod:`pleharness.parity`.
"""
from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1

RunStatus = Literal["running", "complete", "incomplete", "failed", "engine_died", "interrupted"]
Verdict = Literal["pass", "fail", "error"]
CheckStatus = Literal["pass", "fail", "warn", "note", "skip"]  # note: model behaviour, not a fault


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class CheckResult(BaseModel):
    """Outcome of one check on one request or phase; ``detail`` is the evidence or the skip reason."""

    name: str
    status: CheckStatus
    detail: str = ""


class RequestRecord(BaseModel):
    """One request: what was sent, what came back, and how it compares with its reference."""

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
    divergence: dict[str, Any] | None = None  # see pleharness.divergence.analyse
    checks: list[CheckResult] = Field(default_factory=list)
    note: str | None = None
    temperature: float = 0.0  # sampling sent (0: greedy)
    seed: int | None = None  # per-request seed sent, if any
    stream: bool = True  # streamed (SSE) or one JSON response


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
    source: str = "solo"  # solo | engine | golden | manifest
    cache_state: str = "cold"  # cold: the prompt's first run; warm: a later, prefix-cached run
    cold_output_hash: str | None = None  # for a warm reference: the first run's hash
    temperature: float = 0.0  # sampling of the reference request (0: greedy)
    seed: int | None = None  # per-request seed of a sampled reference


class Manifest(BaseModel):
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
    run_options: dict[str, Any] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    scenarios: list[dict[str, Any]] = Field(default_factory=list)
    references: list[ReferenceRecord] = Field(default_factory=list)
    phases: list[PhaseRecord] = Field(default_factory=list)
    requests: list[RequestRecord] = Field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    # token IDs of the prompts of every phase where an output diverged (prompt hash -> IDs), so
    # that `ple-harness explain` can replay the case
    prompts: dict[str, list[int]] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Rewrite the whole manifest atomically (compact JSON: about 1.2 kB per request)."""
    write_atomic(path, manifest.model_dump_json())


def load_manifest(path: Path) -> Manifest:
    """Load a manifest from a file or a run folder. Raises ValueError with the path on bad input."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable ple-harness manifest: {exc}") from None
    if not isinstance(data, dict) or "run_id" not in data or "schema_version" not in data:
        raise ValueError(f"{path}: not a ple-harness manifest (no run_id / schema_version)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"{path}: manifest schema version {data['schema_version']!r}; this "
                         f"ple-harness reads version {SCHEMA_VERSION}")
    try:
        return Manifest.model_validate(data)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise ValueError(f"{path}: not a valid ple-harness manifest: "
                         f"{' '.join(first[1:3]) if len(first) > 2 else first[0]}") from None
