"""Check ``constrained``: the text of a request with a constrained output (vLLM's
``structured_outputs``; ``RequestSpec.structured``, issue 35 item 3) conforms to its constraint.

Rules, by the constraint's kind (vLLM 0.32 ``StructuredOutputsParams``; docs/constrained-output.md
says what the engine accepts and was measured to do):

- ``json`` (a JSON Schema): the text parses as one JSON value (``json.loads``: leading and
  trailing whitespace allowed, nothing else) and validates against the schema (the ``jsonschema``
  library, the schema's own draft, default 2020-12);
- ``regex``: the whole text matches the pattern (Python's ``re.fullmatch``; the engine's
  backend compiles the pattern to a grammar, so a scenario's patterns stay in the subset both
  read alike: no lookarounds, no backreferences, which the backends refuse anyway);
- ``choice``: the text is one of the listed strings, exactly.

Only a complete output is judged: finish_reason ``stop`` (the constraint's grammar ended and the
engine stopped at EOS). An output cut at ``max_tokens`` (finish_reason ``length``) is skipped
with a note (a JSON value may be cut mid-way), unless the check's param ``must_finish`` is on
(the scenario sets it where the solo request finished): then a cut output fails, naming its
length. Params: ``must_finish`` (bool, default off).

Kind: **absolute** (the engine's contract: a constrained output conforms, whatever the model).
Skipped for a request without a constraint or one that failed.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..manifest import CheckResult
from . import register

NAME = "constrained"
KINDS = ("json", "regex", "choice")


def constraint_problem(kind: str, spec: Any) -> str | None:
    """Why (``kind``, ``spec``) is no constraint this check can judge, or None: ``kind`` one of
    :data:`KINDS`; a ``json`` spec a JSON Schema object that ``jsonschema`` accepts (its
    ``check_schema``); a ``regex`` spec a pattern that compiles; a ``choice`` spec a non-empty
    list of distinct strings."""
    if kind not in KINDS:
        return f"constraint kind {kind!r}: expected one of {', '.join(KINDS)}"
    if kind == "json":
        if not isinstance(spec, dict):
            return f"a json constraint is a JSON Schema object, not {type(spec).__name__}"
        # lazy: jsonschema, only for json-constrained requests
        from jsonschema import exceptions, validators
        try:
            validators.validator_for(spec).check_schema(spec)
        except exceptions.SchemaError as exc:
            return f"not a valid JSON Schema: {exc.message}"
    elif kind == "regex":
        if not isinstance(spec, str):
            return f"a regex constraint is a string, not {type(spec).__name__}"
        try:
            re.compile(spec)
        except re.error as exc:
            return f"regex {spec!r} does not compile: {exc}"
        if re.fullmatch(spec, ""):
            return (f"regex {spec!r} matches the empty output: an engine that answered nothing "
                    "would pass it, so it judges nothing (require at least one character)")
    elif (not isinstance(spec, (list, tuple)) or not spec
          or not all(isinstance(s, str) for s in spec) or len(set(spec)) != len(spec)):
        return "a choice constraint is a non-empty list of distinct strings"
    elif "" in spec:
        return ("a choice constraint's strings are not empty (an empty answer would pass it, "
                "so it judges nothing)")
    return None


def describe(kind: str, spec: Any, width: int = 60) -> str:
    """A one-line label of a constraint (``regex (yes|no)``, ``choice red|green``, ``json
    {"type": ...}``), cut to ``width`` characters."""
    body = ("|".join(spec) if kind == "choice" else spec if kind == "regex"
            else json.dumps(spec, sort_keys=True, separators=(",", ":")))
    text = f"{kind} {body}"
    return text if len(text) <= width else text[:width - 3] + "..."


def conformance(kind: str, spec: Any, text: str) -> str | None:
    """Why output ``text`` does not conform to (``kind``, ``spec``), or None when it does (the
    rules of the module docstring). Raises ValueError for a constraint that
    :func:`constraint_problem` refuses."""
    why = constraint_problem(kind, spec)
    if why:
        raise ValueError(why)
    if kind == "choice":
        return None if text in spec else f"{text!r} is none of the {len(spec)} choices"
    if kind == "regex":
        return None if re.fullmatch(spec, text) else f"{text!r} does not match {spec!r} whole"
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"{text[:80]!r} does not parse as JSON ({exc})"
    from jsonschema import validators  # lazy: jsonschema, only for json-constrained requests
    errors = sorted(validators.validator_for(spec)(spec).iter_errors(value),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        at = "/".join(str(p) for p in e.absolute_path) or "the value"
        return (f"{text[:80]!r} parses but breaks the schema at {at}: {e.message}"
                + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""))
    return None


@register(NAME)
def check(ctx, spec, c, params) -> CheckResult:
    """The rules of the module docstring for completion ``c`` of ``spec`` (its
    ``structured``). Returns pass (the text, and what it conforms to), fail (why it does not, or
    a cut output under ``must_finish``) or skip (no constraint, a failed request, a cut output).
    Never raises."""
    if getattr(spec, "structured", None) is None:
        return CheckResult(name=NAME, status="skip", detail="no constrained output asked")
    if c.error is not None:
        return CheckResult(name=NAME, status="skip", detail=f"request failed: {c.error}")
    kind, con = spec.structured
    label = describe(kind, con)
    if c.finish_reason != "stop":
        cut = (f"{label}: finish_reason {c.finish_reason!r} after {len(c.token_ids)} tokens "
               f"(max_tokens {spec.max_tokens}): the output is not complete")
        if params.get("must_finish"):
            return CheckResult(name=NAME, status="fail",
                               detail=cut + ", while the same request alone finished")
        return CheckResult(name=NAME, status="skip", detail=cut + " (not judged)")
    try:
        why = conformance(kind, con, c.text or "")
    except ValueError as exc:
        return CheckResult(name=NAME, status="skip", detail=f"{label}: {exc}")
    if why:
        return CheckResult(name=NAME, status="fail", detail=f"{label}: {why}")
    return CheckResult(name=NAME, status="pass", detail=f"{label}: {c.text!r} conforms")
