"""Model-behaviour checks judge the engine, relative to a reference (issue 24, item 1).

Two kinds of request check (``kind`` attribute of every registered check, said in its docstring):

- **absolute** (the engine's contract: ``vocab_range``, ``usage``, ``logprob_sanity``,
  ``max_model_len_edge``; the phase check ``health_after_phase``): a violation is an engine fault
  whatever the model is, so it always fails.
- **relative** (model behaviour: ``expected_text``, ``counting``; ``degeneration`` has its own
  rules in its module): what the output says depends on the model (random weights, a base model,
  a reasoning model that opens with ``<think>``, one that answers "Sure, OK" to "Reply with
  OK."). A failure of such a check is the engine's only when the same check passes on the
  output the engine should have given:

  - a **load** request is judged by its reference (the same prompt, max_tokens and sampling:
    solo run, reference engine, golden model or a stored manifest): the reference passes the
    check -> ``fail``; the reference fails it too -> ``note`` (model behaviour, counted in
    ``summary.model_behaviour_notes``, never a failure);
  - a **reference** or **warm-up** run is judged by the golden model (transformers in float32 on
    the same weights, :mod:`pleharness.golden`) where there is one: the golden greedy
    continuation passes -> ``fail`` (the engine's own solo run is wrong: a fault that hits every
    run of a prompt), it fails too -> ``note``. Without a golden model (or for a seeded sample,
    which the greedy golden model cannot reproduce) -> ``note``, as ``degeneration`` does.

  A load request whose output is the very output of the engine's own first (cold) solo run of
  the prompt (``cold_output_hash``, which a numerical flip kept apart from the warm reference)
  is judged by that run: model behaviour, a ``note`` (GPU run u: a bf16 MoE engine's cold run
  and four load runs repeated one token 20 times after a 0.125-nat flip the warm run took the
  other way).
  A judge that cannot be evaluated (no reference for a load request, a reference whose text the
  engine cannot detokenize) leaves the failure standing, with the reason.

The judge's text is the engine's own decoding of the judge's token IDs (``POST /detokenize``, the
served tokenizer), cached per context. shared/DESIGN.md, "What real runs taught": "If the
reference (or the golden model) fails a model-behaviour check too (no "OK", no count), the load
request's failure is the model's, not the engine's."
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from ..engine.completion import Completion
from ..golden import GoldenError
from ..manifest import CheckResult
from ..parity import token_hash

ABSOLUTE = "absolute"
RELATIVE = "relative"
KINDS = (ABSOLUTE, RELATIVE)


def _text_of(ctx, ids: list[int]) -> str | None:
    """The engine's text for ``ids`` (cached on ``ctx``); None when it cannot be had."""
    cache = ctx.__dict__.setdefault("_judge_texts", {})
    key = tuple(ids)
    if key not in cache:
        client = getattr(ctx, "client", None)
        try:
            cache[key] = client.detokenize(list(ids)) if client is not None else None
        except Exception:  # noqa: BLE001 - an engine that cannot detokenize: no judge
            cache[key] = None
    return cache[key]


def _judge_output(ctx, spec) -> tuple[list[int] | None, str, str | None]:
    """(the judge's token IDs or None, who it is, why there is none) for ``spec`` in the
    current phase role (module docstring)."""
    role = getattr(ctx, "phase_role", "load")
    ref = (getattr(ctx, "references", None) or {}).get(spec.ref_key)
    if role == "load":
        if ref is None:
            return None, "reference", "no reference to judge it"
        who = {"solo": "single-request reference", "engine": "reference engine's output",
               "golden": "golden reference", "manifest": "stored reference"}.get(
            ref.source, f"{ref.source} reference")
        return list(ref.output_ids), who, None
    if ref is not None and ref.source == "golden":
        return list(ref.output_ids), "golden reference", None
    golden = getattr(ctx, "golden", None)
    if golden is None or getattr(ctx, "golden_error", None) is not None:
        return None, "golden model", "no golden reference to judge it"
    if float(getattr(spec, "temperature", 0.0) or 0.0) > 0:
        return None, "golden model", "a seeded sample: the greedy golden model has no judge for it"
    try:
        g = golden.generate(list(spec.prompt.ids), spec.max_tokens)
    except GoldenError as exc:  # recorded once, as the runner does: not asked again
        ctx.golden_error = str(exc)
        m = getattr(ctx, "manifest", None)
        if m is not None:
            m.run_options.golden_classifier_error = ctx.golden_error
        return None, "golden model", f"the golden model failed: {exc}"
    return list(g.ids), "golden model", None


def judge(ctx, fn: Callable, spec, c, params, result: CheckResult) -> CheckResult:
    """The verdict of relative check ``fn`` whose own ``result`` on completion ``c`` failed:
    ``fail`` (the judge passes it: the engine is wrong), ``note`` (the judge fails it too, or a
    reference/warm-up run has no golden judge: model behaviour) or ``fail`` with the reason the
    judge could not be evaluated (module docstring). Never raises."""
    role = getattr(ctx, "phase_role", "load")
    ref = (getattr(ctx, "references", None) or {}).get(spec.ref_key)
    if (role == "load" and ref is not None and ref.cold_output_hash is not None
            and ref.cold_output_hash != ref.output_hash
            and ref.cold_output_hash == token_hash(list(c.token_ids))):
        return CheckResult(name=result.name, status="note", detail=(
            f"{result.detail} (model behaviour: the engine's own first solo run of this prompt "
            "gave this very output; it differs from the kept warm reference at a numerical "
            "flip)"))
    ids, who, none_why = _judge_output(ctx, spec)
    if ids is None:
        if role == "load":
            return CheckResult(name=result.name, status="fail",
                               detail=f"{result.detail} ({none_why})")
        return CheckResult(name=result.name, status="note", detail=(
            f"{result.detail} (model behaviour in a {role} run; {none_why}, so not a failure)"))
    text = _text_of(ctx, ids)
    if text is None:
        return CheckResult(name=result.name, status="fail", detail=(
            f"{result.detail} (the {who} could not be judged: the engine did not detokenize "
            "its IDs)"))
    jr = fn(ctx, spec, Completion(token_ids=ids, text=text, finish_reason="length",
                                  prompt_tokens=len(spec.prompt), completion_tokens=len(ids)),
            params)
    if jr.status == "pass":
        return CheckResult(name=result.name, status="fail",
                           detail=f"{result.detail}; the {who} passes it")
    if jr.status == "fail":
        return CheckResult(name=result.name, status="note", detail=(
            f"{result.detail} (model behaviour: the {who} fails it too: {jr.detail})"))
    return CheckResult(name=result.name, status="fail",
                       detail=f"{result.detail} (the {who} could not be judged: {jr.detail})")


def relative(fn: Callable) -> Callable:
    """Wrap relative check ``fn`` (``fn(ctx, spec, c, params) -> CheckResult``) so that a
    failure is judged by :func:`judge`; passes, skips and notes come back unchanged."""
    @functools.wraps(fn)
    def check(ctx, spec, c, params) -> CheckResult:
        res = fn(ctx, spec, c, params)
        if res.status != "fail" or ctx is None:
            return res
        return judge(ctx, fn, spec, c, params, res)
    check.raw = fn
    return check
