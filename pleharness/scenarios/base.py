"""Scenario registry and TOML scenario files.

A scenario file (``scenarios/NAME.toml``) names a registered kind and its parameters::

    kind = "transitions"
    description = "..."          # optional, one line
    [params]                     # validated by the kind's Params model (unknown keys rejected)
    ladder = [4, 3, 2, 1]

Errors name the file and, for parameters, the dotted key and what was expected.

This module is the scenario kinds' API: besides :class:`Scenario` and :class:`Params` it
exposes :class:`~pleharness.manifest.tables.TableRow` (the base of a kind's table rows, defined
with the manifest's other tables).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from ..errors import UsageError
from ..manifest.tables import TableRow  # the scenario API's row base (kinds import it here)
from ..tomlfile import find_named, read_toml, validate

if TYPE_CHECKING:  # pragma: no cover
    from ..manifest import Manifest
    from ..run.scenario_context import ScenarioContext

REGISTRY: dict[str, type["Scenario"]] = {}


class ScenarioError(UsageError, ValueError):
    """A scenario file or override is malformed; the message names the file and the key."""


class Params(BaseModel):
    """Base for scenario parameters: unknown keys are errors, and so are NaN and infinities
    ("Input should be a finite number", not an out-of-range message)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Scenario(ABC):
    """A named, parameterised schedule of phases.

    Subclasses set ``kind`` (registry name), ``summary`` (one line), ``Params`` (a pydantic model)
    and ``phases`` (or override :meth:`planned_phases`), and implement :meth:`run`, which issues
    phases through the run context; :func:`register` checks that all of them are there. A kind
    that writes a table declares it in ``tables`` ({manifest table key: row model}), stores it
    with :meth:`put_table`, and renders it in summary.md by overriding :meth:`markdown`.
    """

    kind: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[Params]]
    phases: ClassVar[int | None] = None  # load phases per run, when fixed (0: only known at run time)
    tables: ClassVar[dict[str, type[TableRow]]] = {}
    # a kind that writes reproducers (``tables["reproducers"]``: ReproducerRow) for the stress
    # job's confirmation step (--confirm-runs) to replay on fresh engines
    writes_reproducers: ClassVar[bool] = False

    def __init__(self, name: str, params: Params, source: str, description: str = ""):
        self.name = name
        self.params = params
        self.source = source
        self.description = description or self.summary

    def definition(self) -> dict[str, Any]:
        """The scenario as run (for the manifest)."""
        return {"name": self.name, "kind": self.kind, "source": self.source,
                "description": self.description, "params": self.params.model_dump()}

    @staticmethod
    def leave_out_phases(ctx: "ScenarioContext", phases: "list[str | tuple[str, int]]",
                         reason: str) -> None:
        """Record each planned load phase of ``phases`` (a name, or (name, concurrency)) as left
        out on this engine with ``reason`` (:meth:`ScenarioContext.leave_out`): what a kind does
        when its requests cannot fit the engine's facts, instead of raising. Parameters that are
        wrong on every engine are Params errors, found before the engine starts."""
        for ph in phases:
            name, c = (ph, 1) if isinstance(ph, str) else ph
            ctx.leave_out(name, reason, c)

    def planned_phases(self) -> int:
        """How many load phases :meth:`run` records with these parameters (for the manifest's
        ``summary.phases_planned``; reference and warm-up phases are not counted). Default: the
        class's ``phases``; kinds whose count depends on the parameters override this."""
        if self.phases is None:
            raise NotImplementedError(f"scenario kind {self.kind}: set phases or override "
                                      "planned_phases()")
        return self.phases

    @abstractmethod
    def run(self, ctx: "ScenarioContext") -> None:
        """Issue the scenario's phases through ``ctx``."""

    def plan(self, ctx: "ScenarioContext") -> None:
        """What :func:`pleharness.run.dryrun.plan_scenario` runs to plan this scenario on an
        engine's facts without an engine: ``ctx`` is a planning context (its engine synthetic,
        its phases recorded, not sent). Default: :meth:`run` itself, so the plan is what the run
        does; a kind whose run is a search (``fuzz``) says what it would draw instead."""
        self.run(ctx)

    @classmethod
    def put_table(cls, ctx: "ScenarioContext", key: str, rows: list[TableRow]) -> None:
        """Store ``rows`` (instances of ``cls.tables[key]``) as the manifest table ``key`` (one
        JSON object per row; ``ctx.set_table``). Raises TypeError for a row of another model."""
        model = cls.tables[key]
        bad = [r for r in rows if not isinstance(r, model)]
        if bad:
            raise TypeError(f"{cls.kind} table {key!r}: rows must be {model.__name__}, got "
                            f"{type(bad[0]).__name__}")
        ctx.set_table(key, rows)

    @classmethod
    def table(cls, m: "Manifest", key: str) -> list[TableRow]:
        """The rows of ``m.tables[key]`` as ``cls.tables[key]`` models ([] when absent).
        Raises pydantic's ValidationError for a row that does not fit the model."""
        model = cls.tables[key]
        return [model.model_validate(r) for r in m.tables.get(key) or []]

    @classmethod
    def markdown_table(cls, m: "Manifest", key: str, title: str,
                       columns: list[tuple[str, Any]]) -> list[str]:
        """A summary.md section for :meth:`markdown`: a blank line, ``### title`` and a Markdown
        table of the rows of ``m.tables[key]`` (:meth:`table`), one column per ``(header,
        cell)``: ``cell`` is a row attribute's name or a function of the row giving its text; a
        header ending in ``:`` is right-aligned (numbers) and shown without it. [] when the
        table is empty or absent."""
        rows = cls.table(m, key)
        if not rows:
            return []
        cells = [(lambda r, a=c: getattr(r, a)) if isinstance(c, str) else c for _, c in columns]
        return ["", f"### {title}", "",
                "| " + " | ".join(h.rstrip(":") for h, _ in columns) + " |",
                "|" + "|".join("---:" if h.endswith(":") else "---" for h, _ in columns) + "|",
                *("| " + " | ".join(str(f(r)) for f in cells) + " |" for r in rows)]

    @classmethod
    def refresh_tables(cls, m: "Manifest") -> None:  # noqa: B027 - optional hook
        """After the run's final judgement (golden floor, control, sides): bring this kind's
        tables in ``m`` in line with the records' final verdicts (one class everywhere, issue
        32). Default: nothing."""

    @classmethod
    def markdown(cls, m: "Manifest") -> list[str]:
        """This kind's section(s) of summary.md for manifest ``m``, as Markdown lines (each
        section starts with a blank line); [] when it has nothing to show. Default: []."""
        return []


def register(cls: type[Scenario]) -> type[Scenario]:
    """Class decorator: make ``cls`` loadable as ``kind = "<cls.kind>"`` in scenario files.

    Raises TypeError when the class lacks ``kind``, ``summary`` or ``Params``, declares neither
    ``phases`` nor its own ``planned_phases``, or its kind is registered already."""
    missing = [a for a in ("kind", "summary", "Params") if not hasattr(cls, a)]
    if cls.phases is None and cls.planned_phases is Scenario.planned_phases:
        missing.append("phases (or a planned_phases method)")
    if missing:
        raise TypeError(f"scenario kind {cls.__name__}: missing {', '.join(missing)}")
    if cls.kind in REGISTRY and REGISTRY[cls.kind] is not cls:
        raise TypeError(f"scenario kind {cls.kind!r} is registered already "
                        f"({REGISTRY[cls.kind].__module__})")
    REGISTRY[cls.kind] = cls
    return cls


def scenario_dirs() -> list[Path]:
    """Where shipped scenario files live: the installed package data, then the source tree."""
    here = Path(__file__).resolve().parent.parent
    return [p for p in (here / "scenarios_data", here.parent / "scenarios") if p.is_dir()]


def find_scenario_file(name_or_path: str) -> Path:
    """A scenario file path, or a shipped scenario's name (``boundary`` ->
    ``scenarios/boundary.toml``). Raises ScenarioError listing the shipped names."""
    return find_named(name_or_path, scenario_dirs(), "scenario", ScenarioError)


def build_params(kind_cls: type[Scenario], raw: dict[str, Any], where: str) -> Params:
    """Validate ``raw`` against the kind's Params; errors name ``where`` and the key."""
    return validate(kind_cls.Params, raw, where, prefix="params.", error=ScenarioError)


def load_scenario_file(name_or_path: str, overrides: dict[str, Any] | None = None) -> Scenario:
    """Load a scenario file by name (shipped) or path, apply ``overrides`` to its params.

    Raises ScenarioError naming the file (and line for TOML syntax errors, key otherwise).
    """
    path = find_scenario_file(name_or_path)
    data = read_toml(path, "scenario", ScenarioError)
    unknown = set(data) - {"kind", "description", "params", "name"}
    if unknown:
        raise ScenarioError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))} "
                            "(allowed: kind, name, description, params)")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise ScenarioError(f"{path}: key 'kind' is missing or not a string "
                            f"(known kinds: {', '.join(sorted(REGISTRY))})")
    if kind not in REGISTRY:
        raise ScenarioError(f"{path}: kind {kind!r} is not a known scenario kind "
                            f"(known: {', '.join(sorted(REGISTRY))})")
    raw = data.get("params", {})
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: key 'params' must be a table")
    raw = {**raw, **(overrides or {})}
    cls = REGISTRY[kind]
    where = str(path) + (" (with overrides from a suite or the command line)" if overrides else "")
    params = build_params(cls, raw, where)
    desc = data.get("description", "")
    return cls(str(data.get("name", path.stem)), params, str(path), desc)


def load_scenarios(names: list, overrides: dict[str, Any]) -> list[Scenario]:
    """Load scenario files; each override applies to the scenarios whose parameters have that key.

    ``names`` items are a scenario name or path, or (name, params) pairs from a suite, whose
    params override the file's (command-line overrides win over both). Raises UsageError
    (ScenarioError) naming the file and key, or the overrides that apply to no scenario.
    """
    out = []
    for item in names:
        n, own = (item, {}) if isinstance(item, str) else item
        sc = load_scenario_file(n)
        mine = {**own, **{k: v for k, v in overrides.items() if k in type(sc.params).model_fields}}
        if mine:
            sc = load_scenario_file(n, mine)
        out.append(sc)
    chosen = [sc.name for sc in out]
    twice = sorted({n for n in chosen if chosen.count(n) > 1})
    if twice:
        raise UsageError(f"scenario(s) {', '.join(twice)} selected more than once: phases and "
                         "tables are named by the scenario, so the runs could not be told apart "
                         "(use --suite-repeats to run the suite again)")
    unused = set(overrides) - {k for sc in out for k in type(sc.params).model_fields}
    if unused:
        raise UsageError(f"option(s) {', '.join(sorted(unused))} apply to none of the selected "
                         f"scenarios ({', '.join(str(n) for n in names)})")
    return out
