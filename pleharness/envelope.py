"""The run's numerics envelope (issue 47): how far this engine's own numerics move a token's
logprob and flip a greedy token, measured on evidence the defect under test cannot widen, and the
tolerances derived from it.

Why: a fixed bound from the serving dtype (:data:`pleharness.divergence.NEAR_TIE_BY_DTYPE`,
bfloat16 0.5 nats) assumes a dense model's rounding. On a bf16 mixture-of-experts engine a
near-tied router sends a token to another expert under batching, and a clean engine then moved an
emitted token's logprob by 0.82 nats between its solo and its batched run, and flipped greedy
tokens at reference margins up to 2.1 nats in its control configuration too (H100, vLLM 0.26;
shared/DESIGN.md, "Tolerances come from the engine"). A fixed bound fails such a clean engine.

**What is measured** (:func:`measure`), only where the defect under test is not:

- ``logprob_nats``: the largest difference of the same token's logprob at matched positions
  (the same token on both sides, before the first divergent token; prompt tokens only where they
  carry probability on both sides, :func:`pleharness.checks.prompt_logprobs.carries_probability`)
  between a request alone and under load, within the **control run** (another configuration of
  the same engine: a defect of the configuration under test is not in it). Kept on each record
  as :class:`~pleharness.manifest.ScoreDiffs` by ``logprob_parity`` and
  ``prompt_logprobs_parity``.
- ``flip_margin_nats``: the largest reference top-1/top-2 margin of a divergence under test that
  the control run reproduced (``also_in_control``: the engine flips there in both
  configurations, so it is numerics).
- Without a control run, the envelope of a run named by ``--numerics-from RUN`` (a clean run of
  this engine and configuration, e.g. the BASE build's, or a selftest's clean pass), or, with
  ``--numerics-from self``, this run's own (only for a run that is itself the clean measurement:
  a defect would widen it). Otherwise nothing is measured: the dtype bound applies, and the
  manifest says so.

**The tolerances** (:func:`tolerances`), each the larger of the dtype bound and:

- logprob tolerance (``logprob_parity``, ``prompt_logprobs_parity``) = ``LOGPROB_FACTOR`` x
  ``logprob_nats``. Why a factor of 2: the run under test draws as many matched positions from
  the same numerics as the measurement did, so its largest difference exceeds the measured
  largest about half the time (two samples of one distribution), and the size of an
  expert-routing flip's effect is what the maximum samples; doubling it admits two such events at
  one position (two layers, or two experts) while staying far below what corruption gives (a
  logprob row of another request, or of another position, moves a confident token by many nats).
- near-tie threshold (every divergence: :func:`pleharness.divergence.settle`'s engine-margin
  step, and the differential evidence) = the larger of ``FLIP_FACTOR`` x ``logprob_nats`` and
  ``flip_margin_nats``. Why 2: the top-1/top-2 margin is the difference of two logprobs, each of
  which the numerics move by up to ``logprob_nats``, so the margin moves by up to twice that; a
  flip the control reproduced is direct evidence of a margin the numerics cross.

``--near-tie-nats`` (an explicit threshold) overrides both, as before. The envelope and each
tolerance's origin go to ``run_options.numerics_envelope`` and summary.md; docs/references.md
says what each piece of evidence may decide.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .checks.logprob_parity import NAME as LOGPROB_PARITY
from .checks.logprob_parity import judge as judge_logprobs
from .checks.prompt_logprobs import PARITY as PROMPT_PARITY
from .checks.prompt_logprobs import judge_parity
from .divergence import DEFAULT_NEAR_TIE_NATS, Rule
from .errors import UsageError
from .manifest import Manifest, RequestRecord, load_manifest
from .run.judge import refinish
from .run.settlement import record_settlement

LOGPROB_FACTOR = 2.0
FLIP_FACTOR = 2.0


def _diffs(records: Iterable[RequestRecord]) -> tuple[float | None, int, int]:
    """(largest |difference| in nats or None, positions compared, requests) over the
    emitted-token and prompt-token differences kept on ``records``."""
    top, n, reqs = None, 0, 0
    for r in records:
        got = False
        for d in (r.logprob_diffs, r.prompt_logprob_diffs):
            if d is not None and d.compared:
                n += d.compared
                top = d.max_nats if top is None else max(top, d.max_nats)
                got = True
        reqs += got
    return top, n, reqs


def _flips(main: Manifest) -> tuple[float | None, int]:
    """(largest reference margin in nats of a divergence the control reproduced, how many)."""
    ms = [r.divergence.margin_nats for r in main.requests if r.divergence is not None
          and r.divergence.attribution == "also_in_control"
          and r.divergence.margin_nats is not None]
    return (max(ms) if ms else None), len(ms)


def measure(main: Manifest, control: Manifest | None, numerics_from: str | None = None
            ) -> dict[str, Any]:
    """The measured envelope of run ``main`` (module docstring): ``logprob_nats`` (None when
    nothing was measured), ``logprob_positions`` and ``logprob_requests`` (the evidence),
    ``logprob_source``, ``flip_margin_nats`` and ``flips`` (control-reproduced divergences),
    ``flip_source``. ``control``: the control run's manifest (None: no control run);
    ``numerics_from``: ``--numerics-from`` (a run folder or manifest path, or ``self``).
    Raises UsageError when ``numerics_from`` names no run with a measured envelope."""
    out: dict[str, Any] = {}
    if control is not None and control.requests:
        top, n, reqs = _diffs(control.requests)
        out.update(logprob_nats=top, logprob_positions=n, logprob_requests=reqs,
                   logprob_source=(f"the control run: {n} matched positions of {reqs} "
                                   "requests, each against its solo run" if n else
                                   "the control run compared no logprobs (--logprobs 0, or "
                                   "no request matched its solo run)"))
    elif numerics_from == "self":
        top, n, reqs = _diffs(main.requests)
        out.update(logprob_nats=top, logprob_positions=n, logprob_requests=reqs,
                   logprob_source=(f"this run itself (--numerics-from self): {n} matched "
                                   f"positions of {reqs} requests; a defect under test would "
                                   "widen it, so this run is a measurement, not evidence"))
    elif numerics_from:
        src = envelope_of_run(numerics_from)
        out.update({k: src.get(k) for k in ("logprob_nats", "logprob_positions",
                                            "logprob_requests", "flip_margin_nats", "flips")})
        out["logprob_source"] = (f"--numerics-from {numerics_from} (measured there on "
                                 f"{src.get('logprob_source') or 'its own run'})")
        out["flip_source"] = f"--numerics-from {numerics_from}"
        return out
    else:
        out.update(logprob_nats=None, logprob_positions=0, logprob_requests=0,
                   logprob_source="not measured: no control run (a defect under test would "
                                  "widen what this run measures of itself); give a control "
                                  "(--control-*) or --numerics-from a clean run")
    flip, k = _flips(main) if control is not None else (None, 0)
    out.update(flip_margin_nats=flip, flips=k,
               flip_source=(f"{k} divergence(s) under test that the control run reproduced"
                            if control is not None else "no control run"))
    return out


def envelope_of_run(path: str) -> dict[str, Any]:
    """The measured envelope recorded by the run at ``path`` (its folder or manifest file).
    Raises UsageError when it is not a manifest or recorded none."""
    p = Path(path)
    mp = p / "manifest.json" if p.is_dir() else p
    try:
        m = load_manifest(mp, with_requests=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--numerics-from {path}: {exc}") from None
    env = (m.run_options.numerics_envelope or {}).get("measured") or {}
    if env.get("logprob_nats") is None and env.get("flip_margin_nats") is None:
        raise UsageError(f"--numerics-from {path}: that run measured no numerics envelope "
                         "(it had no control run and no --numerics-from self)")
    return env


def tolerances(measured: dict[str, Any], dtype_bound: float) -> dict[str, Any]:
    """The logprob tolerance and near-tie threshold (nats) from ``measured`` (:func:`measure`)
    and the dtype bound (module docstring), each with the term that decided it."""
    e = measured.get("logprob_nats")
    flip = measured.get("flip_margin_nats")
    lp = [(dtype_bound, "the serving dtype's bound")]
    if e is not None:
        lp.append((round(LOGPROB_FACTOR * e, 6),
                   f"{LOGPROB_FACTOR:g} x the measured logprob envelope {e:.4g} nats"))
    tie = list(lp) if e is None else [lp[0], (round(FLIP_FACTOR * e, 6),
                                              f"{FLIP_FACTOR:g} x the measured logprob "
                                              f"envelope {e:.4g} nats")]
    if flip is not None:
        tie.append((round(flip, 6), f"the largest margin of a flip the control reproduced "
                                    f"({flip:.4g} nats)"))
    lpt, lpwhy = max(lp, key=lambda x: x[0])
    tt, twhy = max(tie, key=lambda x: x[0])
    return {"dtype_bound_nats": dtype_bound, "logprob_tolerance_nats": lpt,
            "logprob_tolerance_source": lpwhy, "near_tie_nats": tt, "near_tie_source": twhy}


def apply(main: Manifest, control: Manifest | None, numerics_from: str | None = None
          ) -> dict[str, Any]:
    """Measure ``main``'s envelope (:func:`measure`), record it with its tolerances in
    ``run_options.numerics_envelope``, and judge again at them: every record's
    ``logprob_parity`` and ``prompt_logprobs_parity`` (from its kept differences) and every
    divergence (its near-tie threshold raised to the measured one, then
    :func:`pleharness.divergence.settle`); the phases touched are finished again. An explicit
    ``--near-tie-nats`` (``run_options.near_tie_source`` "--near-tie-nats") is kept as given.
    Returns the envelope record."""
    ro = main.run_options
    bound = float(ro.near_tie_nats if ro.near_tie_nats is not None else DEFAULT_NEAR_TIE_NATS)
    given = ro.near_tie_source == "--near-tie-nats"
    measured = measure(main, control, numerics_from)
    tol = tolerances(measured, bound) if not given else {
        "dtype_bound_nats": bound, "logprob_tolerance_nats": bound,
        "logprob_tolerance_source": "--near-tie-nats", "near_tie_nats": bound,
        "near_tie_source": "--near-tie-nats"}
    env = {"measured": measured, **tol}
    ro.numerics_envelope = env
    lpt, tie = tol["logprob_tolerance_nats"], tol["near_tie_nats"]
    changed: set[str] = set()
    rule = Rule.of_run(ro)
    for r in main.requests:
        rescored = lpt > bound and _rejudge_scores(r, lpt, tol["logprob_tolerance_source"])
        if rescored:
            changed.add(r.phase)
        d = r.divergence
        if d is not None and r.match is False and ((d.threshold_nats or 0) < tie or rescored):
            d.threshold_nats = max(tie, d.threshold_nats or 0)
            # a check that failed at the dtype bound and passes at the envelope no longer
            # makes the divergence fail
            d.checks_failed = [c.name for c in r.checks if c.status == "fail"
                               and c.name not in ("parity", "control_answer")]
            if record_settlement(r, rule, lambda d: (
                    f"; {d.cls} at the run's measured near-tie threshold {tie:g} nats "
                    f"({tol['near_tie_source']})"), only_if_changed=True):
                changed.add(r.phase)
    if tie > bound:
        ro.near_tie_nats, ro.near_tie_source = tie, f"measured: {tol['near_tie_source']}"
    refinish(main, changed)
    return env


def _rejudge_scores(r: RequestRecord, tolerance: float, why: str) -> bool:
    """Judge ``r``'s ``logprob_parity`` and ``prompt_logprobs_parity`` again at ``tolerance``
    from its kept differences; True when a check's status changed."""
    changed = False
    for name, diffs in ((LOGPROB_PARITY, r.logprob_diffs), (PROMPT_PARITY,
                                                             r.prompt_logprob_diffs)):
        if diffs is None or tolerance < diffs.bound_nats:
            continue
        for i, ch in enumerate(r.checks):
            if ch.name != name:
                continue
            new = (judge_logprobs(diffs, tolerance, why, r.output_ids) if name == LOGPROB_PARITY
                   else judge_parity(diffs, r.prompt_len - 1, tolerance, why))
            changed |= new.status != ch.status
            r.checks[i] = new
    return changed


def describe(env: dict[str, Any] | None) -> list[str]:
    """summary.md / console lines for a run's envelope record (none for a run without one)."""
    if not env:
        return []
    m = env.get("measured") or {}
    e = m.get("logprob_nats")
    f = m.get("flip_margin_nats")
    return [f"numerics envelope: logprob {'not measured' if e is None else f'{e:.4g} nats'} "
            f"({m.get('logprob_source')}); flips the control reproduced: "
            f"{'none' if f is None else f'up to {f:.4g} nats'} ({m.get('flip_source')})",
            f"tolerances: logprobs {env['logprob_tolerance_nats']:g} nats "
            f"({env['logprob_tolerance_source']}); near ties {env['near_tie_nats']:g} nats "
            f"({env['near_tie_source']})"]
