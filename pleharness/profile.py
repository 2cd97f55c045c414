"""Engine profiles: a production launch's flags in one TOML file (``--engine-profile FILE``).

Keys (all optional): ``model`` (local path), ``python`` (interpreter with vLLM), ``tp``
(tensor-parallel size), ``served_model_name``, ``host``, ``engine_args`` (list of strings, appended
to the server command), ``[env]`` (environment variables for the engine). Command-line flags
override the profile: ``--model``, ``--tp``, ``--engine-python``, ``--served-model-name``,
``--host`` replace; ``--engine-arg`` values are appended after the profile's (so they win in vLLM's
argument parser); ``--engine-env`` entries replace the profile's of the same name.
"""
from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import UsageError
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

    @field_validator("model", "python", "served_model_name", "host")
    @classmethod
    def _not_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty string: give a value or leave the key out")
        return v

    @field_validator("engine_args")
    @classmethod
    def _no_empty_arg(cls, v: list[str]) -> list[str]:
        if any(not a.strip() for a in v):
            raise ValueError("an empty argument")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        if any(not k.strip() for k in v):
            raise ValueError("an empty variable name")
        bad = [k for k in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"{bad[0]!r}: not an environment variable name (letters, digits "
                             "and _, not starting with a digit)")
        return v


def load_profile(path: str | Path) -> EngineProfile:
    """Read and validate a profile. Raises UsageError naming the file (and line or key)."""
    data = read_toml(Path(path), "engine profile")
    if not data:
        raise UsageError(f"{path}: an empty engine profile (no keys): a profile that sets nothing "
                         "would launch the defaults (the embedded tiny model); give at least one "
                         "key or leave --engine-profile out")
    return validate(EngineProfile, data, str(path))
