"""One redaction rule for everything the harness writes that holds a command line, an environment
or a URL: the console, ``manifest.json`` (``invocation``, ``engine.command``, ``engine.launch``,
``engine.url``), ``summary.md``'s reproduce command, ``junit.xml``, ``launcher.log`` and error
messages (issue 25: those files are meant to be shared, e.g. pasted into a CI job summary).

Redacted (the value becomes ``<redacted>``, the name stays so the record still says what was set):

- environment values (``--engine-env NAME=VALUE`` on a command line, a profile's ``[env]``, the
  launch environment in launcher.log and ``engine.launch.env``): every value, except those of
  variables that only configure the engine's runtime (names starting with ``VLLM_``, ``CUDA_``,
  ``NCCL_``, ``OMP_``, ``MKL_``, ``PYTHON``, ``TORCH``, ``HIP_``, ``NVIDIA_``) whose names are not
  secret-like (below): any other variable may hold a secret the harness cannot recognise
  (``DB_URL``, a webhook);
- the value of a ``NAME=VALUE`` argument or ``--flag`` whose name has a word that is or ends in
  KEY, TOKEN, SECRET or PASSWORD (case-insensitive: ``OPENAI_API_KEY``, ``HF_TOKEN``, ``APIKEY``,
  vLLM's ``--api-key``; not ``--max-tokens``, a count), in both the
  ``--flag=value`` and the two-token ``--flag value`` forms, also when it is passed through
  ``--engine-arg`` / ``--control-engine-arg`` / ``--reference-engine-arg`` (``--api-key-env``
  names a variable and is kept);
- the password of a URL with credentials (``https://user:pw@host`` -> ``https://user:<redacted>@host``),
  anywhere in a value that is shown, and the value of a secret-like query or fragment parameter
  (``?token=...``, ``&api_key=...``, ``&sig=...``; :func:`redact_url`).

:func:`redact_argv` and :func:`redact_env` return new objects; the real values are still used to
launch the engine and to connect.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"
# a name is secret-like when one of its words (split at - _ . and digits) is or ends in one of
# these: OPENAI_API_KEY, HF_TOKEN, DB_PASSWORD, APIKEY, --api-key; not --max-tokens (a count)
# nor TOKENIZERS_PARALLELISM
SECRET_WORD = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)


class _SecretName:
    """``SECRET_NAME.search(name)``: whether ``name`` is secret-like (see :data:`SECRET_WORD`)."""

    @staticmethod
    def search(name: str) -> bool:
        return any(SECRET_WORD.search(w) for w in re.split(r"[-_.\d\s]+", name) if w)


SECRET_NAME = _SecretName()
URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^@\s/]*)@")
# harness options whose values are NAME=VALUE environment entries, and those whose value is an
# engine argument (itself a --flag=value or a flag whose value follows in the next option)
ENV_OPTIONS = ("--engine-env",)
CONFIG_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "OMP_", "MKL_", "PYTHON", "TORCH", "HIP_", "NVIDIA_")


def env_value_shown(name: str) -> bool:
    """Whether an environment variable's value may be written (see the module's rule)."""
    return name.upper().startswith(CONFIG_PREFIXES) and not SECRET_NAME.search(name)
ARG_OPTIONS = ("--engine-arg", "--control-engine-arg", "--reference-engine-arg")


# a query or fragment parameter (``?token=...``, ``&sig=...``, ``#access_token=...``)
URL_PARAM = re.compile(r"(?P<head>[?&#;](?P<name>[^=&#;?\s/]+)=)(?P<val>[^&#;\s]*)")
SECRET_PARAMS = {"sig", "signature", "auth", "authorization", "credential", "code",
                 "x-amz-signature", "x-amz-credential", "x-amz-security-token",
                 "x-goog-signature", "x-goog-credential"}


def _param_secret(name: str) -> bool:
    return name.lower() in SECRET_PARAMS or SECRET_NAME.search(name)


def redact_url(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced, and the value
    of every query or fragment parameter whose name is secret-like (:data:`SECRET_WORD`:
    ``token``, ``api_key``, ``access_token``, ...) or a known signature or credential
    parameter (:data:`SECRET_PARAMS`: ``sig``, ``X-Amz-Signature``, ...)."""
    text = URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", text)
    if "=" not in text:
        return text
    return URL_PARAM.sub(lambda m: m.group("head") + REDACTED if _param_secret(m.group("name"))
                         else m.group(0), text)


NOT_SECRET_FLAGS = {"--api-key-env"}  # its value names a variable; the key itself is never written


def _secret_flag(flag: str) -> bool:
    return (flag.startswith("-") and flag not in NOT_SECRET_FLAGS
            and bool(SECRET_NAME.search(flag)))


def _redact_assignment(item: str, env: bool = False) -> str:
    """``NAME=VALUE`` (an environment entry when ``env``, else ``--flag=value``): the value
    redacted by the module's rule, else only URL passwords in it."""
    if "=" not in item:
        return redact_url(item)
    name, value = item.split("=", 1)
    if (env and not env_value_shown(name)) or (SECRET_NAME.search(name)
                                                and name not in NOT_SECRET_FLAGS):
        return f"{name}={REDACTED}"
    return f"{name}={redact_url(value)}"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line (the harness's or the engine's) with the values of the module's rule
    redacted; everything else unchanged, in place (so ``shlex.join`` of it still reads as the
    command that was run). An engine argument that is a secret-like flag without a value
    (``--engine-arg=--api-key``) makes the next engine argument its value."""
    args = list(argv)
    out: list[str] = []
    secret_next = False

    def engine_value(v: str) -> str:
        nonlocal secret_next
        if secret_next:
            secret_next = False
            return REDACTED
        if v.startswith("--") and "=" in v:
            return _redact_assignment(v)
        if _secret_flag(v):
            secret_next = True
            return v
        return redact_url(v)

    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, value = a.partition("=")
        if a in ENV_OPTIONS and i + 1 < len(args):
            out += [a, _redact_assignment(args[i + 1], env=True)]
            i += 2
            continue
        if eq and flag in ENV_OPTIONS:
            out.append(f"{flag}={_redact_assignment(value, env=True)}")
        elif a in ARG_OPTIONS and i + 1 < len(args):
            out += [a, engine_value(args[i + 1])]
            i += 2
            continue
        elif eq and flag in ARG_OPTIONS:
            out.append(f"{flag}={engine_value(value)}")
        elif eq and a.startswith("-"):
            out.append(_redact_assignment(a))
        elif _secret_flag(a) and i + 1 < len(args) and not args[i + 1].startswith("-"):
            out += [a, REDACTED]
            i += 2
            continue
        else:
            out.append(redact_url(a))
        i += 1
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of ``env`` with every value redacted but those :func:`env_value_shown` allows (their
    URL passwords redacted too)."""
    return {k: (redact_url(str(v)) if env_value_shown(k) else REDACTED) for k, v in env.items()}
