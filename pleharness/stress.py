"""The ``stress`` job: launch or attach, run the selected scenarios, write the manifest, verdict.

The job is :func:`run_stress`; its steps (references, engines, suite, control, evidence, sides,
confirmation, verdict) live in :mod:`pleharness.pipeline`, one floor down, where the other jobs
that run a ``stress`` run (a reproducer's replay, a selftest pass) import them too.
"""
from __future__ import annotations

from .pipeline import run_stress

__all__ = ["run_stress"]
