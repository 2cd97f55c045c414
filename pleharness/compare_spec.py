"""``compare`` gates on speculative-decoding health (issue 27): ``--threshold
'acceptance>=0.95*base'``.

A broken draft model or proposer does not corrupt output under speculative decoding (rejected
drafts are recomputed by the target model); it only slows decoding. So a HEAD whose tokens are all
right can still be broken, and only the acceptance counters show it (TensorRT-LLM's suite gates on
acceptance length at >= 95 % of a reference taken on the stock path for the same reason).

Form: ``METRIC[@C<n>] OP VALUE[*base]`` with METRIC ``acceptance`` (accepted / draft tokens, 0..1)
or ``accepted_length`` (mean accepted length: 1 + accepted / drafts, tokens per verify step), OP
one of ``>= > <= <``, VALUE a number; ``*base`` makes it a factor of BASE's value at the same
place. Without ``@C<n>`` the gate applies to the whole run (the load phases) and, for a ``*base``
gate, to every concurrency level both runs have; with it, to that level only. Values come from
``summary.engaged.spec_decode`` (:func:`pleharness.evidence.spec_by_concurrency`), recomputed
from the phases when a manifest was summarized before it existed. A run without spec-decode
counters (speculative decoding off, no /metrics) fails the gate: nothing to compare.
"""
from __future__ import annotations

import operator
import re
from typing import Any

from .errors import UsageError
from .evidence import spec_by_concurrency

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
SPEC_THRESHOLD = re.compile(r"^\s*(acceptance|accepted_length)(?:@C(\d+))?\s*(>=|<=|>|<)\s*"
                            r"(\d+(?:\.\d*)?|\.\d+)\s*(\*\s*base)?\s*$")
KEY = {"acceptance": "acceptance_rate", "accepted_length": "mean_accepted_length"}


def parse_spec_threshold(text: str) -> tuple[str, str | None, str, float, bool] | None:
    """'acceptance@C4>=0.95*base' -> ('acceptance', 'C4', '>=', 0.95, True); None when ``text``
    is not a spec-decode threshold (e.g. a throughput one, 'C4>=62.985')."""
    m = SPEC_THRESHOLD.match(text)
    if not m:
        return None
    return (m.group(1), f"C{m.group(2)}" if m.group(2) else None, m.group(3), float(m.group(4)),
            bool(m.group(5)))


def looks_like_spec(text: str) -> bool:
    """Whether ``text`` is meant as a spec-decode threshold (starts with its metric name)."""
    return text.strip().startswith(tuple(KEY))


RANGE = {"acceptance": (0.0, 1.0), "accepted_length": (1.0, None)}  # what the metric can be


def check(text: str) -> None:
    """Raise UsageError for a malformed spec-decode threshold, or one no run can meet or fail
    (called before anything loads): ``@C0`` (a concurrency is at least 1), an absolute bound
    outside the metric's range (acceptance in [0, 1], accepted_length >= 1: e.g.
    ``acceptance>=1.5`` can never pass, ``accepted_length>=0.5`` never fail)."""
    p = parse_spec_threshold(text)
    if p is None:
        raise UsageError(f"--threshold {text!r}: expected e.g. 'acceptance>=0.95*base', "
                         "'accepted_length@C4>=2.0' (acceptance | accepted_length, optional "
                         "@C<concurrency>, one of >= > <= <, a number, optional *base)")
    metric, where, op, val, rel = p
    if where == "C0":
        raise UsageError(f"--threshold {text!r}: @C0: a concurrency is at least 1")
    if rel:
        if val <= 0:
            raise UsageError(f"--threshold {text!r}: a factor of BASE must be > 0")
        return
    lo, hi = RANGE[metric]
    rng = f"[{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
    never = {">=": (hi is not None and val > hi) or val <= lo,
             ">": (hi is not None and val >= hi) or val < lo,
             "<=": val < lo or (hi is not None and val >= hi),
             "<": val <= lo or (hi is not None and val > hi)}[op]
    if never:
        raise UsageError(f"--threshold {text!r}: {metric} is always {rng}, so this gate "
                         "cannot tell a good run from a bad one")


def check_places(base, head, text: str) -> None:
    """Raise UsageError when ``text`` names a concurrency (``@C<n>``) that neither run has
    spec-decode counters at (the levels present are listed)."""
    p = parse_spec_threshold(text)
    if p is None or p[1] is None:
        return
    levels = set()
    for m in (base, head):
        levels |= set((_health(m) or {}).get("by_concurrency") or {})
    if levels and p[1] not in levels:
        raise UsageError(f"--threshold {text!r}: neither run has {p[1]} (levels with "
                         f"counters: {', '.join(sorted(levels, key=lambda c: int(c[1:])))})")


def _health(m) -> dict[str, Any]:
    e = (m.summary.engaged or {}).get("spec_decode")
    return e or spec_by_concurrency(m)


def gate(res, base, head, text: str) -> None:
    """Apply the spec-decode threshold ``text`` to HEAD (against BASE for ``*base``), adding to
    ``res.gate_failures`` / ``res.gates_passed`` (:class:`pleharness.compare.Comparison`)."""
    metric, where, op, val, rel = parse_spec_threshold(text)
    key = KEY[metric]
    hh, bh = _health(head), _health(base)
    if not hh:
        res.gate_failures.append(f"--threshold {text}: HEAD has no speculative-decoding counters "
                                 "(speculative decoding off, or no /metrics)")
        return
    if rel and not bh:
        res.gate_failures.append(f"--threshold {text}: BASE has no speculative-decoding counters "
                                 "to compare with")
        return
    places = [where] if where else ["overall"] + (
        [c for c in hh["by_concurrency"] if c in bh["by_concurrency"]] if rel else [])

    def at(h, place):
        v = h["overall"] if place == "overall" else h["by_concurrency"].get(place)
        return None if v is None else v.get(key)

    checked = []
    for place in places:
        got = at(hh, place)
        label = "the run" if place == "overall" else place
        if got is None:
            res.gate_failures.append(f"--threshold {text}: HEAD has no {metric} at {label} "
                                     "(no drafts there)")
            continue
        want = val
        if rel:
            b = at(bh, place)
            if b is None:
                res.gate_failures.append(f"--threshold {text}: BASE has no {metric} at {label}")
                continue
            want = val * b
        if not OPS[op](got, want):
            res.gate_failures.append(
                f"--threshold {text}: HEAD {metric} {got:.4f} at {label} misses {op} {want:.4f}"
                + (f" ({val:g} x BASE {want / val if val else 0:.4f})" if rel else ""))
        else:
            checked.append(f"{label} {got:.4f}")
    if checked and len(checked) == len(places):
        res.gates_passed.append(f"--threshold {text}: HEAD {metric} " + ", ".join(checked))
