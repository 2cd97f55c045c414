"""Scenario kinds, one module each, registered by name (see :mod:`.base`)."""
from .base import REGISTRY, Scenario, ScenarioError, load_scenario_file, register, scenario_dirs

# Import kinds so that they register themselves.
from . import (boundary, capture_edges, determinism, fuzz, insert, kv_pressure,  # noqa: E402,F401
               pairs, replay, sampled, transitions)

__all__ = ["REGISTRY", "Scenario", "ScenarioError", "load_scenario_file", "register",
           "scenario_dirs"]
