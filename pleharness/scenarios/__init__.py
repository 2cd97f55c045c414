"""Scenario kinds, one module each, registered by name (see :mod:`.base`)."""
from .base import (REGISTRY, Scenario, ScenarioError, load_scenario_file, load_scenarios, register,
                   scenario_dirs)

# Import kinds so that they register themselves.
from . import (boundary, capture_edges, chat_api, choices, constrained,  # noqa: E402,F401
               determinism, disconnects, fuzz, insert, kv_pressure, mixed_params, pairs,
               prefix_isolation, prompt_logprobs, replay, sampled, stop_strings, transitions)

__all__ = ["REGISTRY", "Scenario", "ScenarioError", "load_scenario_file", "load_scenarios",
           "register", "scenario_dirs"]
