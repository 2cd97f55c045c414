"""Attribution: which engine configuration a divergence belongs to (control runs).

A control run is the same suite (same prompts, phases, order and concurrency, the same engine
facts) on a second engine with one feature switched off or changed, e.g. PIECEWISE instead of FULL
CUDA graphs, ``--enforce-eager``, or no ``--speculative-config`` (how vLLM's maintainers triage:
FULL vs PIECEWISE comparisons). Each divergence of the engine under test from its reference is
then classified by its twins: the control run's requests with the same (prompt, max_tokens,
phase concurrency):

- ``also_in_control``: some twin diverged from the control run's own reference too, or produced
  the very same (divergent) output: batch-dependent numerics the engine has in both
  configurations. A warning, counted separately (still a failure when a reference-free check
  failed on the output).
- ``only_under_test``: every twin matched its reference: the divergence belongs to the
  configuration under test. It keeps its class (a failure unless a near tie).
- ``no_twin``: the control run has no request with that key (it stopped early): unattributed.

On a half-precision engine (``run_options.serving_dtype`` bfloat16 / float16) a golden ``hard``
divergence that is ``also_in_control`` becomes a ``near_tie`` (``reclassified`` says why): the
control reproduces it, so it is the dtype's numerics, never corruption (issue 24 item 3).
The control run's requests also vote on which side of a divergence is wrong
(:func:`pleharness.run.sides.judge_sides`).

Batching is not perfectly repeatable: all the twins seen across the suite and its repeats
(``--repeat N``) count, on each side, rather than one request. One twin that diverged is enough
to call a divergence the engine's own numerics; "only under test" needs every twin to match.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from .divergence import Rule
from .engine.fact_sources import parse_engine_args
from .engine.fact_sources import flag_name
from .manifest import ControlEvidence, Manifest, RequestRecord
from .run.judge import refinish
from .run.settlement import record_settlement


def twin_key(r: RequestRecord) -> tuple[str, int, int]:
    """(prompt hash, max_tokens, phase concurrency): what makes two requests twins."""
    return (r.prompt_hash, r.max_tokens, r.concurrency)


def unused_drops(engine_args: Sequence[str], drop: Sequence[str]) -> list[str]:
    """The flags of ``drop`` that are not among ``engine_args`` (dropping them changes nothing)."""
    present = {flag_name(a) for a in engine_args if a.startswith("--")}
    return [d for d in drop if flag_name(d) not in present]


def effective_config(args: Sequence[str], env: dict[str, str]) -> tuple[dict, dict]:
    """What an engine launch amounts to: {flag: value} as vLLM's parser ends up with it (later
    occurrences win, ``_`` = ``-`` in names, bare flags True) and the environment. Two launches
    with equal results serve the same configuration."""
    parsed = parse_engine_args(list(args))
    return {flag_name(k): v for k, v in parsed.items()}, dict(env)


def same_config_problem(flag_hint: str, what: str, args: Sequence[str], env: dict[str, str],
                        target_args: Sequence[str], target_env: dict[str, str]) -> str | None:
    """A usage-error line when the ``what`` engine (control, reference) launched with ``args`` /
    ``env`` would serve exactly the engine under test's configuration; ``flag_hint`` names the
    option(s) that changed nothing. None when they differ."""
    if effective_config(args, env) != effective_config(target_args, target_env):
        return None
    return (f"{flag_hint}: the {what} engine would be identical to the engine under test (same "
            "model, python, tp, arguments and environment after the profile, --engine-arg and "
            f"drops are applied), so it could attribute nothing; change a flag that is among the "
            f"engine's arguments ({' '.join(target_args) or 'none'})")


def attribute(main: Manifest, control: Manifest) -> dict[str, int]:
    """Classify every divergence in ``main`` against its twins in ``control`` (see the module
    docstring); updates each record's ``divergence`` (``attribution``, ``control_evidence``,
    ``fails``) and parity check, then the phases' aggregates and statuses.

    Returns counts: {"also_in_control", "only_under_test", "no_twin"}.
    """

    twins: dict[tuple, list[RequestRecord]] = defaultdict(list)
    for t in control.requests:
        if t.error is None:
            twins[twin_key(t)].append(t)
    counts = {"also_in_control": 0, "only_under_test": 0, "no_twin": 0}
    rule = Rule.of_run(main.run_options)
    touched: set[str] = set()
    for r in main.requests:
        d = r.divergence
        if not d:
            continue
        ts = twins.get(twin_key(r), [])
        diverged = [t for t in ts if t.match is False]
        same = [t for t in ts if t.output_hash == r.output_hash]
        if not ts:
            cls = "no_twin"
        elif diverged or same:
            cls = "also_in_control"
        else:
            cls = "only_under_test"
        counts[cls] += 1
        d.attribution = cls
        d.control_evidence = ControlEvidence(
            twins=len(ts), twins_diverged=len(diverged), same_output=bool(same),
            twin_first_divergences=sorted({t.first_divergence for t in diverged
                                           if t.first_divergence is not None}))
        # the one rule decides again with the control's evidence (issue 24: on half precision a
        # control twin that reproduces the divergence is what the dtype gives)
        record_settlement(r, rule, {"also_in_control": "; also in the control run (the engine's own "
                                                "numerics)",
                             "only_under_test": "; only under test (every control twin matched)",
                             "no_twin": "; no control twin (unattributed)"}[cls])
        touched.add(r.phase)
    # the phases' aggregates again; the records file is rewritten once with the attributions
    refinish(main, touched)
    return counts
