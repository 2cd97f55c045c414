"""The rules a single option value is checked by, before anything is read or started: engine
arguments (:func:`engine_arg_problems`: one argv item each, none the harness sets itself), the
``--url`` (:func:`check_url`), ``--ladder`` (:func:`parse_ladder`), ``--engine-env``
(:func:`parse_env`), an engine profile found by path or shipped name (:func:`find_profile`,
:func:`check_control_profile`), and :func:`raise_all`, which raises them all as one
:class:`~pleharness.errors.UsageError`. Split from :mod:`pleharness.config` (issue 50): the
config groups are what a run is given; these are how the command line's values are checked."""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

from .errors import UsageError
from .profile import load_profile
from .redact import REDACTED, SECRET_NAME, redact_argv, redact_url
from .tomlfile import find_named


def raise_all(problems: list[str]) -> None:
    """Raise one UsageError listing every problem (none: return)."""
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} problems with the options:\n"
                         + "\n".join(f"  - {x}" for x in problems))


def parse_ladder(text: str) -> list[int]:
    """'4,3,2,1' (also 'C4>C3') -> [4, 3, 2, 1]; each level 1..1024, else a usage error naming
    the flag."""
    items = text.replace(">", ",").replace("C", "").split(",")
    if text.strip() and any(not x.strip() for x in items):
        raise UsageError(f"--ladder {text!r}: an empty level between commas; expected "
                         "comma-separated concurrency levels, e.g. 4,3,2,1")
    try:
        levels = [int(x) for x in items if x.strip()]
    except ValueError:
        raise UsageError(f"--ladder {text!r}: expected comma-separated concurrency levels, "
                         "e.g. 4,3,2,1") from None
    if not levels:
        raise UsageError(f"--ladder {text!r}: expected at least one concurrency level, e.g. 4,3,2,1")
    bad = [x for x in levels if not 1 <= x <= 1024]
    if bad:
        raise UsageError(f"--ladder {text!r}: concurrency levels must be between 1 and 1024 "
                         f"(got {', '.join(map(str, bad))})")
    return levels


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(items: Iterable[str], where: str = "--engine-env") -> dict[str, str]:
    """['NAME=VALUE', ...] -> {NAME: VALUE}; raises UsageError naming ``where``. An item without
    ``NAME=`` is not echoed (it may be a secret given without its name), nor is a value."""
    out = {}
    for n, it in enumerate(items, 1):
        if "=" not in it or not it.split("=", 1)[0]:
            raise UsageError(f"{where} (item {n}, its text not shown: it may be a secret value "
                             "given without its NAME=): expected NAME=VALUE")
        k, v = it.split("=", 1)
        if not ENV_NAME.fullmatch(k):
            raise UsageError(f"{where} {k!r}=...: not an environment variable name (letters, "
                             "digits and _, not starting with a digit)")
        out[k] = v
    return out


# engine flags the harness sets on every launch, each with the option that sets it instead: one
# given again would come last on the command line and win (the harness then waits on another
# port, asks for another model name, or holds another key)
HARNESS_SET_FLAGS = {"--model": "the harness's --model option (or the profile's model key)",
                     "--port": "the harness's --port option where the command has one (by "
                               "default it picks a free port)",
                     "--host": "the harness's --host option (or the profile's host key)",
                     "--served-model-name": "the harness's --served-model-name option (or the "
                                            "profile's key)",
                     "--api-key": "--api-key-env NAME (the engine gets the key as VLLM_API_KEY "
                                  "and the harness's requests carry it)"}


def harness_set_flag(arg: str) -> str | None:
    """The flag of :data:`HARNESS_SET_FLAGS` that the engine argument ``arg`` sets
    (``--port=8000``, ``--port``, ``--served_model_name=x``), else None."""
    name = arg.split("=", 1)[0].strip()
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name if name in HARNESS_SET_FLAGS else None


def engine_arg_problems(args: Iterable[str], where: str) -> list[str]:
    """Engine arguments are separate argv items: '--max-num-seqs 8' as one item never reaches
    vLLM as intended. A flag item whose name part (before '=') holds whitespace is refused, and
    so is a flag the harness sets itself (:data:`HARNESS_SET_FLAGS`). A secret-like flag's value
    (``--api-key``) is never echoed."""
    out = []
    for a in args:
        name = a.split("=", 1)[0]
        if a.startswith("-") and any(ch.isspace() for ch in name):
            flag, _, value = a.strip().partition(" ")
            value = REDACTED if SECRET_NAME.search(flag) else value.strip()
            shown = f"{flag} {value}"
            out.append(f"{where} {shown!r}: one argument holding a space; use the = form: "
                       f"{where} {flag}={value}")
        elif harness_set_flag(a):
            flag = harness_set_flag(a)
            shown = redact_argv([a])[0] if "=" in a else a
            out.append(f"{where} {shown}: the harness sets {flag} itself (a second one would "
                       f"win over it); use {HARNESS_SET_FLAGS[flag]}")
    return out


def check_url(url: str) -> str | None:
    """A usage-error line for a malformed --url (its password redacted), or None."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.hostname
    except ValueError as exc:
        return f"--url {shown!r}: not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (f"--url {shown!r}: expected an http:// or https:// URL with a host, e.g. "
                "http://127.0.0.1:8000")
    try:
        parts.port
    except ValueError:
        return f"--url {shown!r}: the port is not a number between 0 and 65535"
    if parts.query or parts.fragment:
        return (f"--url {shown!r}: the server's base URL has no query or fragment (the harness "
                "appends /health, /v1/...; a key goes in --api-key-env)")
    return None


def find_profile(name_or_path: Path | str) -> Path:
    """A profile path, or a shipped profile's name (``cpu-ngram`` -> profiles/cpu-ngram.toml), as
    --suite finds suites by name. Raises UsageError when neither exists."""
    here = Path(__file__).resolve().parent
    dirs = [d for d in (here / "profiles_data", here.parent / "profiles") if d.is_dir()]
    return find_named(str(name_or_path), dirs, "engine profile")


def program() -> list[str]:
    """How this harness was started, so that a recorded invocation runs as printed: the console
    script as it was called (e.g. .venv/bin/ple-harness), else ``PYTHON -m pleharness``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "ple-harness":
        return [argv0]
    return [sys.executable, "-m", "pleharness"]


def check_control_profile(name_or_path: Path | str, warn: Callable[[str], None]) -> Path:
    """Find and validate a --control-profile before anything starts (the control engine is
    launched only after the whole run under test); ``warn`` about the keys a control run
    ignores. Returns its path; raises UsageError naming the file and key."""
    try:
        path = find_profile(name_or_path)
    except UsageError as exc:
        raise UsageError(f"--control-profile: {exc}") from None
    prof = load_profile(path)
    raise_all(engine_arg_problems(prof.engine_args, f"{path}: engine_args item"))
    ignored = [k for k in ("model", "python", "tp", "served_model_name", "host")
               if getattr(prof, k) is not None]
    if ignored:
        warn(f"--control-profile {path}: {', '.join(ignored)} ignored: the control engine "
             "serves the engine under test's model with its python, tp and host; only the "
             "profile's engine_args and [env] apply")
    return path
