"""Reference-free output checks, one module each, registered by name.

A check is a callable ``check(ctx, spec, completion, params) -> CheckResult``; its docstring states
exactly what it asserts.
"""
from __future__ import annotations

from collections.abc import Callable

REGISTRY: dict[str, Callable] = {}


def register(name: str):
    def deco(fn):
        REGISTRY[name] = fn
        fn.check_name = name
        return fn
    return deco
