"""The command-line option a config field carries, as plain data (issue 50 item 4: the option is
the config field). A config group's field is ``Annotated[type, Opt(help=..., min=..., panel=...)]``
with its default: one place for the option's default, help, bounds and panel. The command line
(:mod:`pleharness.cli.options`) reads them with :func:`options_of` and makes the typer options;
this module imports neither typer nor anything of the command line, so that the configuration
(:mod:`pleharness.config`, :class:`pleharness.engine.inflight.Timeouts`) can carry its options.

A field's option is named as the field unless :attr:`Opt.name` says otherwise (``runs`` is
``--confirm-runs``); its value is the field's type (a ``Literal`` of strings: a choice) unless
:attr:`Opt.cli_type` says otherwise, and then :attr:`Opt.parse` makes the field's value of it
(``--parallel-engines``: a string, a number or auto)."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# help panels of `stress --help` (and the commands that share its options)
P_ENGINE = "Engine (launched by the harness)"
P_ATTACH = "Attach to a running engine (--url) and its facts"
P_SCEN = "Scenarios"
P_REF = "References and verdict"
P_CTRL = "Control run (attribution: docs/attribution.md)"
P_TIME = "Timeouts"
P_OUT = "Output"


@dataclass(frozen=True)
class Opt:
    """The option of a config field: ``help``; ``panel``: the help panel that lists it; ``min`` /
    ``max``: bounds of a number (kept as written: ``86400`` shows as an int); ``name``: the
    option's Python name where it is not the field's (its flag: ``--`` and ``-`` for ``_``);
    ``cli_type``: the option's value type where it is not the field's, and ``parse``: the
    field's value of an option value (None: the value itself); ``envvar``: an environment
    variable that sets it (shown in --help)."""

    help: str
    panel: str | None = None
    min: int | float | None = None
    max: int | float | None = None
    name: str | None = None
    cli_type: Any = None
    parse: Callable[[Any], Any] | None = None
    envvar: str | None = None


@dataclass(frozen=True)
class FieldOption:
    """One option-carrying field of a config class: ``cls`` and ``field`` name it, ``opt`` is its
    annotation, ``type`` the field's value type (the annotation's first argument), ``default``
    the field's default."""

    cls: type
    field: str
    opt: Opt
    type: Any
    default: Any

    @property
    def name(self) -> str:
        """The option's Python name (its flag: ``--`` and ``-`` for ``_``)."""
        return self.opt.name or self.field

    def value(self, option_value: Any) -> Any:
        """The field's value of the option's value (:attr:`Opt.parse`)."""
        return self.opt.parse(option_value) if self.opt.parse else option_value


def options_of(cls: type) -> dict[str, FieldOption]:
    """{field name: :class:`FieldOption`} of the dataclass ``cls``, for each field annotated with
    an :class:`Opt`, in field order (a field without one is no option)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        opts = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Opt)]
        if not opts:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[f.name] = FieldOption(cls, f.name, opts[0], typing.get_args(hint)[0], default)
    return out


def as_list(value: Any) -> list:
    """A repeatable option's value as its field's list (not given: empty)."""
    return list(value or [])


def repeatable(help: str, *, name: str, panel: str) -> Opt:
    """The :class:`Opt` of a repeatable option filling a ``list[str]`` field (an engine argument
    added or a flag dropped: ``--reference-engine-arg``, ``--control-drop-arg``, ...): not
    given, the field's empty list (:func:`as_list`)."""
    return Opt(help=help, name=name, panel=panel, cli_type=list[str] | None, parse=as_list)
