"""Reference-free output checks, one module each, registered by name.

A request check is a callable ``check(ctx, spec, completion, params) -> CheckResult``; its docstring
states exactly what it asserts. ``ctx`` is the :class:`pleharness.runner.RunContext` (engine facts,
references), ``spec`` the :class:`pleharness.runner.RequestSpec`, ``completion`` the
:class:`pleharness.engine.client.Completion`, ``params`` the check's parameters from the scenario.
A check that cannot run returns status ``skip`` with the reason; it never passes silently.
"""
from __future__ import annotations

from collections.abc import Callable

REGISTRY: dict[str, Callable] = {}
# Phase checks: ``check(ctx, phase_record) -> CheckResult``, run after every phase.
PHASE_REGISTRY: dict[str, Callable] = {}
# Checks applied to every request unless a scenario says otherwise.
DEFAULT_CHECKS = ("vocab_range", "usage", "logprob_sanity", "degeneration")
DEFAULT_PHASE_CHECKS = ("health_after_phase",)


def _registrar(registry: dict[str, Callable]):
    def register_as(name: str):
        def deco(fn):
            registry[name] = fn
            fn.check_name = name
            return fn
        return deco
    return register_as


register = _registrar(REGISTRY)  # request checks
register_phase = _registrar(PHASE_REGISTRY)  # phase checks


def _load() -> None:
    from . import (counting, degeneration, expected_text, health_after_phase,  # noqa: F401
                   logprob_sanity, max_model_len_edge, usage, vocab_range)


_load()
