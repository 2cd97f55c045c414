"""Engine profiles: a production launch's flags in one TOML file (``--engine-profile FILE``).

Keys (all optional): ``model`` (local path), ``python`` (interpreter with vLLM), ``tp``
(tensor-parallel size), ``served_model_name``, ``host``, ``engine_args`` (list of strings, appended
to the server command), ``[env]`` (environment variables for the engine). Command-line flags
override the profile: ``--model``, ``--tp``, ``--engine-python``, ``--served-model-name``,
``--host`` replace; ``--engine-arg`` values are appended after the profile's (so they win in vLLM's
argument parser); ``--engine-env`` entries replace the profile's of the same name.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .tomlfile import read_toml, validate


class EngineProfile(BaseModel):
    """An engine profile file (TOML): model, python, tp, served_model_name, host, engine_args and
    ``[env]``; every key optional, unknown keys refused. Command-line flags override it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    python: str | None = None
    tp: int | None = Field(None, ge=1)
    served_model_name: str | None = None
    host: str | None = None
    engine_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


def load_profile(path: str | Path) -> EngineProfile:
    """Read and validate a profile. Raises UsageError naming the file (and line or key)."""
    return validate(EngineProfile, read_toml(Path(path), "engine profile"), str(path))
