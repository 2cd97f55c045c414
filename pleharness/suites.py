"""Suites: a TOML file composing scenarios with their parameters, the number of repeats, and the
gates that ``ple-harness compare`` applies (nightly and pre-merge runs).

    description = "..."
    repeat = 3                        # whole-suite repeats on one engine
    [[scenario]]
    name = "transitions"              # a shipped scenario name or a TOML path
    params = { repeats = 2 }          # overrides of that scenario's [params]
    [gates]                           # for `ple-harness compare --suite NAME BASE HEAD`
    min_throughput_ratio = 0.95
    min_phase_ratio = 0.5
    thresholds = ["C4>=100"]

Shipped suites live in ``scenarios/suites/``. Errors name the file and the key.
"""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .engine.errors import UsageError
from .scenarios.base import scenario_dirs


class SuiteScenario(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class Gates(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_throughput_ratio: float | None = None
    min_phase_ratio: float | None = None
    thresholds: list[str] = Field(default_factory=list)


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    repeat: int = Field(1, ge=1)
    scenario: list[SuiteScenario] = Field(min_length=1)
    gates: Gates = Field(default_factory=Gates)

    def scenario_refs(self) -> list[tuple[str, dict[str, Any]]]:
        return [(s.name, s.params) for s in self.scenario]


def find_suite(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise UsageError(f"{p}: suite file not found")
        return p
    for d in scenario_dirs():
        cand = d / "suites" / f"{name_or_path}.toml"
        if cand.is_file():
            return cand
    known = sorted({f.stem for d in scenario_dirs() for f in (d / "suites").glob("*.toml")})
    raise UsageError(f"unknown suite {name_or_path!r} (known: {', '.join(known)})")


def load_suite(name_or_path: str) -> Suite:
    path = find_suite(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: TOML syntax error: {exc}") from None
    try:
        return Suite.model_validate(data)
    except ValidationError as exc:
        msgs = []
        for e in exc.errors():
            key = ".".join(str(x) for x in e["loc"])
            msgs.append(f"{key}: unknown key" if e["type"] == "extra_forbidden" else f"{key}: {e['msg']}")
        raise UsageError(f"{path}: " + "; ".join(msgs)) from None
