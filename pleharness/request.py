"""What scenarios hand to the run context and get back: a request to issue (:class:`RequestSpec`)
and what it gave (:class:`Outcome`). Kept apart from :mod:`pleharness.run` so that scenario
kinds import it at the top, without the run machinery."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .checks import DEFAULT_CHECKS
from .engine.completion import Completion
from .manifest import RequestRecord
from .prompts import Prompt


@dataclass
class RequestSpec:
    """One request to issue: a prompt, its sampling, and what to compare it with.

    ``compare``: compare the output hash with the prompt's single-request reference.
    ``checks``: reference-free checks to run on the output, as {check name: params}.
    ``temperature`` / ``seed``: sampling (greedy by default); a seeded sampled request must
    reproduce its seed's sample, so the sampling is part of the reference key.
    ``top_p`` / ``top_k``: nucleus and top-k truncation of a sampled request (None: not sent,
    the engine's default, which is off), part of the reference key of a sampled request.
    ``stream``: streamed (SSE) or one JSON response; not part of the reference key (both
    deliveries must give the same IDs).
    ``ignore_eos`` (default on: fixed lengths), ``stop`` (stop strings, OpenAI ``stop``),
    ``repetition_penalty`` (vLLM extension; 1.0 = none), ``frequency_penalty`` /
    ``presence_penalty`` (OpenAI; 0 = none), ``logit_bias`` ((token id, bias) pairs; OpenAI
    ``logit_bias``), ``stop_token_ids`` (vLLM: generation stops once one of these IDs is
    generated; the ID is returned as the last one), ``min_tokens`` (vLLM: no EOS or stop ID
    before this many output tokens): per-request parameters beyond the defaults (None / on = not
    sent), part of the reference key (:attr:`params`). ``messages``: ((role, content), ...):
    the request goes to ``/v1/chat/completions`` (issue 35 item 1), ``prompt`` holding the IDs
    the chat template makes of them (``/tokenize`` with the messages); not part of the reference
    key: the engine computes the same thing for both paths, so a chat request is compared with
    the ``/v1/completions`` reference of the same prompt IDs (recorded as ``api: chat``).
    ``keep_chunks``: keep the streamed deltas (``Completion.chunks``) for checks that judge them
    chunk by chunk (``stop_string``); off by default (the client's hot path stays lean).
    ``abandon_after_tokens``: the client disconnects after this many output tokens (0: before
    the first token); recorded as error ``abandoned``, which is not a request failure (see
    :meth:`pleharness.engine.client.EngineClient.acomplete`). Streamed requests only; never
    part of a reference (a reference run reads to the end).
    ``prompt_logprobs`` (vLLM extension, 0..20: the top-k scored with each prompt token;
    non-streamed requests only, vLLM refuses it streamed) and ``echo`` (OpenAI: the prompt's
    scores lead the logprobs; with ``logprobs``): the prompt's scores come back in
    ``Completion.prompt_logprobs`` (issue 35 item 4, :mod:`pleharness.engine.prompt_logprobs`);
    part of :attr:`params` (sent, and in the reference key: the reference carries the solo
    request's prompt scores).
    ``n`` / ``choice`` (issue 35 item 2): with ``n`` > 1 this spec is choice ``choice`` (0 ..
    n - 1) of ONE request for ``n`` choices (OpenAI ``n``); the request's ``n`` specs stand
    consecutively in one phase, identical but for ``choice`` and ``seed``, and
    :mod:`pleharness.run.choices` sends them once and gives each choice its own record. A
    seeded choice's ``seed`` is its derived seed (vLLM: the request's seed + the choice index,
    ``vllm/v1/engine/parallel_sampling.py``), so it is compared with the single request (n =
    1) of that seed; a greedy choice (temperature 0) with the greedy reference (it is sent as
    top-1 sampling: vLLM refuses n > 1 at temperature 0). Not part of the reference key; a
    reference is always one request of one choice.
    ``structured`` (issue 35 item 3): (kind, spec), the output's constraint, sent as vLLM's
    ``structured_outputs: {kind: spec}``: ``("json", schema dict)``, ``("regex", pattern)`` or
    ``("choice", (text, ...))`` (:mod:`pleharness.checks.constrained` judges the output); part
    of :attr:`params` (the reference is the solo request of the same prompt and constraint).
    ``min_p`` (vLLM extension, 0..1: tokens below ``min_p`` times the top token's probability
    are dropped before sampling; issue 52): part of :attr:`params` (sent, and in the reference
    key). ``skip_special_tokens`` (vLLM extension, default true: the text leaves special
    tokens out): off is part of :attr:`params`. ``adapter``: the LoRA adapter the request
    names (sent as ``model``, vLLM's ``--lora-modules`` NAME; None: the base model), part of
    :attr:`params`.
    """

    prompt: Prompt
    max_tokens: int
    compare: bool = True
    logprobs: int | None = None
    checks: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        name: {} for name in DEFAULT_CHECKS})
    note: str | None = None
    accept_4xx: bool = False  # a clean HTTP 4xx rejection is an acceptable answer (edge probes)
    temperature: float = 0.0
    seed: int | None = None
    stream: bool = True
    ignore_eos: bool = True
    stop: tuple[str, ...] | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    min_tokens: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    keep_chunks: bool = False
    top_p: float | None = None
    top_k: int | None = None
    abandon_after_tokens: int | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    n: int = 1
    choice: int = 0
    structured: tuple[str, Any] | None = None
    min_p: float | None = None
    skip_special_tokens: bool = True
    adapter: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        """The request-body fields this spec sets beyond the harness's defaults (ignore_eos on,
        no stop, no penalties, no logit bias), as sent: e.g. ``{"stop": ["ab"],
        "ignore_eos": False, "logit_bias": {"17": -100.0}}``; empty for a default request."""
        p: dict[str, Any] = {}
        if not self.ignore_eos:
            p["ignore_eos"] = False
        if self.stop:
            p["stop"] = list(self.stop)
        for name in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if v is not None:
                p[name] = float(v)
        if self.logit_bias:
            p["logit_bias"] = {str(int(t)): float(b) for t, b in self.logit_bias}
        if self.stop_token_ids:
            p["stop_token_ids"] = [int(t) for t in self.stop_token_ids]
        if self.min_tokens:
            p["min_tokens"] = int(self.min_tokens)
        if self.min_p is not None:
            p["min_p"] = float(self.min_p)
        if not self.skip_special_tokens:
            p["skip_special_tokens"] = False
        if self.adapter is not None:
            p["model"] = self.adapter
        if self.prompt_logprobs is not None:
            p["prompt_logprobs"] = int(self.prompt_logprobs)
        if self.echo:
            p["echo"] = True
        if self.structured is not None:
            kind, spec = self.structured
            p["structured_outputs"] = {kind: list(spec) if kind == "choice" else spec}
        return p

    @property
    def ref_key(self) -> tuple:
        """The reference this request is compared with: (prompt hash, max_tokens) for greedy
        requests, plus (temperature, seed) for sampled ones and (top_p, top_k) when either is
        set, plus the canonical JSON of :attr:`params` when the request sets any (a stop string
        or a penalty gives another output than the same prompt without it)."""
        key: tuple = (self.prompt.hash, self.max_tokens)
        if self.temperature != 0.0:
            key += (self.temperature, self.seed)
            if self.top_p is not None or self.top_k is not None:
                key += (self.top_p, self.top_k)
        p = self.params
        if p:
            key += (params_key(p),)
        return key


def params_key(params: dict[str, Any] | None) -> str | None:
    """Canonical JSON (sorted keys, no spaces) of a request's :attr:`RequestSpec.params`, the
    part of its reference key that they make; None for no params."""
    if not params:
        return None
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


@dataclass
class Outcome:
    """What one issued request gave: its spec, the engine's completion and the manifest record
    made of it (parity and checks judged)."""

    spec: RequestSpec
    completion: Completion
    record: RequestRecord
