"""Text shared by every renderer of a run (console, Markdown): what the run exercised
(:func:`engaged_lines`), where to look next (:func:`next_steps`), the verdict line and the
reproduce command. The headline and the causes live below both the renderers and the comparison,
in :mod:`pleharness.causes`."""
from __future__ import annotations

import shlex

from ..checks.logprob_parity import NAME as LOGPROB_PARITY
from ..checks.prompt_logprobs import PARITY as PROMPT_PARITY
from ..divergence import is_half_precision
from ..engine.fact_sources import flag_name
from ..manifest import Manifest


def _spec(v: dict) -> str:
    a, L = v.get("acceptance_rate"), v.get("mean_accepted_length")
    return (f"acceptance {'-' if a is None else f'{a:.3f}'} ({v['accepted_tokens']:.0f}/"
            f"{v['draft_tokens']:.0f} draft tokens), mean accepted length "
            f"{'-' if L is None else f'{L:.3f}'} over {v['drafts']:.0f} drafts")


def engaged_lines(m: Manifest) -> list[str]:
    """What the run exercised, from the engine's counters (``summary.engaged``,
    :mod:`pleharness.evidence`): speculative-decoding acceptance overall and per concurrency,
    prefix-cache hit tokens, preemptions, chunked prefills, peak in flight; then every vacuous
    finding. [] for a manifest without that evidence."""
    e = m.summary.engaged
    if not e:
        return []
    out = []
    sd = e.get("spec_decode")
    if sd:
        out.append("speculative decoding (load phases): " + _spec(sd["overall"]))
        for c, v in sd["by_concurrency"].items():
            out.append(f"  {c}: " + _spec(v))
    pc = e.get("prefix_cache")
    if pc:
        out.append(f"prefix cache (load phases): {pc['hit_tokens']:.0f} of "
                   f"{pc['queried_tokens']:.0f} queried tokens hit")
    if not e.get("phases_with_counters"):
        out.append("no engine counters at /metrics: what the phases exercised is unknown")
    bits = [f"{k.replace('_', ' ')} {e[k]:.0f}" for k in ("preemptions", "chunked_prefills",
                                                          "in_flight_peak")
            if e.get(k) is not None]
    if bits:
        out.append("; ".join(bits))
    out += [f"VACUOUS: {v}" for v in m.summary.vacuous or []]
    return out


def next_steps(m: Manifest, run_dir: str | None = None) -> list[tuple[str, str | None]]:
    """Where to look next, as (text, shell command or None): the engine log, how to see the
    tokens, the reproduce command."""
    d = (run_dir or f"{_results_dir(m)}/{m.run_id}").rstrip("/")
    steps: list[tuple[str, str | None]] = []
    if m.engine.engine_log:
        steps.append((f"engine log: {d}/{m.engine.engine_log}"
                      + (f" (launcher: {d}/{m.engine.launcher_log})"
                         if m.engine.launcher_log else ""), None))
    elif m.engine.mode == "attached" and selftest_pass(m) is not None:
        steps.append((f"engine log: {d}/../engine.log (the selftest's engine; each pass "
                      "reached it through a fault proxy)", None))
    elif m.engine.mode == "attached":
        steps.append((f"engine log: the attached engine's own log ({m.engine.url})", None))
    if any(r.match is False or r.divergence for r in m.requests):
        records = m.requests_file or "requests.jsonl"
        steps.append((f"tokens: {d}/{records} keeps the output_ids of every mismatch (the "
                      "references' are in manifest.json):",
                      "jq -c 'select(.match == false) | {id, first_divergence, "
                      f"divergence, output_ids}}' {d}/{records}"))
    hint = unmeasured_bound_hint(m)
    if hint:
        steps.append((hint, None))
    # a selftest pass is reproduced by its selftest, which starts its own engine
    note = (f" (attached run: the engine at {m.engine.url} must be running)"
            if m.engine.mode == "attached" and selftest_pass(m) is None else "")
    steps.append((f"reproduce{note}:", reproduce_command(m)))
    return steps


GRAPHS_OFF = '--compilation-config={"cudagraph_mode": "NONE"}'
HINT_SHOWN = 3  # splits named in the hint; the rest are counted
LOGPROB_CHECKS = (LOGPROB_PARITY, PROMPT_PARITY)  # judged at the same tolerance
DTYPE_SOURCES = ("serving dtype", "the serving dtype's bound")  # a bound, not a measurement


def control_suggestion(m: Manifest) -> str:
    """The control to suggest for measuring a run's numerics: CUDA graphs off with the same
    compiled kernels (GPU run x: its answers equal a PIECEWISE control's to the bit), dropping
    the run's own ``--compilation-config`` when it has one (``--control-drop-arg`` of a flag the
    run does not have is a usage error)."""
    args = (m.engine.launch or {}).get("engine_args") or []
    has = any(flag_name(str(a)) == "--compilation-config" for a in args)
    return ("--control-drop-arg=--compilation-config " if has else "") + \
        f"'--control-engine-arg={GRAPHS_OFF}'"


def unmeasured_bound_hint(m: Manifest) -> str | None:
    """A failed half-precision run whose tolerance was the serving dtype's bound, not a
    measurement (no control run, no measured ``--numerics-from``, no ``--near-tie-nats``), and
    whose hard splits were decided by the engine's margin against it, or whose logprob parity
    checks failed at it: say that the bound is not this engine's measured numerics and how to
    measure them, else None. The verdict is unchanged. Never raises on a manifest's odd values
    (a missing threshold or envelope: no hint).

    Why: a bf16 mixture-of-experts engine moves margins by up to ~0.9 nats between two clean
    configurations (GPU runs w and x, docs/gpu-runs/README.md: a cold and a warm run of one prompt
    split at 0.75 nats against bfloat16's 0.5-nat bound, no fault able to fire there)."""
    ro = m.run_options
    if m.verdict != "fail" or not is_half_precision(ro.serving_dtype) or \
            m.engine.control_engine or not isinstance(ro.near_tie_nats, (int, float)):
        return None
    env = ro.numerics_envelope if isinstance(ro.numerics_envelope, dict) else {}
    measured = env.get("measured")
    if isinstance(measured, dict) and (measured.get("logprob_nats") is not None
                                       or measured.get("flip_margin_nats") is not None):
        return None  # measured, and no larger than the bound where the bound stands
    lp_source = str(env.get("logprob_tolerance_source") or ro.near_tie_source or "")
    tie_bound = str(ro.near_tie_source or "").startswith(DTYPE_SOURCES)
    splits = [(r.id, r.divergence.margin_nats) for r in m.requests
              if tie_bound and r.divergence is not None and r.divergence.cls == "hard"
              and (r.divergence.classified_by or "").startswith("engine margin")
              and r.divergence.margin_nats is not None]
    parity = sum(1 for r in m.requests for c in r.checks if c.status == "fail"
                 and c.name in LOGPROB_CHECKS) if lp_source.startswith(DTYPE_SOURCES) else 0
    if not splits and not parity:
        return None
    what = []
    if splits:
        what.append("the hard split(s) (" + ", ".join(
            f"{i} at {g:.4g} nats" for i, g in splits[:HINT_SHOWN]) + (
            f" and {len(splits) - HINT_SHOWN} more" if len(splits) > HINT_SHOWN else "")
            + " of margin)")
    if parity:
        what.append(f"{parity} failed logprob parity check(s)")
    return (f"numerics not measured: {' and '.join(what)} were judged against "
            f"{ro.serving_dtype}'s {ro.near_tie_nats:g}-nat bound, not this engine's measured "
            "numerics (no control run); a noisy half-precision engine (a mixture of experts, "
            "sharp logits) can split there on numerics alone. To decide, rerun with a control, "
            f"e.g. {control_suggestion(m)} (CUDA graphs off, the same compiled kernels) or "
            "--control-engine-python BASE")


def _results_dir(m: Manifest) -> str:
    """The --results-dir the run was started with (default results)."""
    inv = list(m.invocation)
    for i, a in enumerate(inv):
        if a == "--results-dir" and i + 1 < len(inv):
            return inv[i + 1]
        if a.startswith("--results-dir="):
            return a.split("=", 1)[1]
    return "results"


def verdict_line(m: Manifest) -> str:
    """'FAIL (status complete, exit 1)'."""
    return f"{(m.verdict or 'none').upper()} (status {m.status}, exit {m.exit_code})"


def selftest_pass(m: Manifest) -> str | None:
    """The fault class of a selftest pass's run (its invocation ends with the marker
    ``(selftest pass NAME)``, :mod:`pleharness.selftest`), else None."""
    last = m.invocation[-1] if m.invocation else ""
    if last.startswith("(selftest pass ") and last.endswith(")"):
        return last[len("(selftest pass "):-1]
    return None


def reproduce_command(m: Manifest) -> str:
    """The recorded invocation as a shell command that starts a new run: ``--run-id`` is dropped
    (the old folder exists, and a new run may not reuse it). For an attached run (``--url``) the
    engine at that URL must be running again; :func:`next_steps` says so. A selftest pass's run
    is reproduced by its selftest with that pass's ``--fault`` (the pass marker dropped)."""
    if not m.invocation:
        return "(not recorded)"
    inv = list(m.invocation)
    name = selftest_pass(m)
    if name is not None:  # a selftest pass: the selftest that plants its fault
        inv = inv[:-1] + ([] if name == "clean" or any(
            a == name and b == "--fault" for b, a in zip(inv, inv[1:])) else ["--fault", name])
    out: list[str] = []
    skip = False
    for a in inv:
        if skip:
            skip = False
        elif a == "--run-id":
            skip = True
        elif not a.startswith("--run-id="):
            out.append(a)
    return shlex.join(out)
