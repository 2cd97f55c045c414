"""The order in which ``ple-harness explain`` spends its launches, and its estimate (issue 33).

Engine starts dominate explain's time (60-220 s each on an H200, a few seconds of replay), so
the launches go first where they narrow most:

1. **The run's own control first.** A run with a control engine whose failing divergences were
   all ``only_under_test`` already says which change removes them; the first-round suspect that
   changes the same flags (e.g. ``cudagraph_mode=PIECEWISE``) is launched first, to confirm it on
   the minimal case.
2. **Narrower before broader.** A suspect ``within`` another (FULL CUDA graphs within CUDA
   graphs) is tried before it; when it removes every case the broader one would replay, the
   broader launch is skipped as *implied* (switching off more of the same feature cannot be
   needed to name the narrowest change), and the saved launch goes to the next feature.
3. **No second round before the first is done** (:func:`pleharness.explain.follow_ups` runs
   only after every first-round suspect was tried or skipped).

:func:`estimate` prints what the plan costs before it starts, from the run's own measured
engine start time.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .engine.fact_sources import flag_name

if TYPE_CHECKING:
    from .manifest import Manifest

# explain's Suspect and Case (pleharness.explain) are read through their fields only: this module
# sits below explain and does not import it
Suspect = Any
Case = Any


def _flags(args: Sequence[str]) -> set[str]:
    return {flag_name(a) for a in args if a.startswith("-")}


def control_suspect(m: "Manifest", suspects: Sequence[Suspect]) -> Suspect | None:
    """The first-round suspect that changes (at least) the flags of the run's control engine, when
    every failing divergence of the run was ``only_under_test`` (the control removed them all);
    else None."""
    ctl = m.engine.control_engine or {}
    changed = _flags([*(ctl.get("dropped") or []), *(ctl.get("added") or [])])
    if not changed:
        return None
    failing = [r for r in m.requests if r.divergence and r.divergence.fails]
    if not failing or any(r.divergence.attribution != "only_under_test" for r in failing):
        return None
    for s in suspects:
        if not (s.setting or s.combines) and changed <= _flags([*s.drop, *s.add]):
            return s
    return None


def order_first_round(m: "Manifest", suspects: Sequence[Suspect]) -> list[Suspect]:
    """The first round in launch order (module docstring, rules 1 and 2): the run's control
    suspect first, then every suspect before the suspect it is ``within``; otherwise the given
    order is kept."""
    out = list(suspects)
    first = control_suspect(m, out)
    if first is not None:
        out.remove(first)
        out.insert(0, first)
    moved = True
    while moved:  # a narrower suspect before its broader one (stable otherwise)
        moved = False
        for i, s in enumerate(out):
            j = next((k for k, b in enumerate(out[:i]) if b.name == s.within), None)
            if j is not None:
                out.insert(j, out.pop(i))
                moved = True
                break
    return out


def implied_by(sus: Suspect, todo: Sequence[Case], suspects: Sequence[Suspect]
               ) -> Suspect | None:
    """A narrower suspect (``within`` ``sus``) that already removed every case in ``todo``, so
    that launching ``sus`` cannot change any diagnosis; None when there is none (or ``sus`` is a
    numeric variant or a 2x2 cell, which are never skipped this way)."""
    if sus.setting or sus.combines or not todo:
        return None
    for n in suspects:
        if n.within == sus.name and not (n.setting or n.combines) and all(
                c.results.get(n.name, {}).get("vanishes") for c in todo):
            return n
    return None


def estimate(m: "Manifest", launches: int, parallel: int, budget_s: float) -> dict[str, Any]:
    """What the first round costs: ``launches`` engine starts (the configuration under test
    included), ``parallel`` side by side, at the run's measured start time
    (``m.engine.ready_s``, seconds; None when the run did not record it). Returns
    ``{"launches", "parallel", "start_s", "waves", "about_s", "fits_budget", "text"}``;
    ``about_s`` = waves x start_s x 1.25 (the replays and stops: measured 10-25 % of a start on
    the H200 and the CPU), None without a start time."""
    start = m.engine.ready_s
    waves = math.ceil(launches / max(1, parallel))
    about = round(waves * float(start) * 1.25) if start else None
    side = f", {parallel} side by side" if parallel > 1 else ""
    if about is None:
        text = f"{launches} launch(es) in the first round{side} (no measured start time in the run)"
    else:
        text = (f"{launches} launch(es) in the first round{side}: about "
                f"{about / 60:.1f} min at the run's measured engine start of {float(start):.0f} s")
    fits = None if about is None else about <= budget_s
    if fits is False:
        text += f" (more than --budget-s {budget_s:g}: the last ones will be skipped)"
    return {"launches": launches, "parallel": parallel, "start_s": start, "waves": waves,
            "about_s": about, "fits_budget": fits, "text": text + "; follow-up launches only for "
            "what the first ones find"}
