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
    [control]                         # a run of this suite needs a control run (pre-merge)
    required = true
    why = "HEAD against BASE: --control-engine-python /opt/vllm-base/bin/python"

Shipped suites live in ``scenarios/suites/``. Errors name the file and the key; an error in a
scenario entry (unknown scenario, bad ``params``) names the suite file, the entry
(``scenario[i]``) and the scenario. A scenario may appear once per suite: its phases and tables
are named by the scenario, so a second run of it would be indistinguishable from the first.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from .compare_spec import SPEC_THRESHOLD

from .compare import THRESHOLD
from .errors import UsageError
from .scenarios import load_scenario_file
from .scenarios.base import scenario_dirs
from .tomlfile import find_named, read_toml, validate


class SuiteScenario(BaseModel):
    """One ``[[scenario]]`` entry of a suite: a scenario name or path and parameter overrides."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class Gates(BaseModel):
    """A suite's ``[gates]`` for ``ple-harness compare``: throughput ratio floors (fractions of
    the baseline) and absolute thresholds like ``C4>=62.985`` (tokens/s at concurrency 4)."""

    model_config = ConfigDict(extra="forbid")
    min_throughput_ratio: float | None = Field(None, ge=0)
    min_phase_ratio: float | None = Field(None, ge=0)
    thresholds: list[str] = Field(default_factory=list)

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, v: list[str]) -> list[str]:
        for t in v:
            if not THRESHOLD.match(t) and not SPEC_THRESHOLD.match(t):
                raise ValueError(f"{t!r} is not like 'C4>=62.985' or 'acceptance>=0.95*base'")
        return v


class SuiteControl(BaseModel):
    """A suite's ``[control]``: ``required`` (a run of this suite needs a control run: any
    ``--control-*`` option, e.g. ``--control-engine-python BASE/bin/python`` for HEAD against
    BASE; without one it is a usage error, before anything starts) and ``why`` (said with it)."""

    model_config = ConfigDict(extra="forbid")
    required: bool = False
    why: str = ""


class Suite(BaseModel):
    """A suite file: scenarios with parameters, how often the whole suite repeats, compare gates,
    and whether its runs need a control run (``[control]``)."""

    model_config = ConfigDict(extra="forbid")
    description: str = ""
    repeat: int = Field(1, ge=1)
    scenario: list[SuiteScenario] = Field(min_length=1)
    gates: Gates = Field(default_factory=Gates)
    control: SuiteControl = Field(default_factory=SuiteControl)

    def scenario_refs(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, params) pairs in order, as :func:`pleharness.scenarios.load_scenarios` takes them."""
        return [(s.name, s.params) for s in self.scenario]


def load_suite(name_or_path: str) -> Suite:
    """A suite by shipped name (``scenarios/suites/NAME.toml``) or path, with every scenario entry
    loaded once with its ``params`` (so that a bad entry is found before anything starts).

    Raises UsageError naming the file and the key; for a scenario entry, the suite file, the entry
    (``scenario[i]``, 0-based) and the scenario; for a scenario named twice, both entries.
    """
    path = find_named(name_or_path, [d / "suites" for d in scenario_dirs()], "suite")
    suite = validate(Suite, read_toml(path, "suite"), str(path))
    seen: dict[str, int] = {}
    for i, entry in enumerate(suite.scenario):
        try:
            sc = load_scenario_file(entry.name, entry.params or None)
        except UsageError as exc:
            raise UsageError(f"{path}: scenario[{i}] ({entry.name!r}): {exc}") from None
        if sc.name in seen:
            raise UsageError(f"{path}: scenario[{i}] ({entry.name!r}) is scenario {sc.name!r} "
                             f"again (as scenario[{seen[sc.name]}]): its phases and tables would "
                             "carry the same names; put both parameter sets in one entry, or "
                             "give the second a scenario file with its own name = \"...\"")
        seen[sc.name] = i
    return suite
