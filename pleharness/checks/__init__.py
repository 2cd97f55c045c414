"""Reference-free output checks, one module each, registered by name.

A request check is a callable ``check(ctx, spec, completion, params) -> CheckResult``; its docstring
states exactly what it asserts. ``ctx`` is the :class:`pleharness.run.context.CheckContext` (engine
facts, references, phase role, golden model, client, engine version: never the run or its
manifest), ``spec`` the :class:`pleharness.request.RequestSpec`, ``completion`` the
:class:`pleharness.engine.completion.Completion`, ``params`` the check's parameters from the scenario.
A check that cannot run returns status ``skip`` with the reason; it never passes silently.

Each check is of one of two kinds (its ``kind`` attribute; its docstring says which):
``absolute`` checks assert the engine's contract and always fail on a violation; ``relative``
checks assert model behaviour and fail only when the reference passes them
(:mod:`pleharness.checks.relative`; ``degeneration`` applies its own rules). Register one with
``@register(name, kind="relative")``.
"""
from __future__ import annotations

from collections.abc import Callable

from .relative import KINDS, RELATIVE, relative

REGISTRY: dict[str, Callable] = {}
# Phase checks: ``check(ctx, phase_record) -> CheckResult`` (``ctx``: the CheckContext), run
# after every phase.
PHASE_REGISTRY: dict[str, Callable] = {}
# Checks applied to every request unless a scenario says otherwise.
DEFAULT_CHECKS = ("vocab_range", "usage", "logprob_sanity", "degeneration")
DEFAULT_PHASE_CHECKS = ("health_after_phase",)


def _registrar(registry: dict[str, Callable]):
    def register_as(name: str, kind: str = "absolute", own_rules: bool = False):
        """Register ``fn`` as check ``name`` of ``kind``: ``absolute`` (the engine's contract:
        a violation always fails) or ``relative`` (model behaviour: a failure is judged by the
        reference, :mod:`pleharness.checks.relative`, unless ``own_rules``: the check judges
        against the reference itself, as ``degeneration`` does). Raises ValueError for another
        kind, and for a ``name`` registered already (two checks of one name would silently
        replace one another)."""
        if kind not in KINDS:
            raise ValueError(f"check {name}: kind must be one of {KINDS}, not {kind!r}")

        def deco(fn):
            if name in registry:
                raise ValueError(f"check {name!r} is registered already (by "
                                 f"{getattr(registry[name], '__module__', '?')}); names are "
                                 "unique")
            wrapped = relative(fn) if kind == RELATIVE and not own_rules else fn
            registry[name] = wrapped
            wrapped.check_name = name
            wrapped.kind = kind
            return wrapped
        return deco
    return register_as


register = _registrar(REGISTRY)  # request checks
register_phase = _registrar(PHASE_REGISTRY)  # phase checks


# the checks register themselves on import, once register and register_phase exist
from . import (choices, constrained, counting, degeneration,  # noqa: E402,F401
               expected_text, health_after_phase, logprob_sanity, max_model_len_edge,
               prompt_logprobs, sampled_degeneration, special_tokens, stop_string, stop_token,
               usage, vocab_range)
