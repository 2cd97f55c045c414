"""Planted fault classes of the request-feature families (issue 35 item 8): one per family that a
scenario kind covers beyond plain greedy completions, so that ``ple-harness selftest`` says what
the suite can see on those paths too (a green run there is otherwise unproven).

Each class is a :class:`~pleharness.faults.builtin.SelftestFault` with a ``family`` (the table's
name for it) and ``scenarios``: the scenarios whose requests it acts on. Its selftest pass runs
those scenarios (the suite's entry of that name, else the entry of
``scenarios/suites/selftest-families.toml``), not the whole suite; the clean pass runs them too.
Requests are picked by what is in flight beside them or by what happened before, never at
random; ``proxy`` (set by :class:`~pleharness.faults.proxy.FaultProxy`) shows the neighbours.
The tests' engine doubles of these families are these classes.
"""
from __future__ import annotations

from .builtin import SelftestFault
from .rules import RequestCtx, set_top, top_first, top_of

PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias")
STOP_IDS = ("stop_token_ids", "min_tokens")
LP_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
TRUNCATION = ("top_k", "top_p", "min_p")


def shifted(t: int) -> int:
    """Another valid token ID next to ``t`` (``t - 1``, or ``t + 1`` for the first 17 IDs, which
    hold the special tokens of small vocabularies)."""
    return t - 1 if t > 16 else t + 1


def is_default(body: dict) -> bool:
    """Whether a request body sets none of the per-request parameters ``mixed_params`` varies
    (penalties, logit_bias, stop_token_ids, min_tokens, stop strings, sampling: temperature > 0,
    top_k / top_p / min_p, skip_special_tokens; the ``eos`` variant is the request without
    ``ignore_eos``)."""
    return not (any(k in body for k in (*PENALTIES, *STOP_IDS, *TRUNCATION,
                                         "skip_special_tokens"))
                or body.get("stop") or not body.get("ignore_eos")
                or float(body.get("temperature") or 0) > 0)


class FamilyFault(SelftestFault):
    """Base of the family classes: ``family`` (the feature), ``scenarios`` (what its pass runs),
    ``proxy`` (the FaultProxy it sits in, for faults that look at the requests in flight)."""

    family: str = ""
    scenarios: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()  # the mixed_params variants whose requests it acts on

    def __init__(self) -> None:
        super().__init__()
        self.proxy = None

    def vacuous(self, m) -> str | None:
        """Why this class could not fire on this engine, from its pass's manifest ``m`` (a
        :class:`~pleharness.manifest.Manifest` or None), or None: every ``mixed_params`` variant
        of :attr:`variants` was left out with a reason (``tables.mixed_params``: the engine
        cannot serve the shape: no LoRA adapter, speculative decoding ...). A class without
        ``variants``, or one whose variants were sent, is never vacuous: never firing is a
        miss. Never raises."""
        if not self.variants or m is None:
            return None
        rows = {r.get("variant"): r for r in (m.tables.get("mixed_params") or [])
                if isinstance(r, dict)}
        why = [f"{v}: {rows[v]['left_out']}" for v in self.variants
               if v in rows and rows[v].get("left_out")]
        return "; ".join(why) if len(why) == len(self.variants) else None

    def beside(self, ctx: RequestCtx, pred) -> bool:
        """Whether another request in flight on ``proxy`` satisfies ``pred(ctx)``."""
        if self.proxy is None:
            return False
        with self.proxy.lock:
            return any(o is not ctx and pred(o) for o in self.proxy.active)


class IdsAfterStop(FamilyFault):
    """The first streamed request with a stop string that ``select(ctx)`` picks (default:
    :meth:`under_load`) gets ``extra`` more token IDs (copies of the last ID,
    with logprob entries) on the delta that finishes with "stop", and usage counting them; the
    text stays cut at the stop: the public bug pattern of a stop inside a multi-token speculative
    step, text cut but IDs kept."""

    name = "ids_after_stop"
    family = "stop strings"
    scenarios = ("stop_strings",)
    summary = "a streamed stop-string request under load keeps 2 IDs after the stop"
    expect = "stop_string"

    def __init__(self, select=None, extra: int = 2):
        super().__init__()
        self.select = select or self.under_load
        self.extra = extra
        self.picked: list[int] = []
        self.runs: dict[tuple, int] = {}

    def under_load(self, ctx) -> bool:
        """Default pick: arrived with another request in flight, or is its (prompt, stop)'s third
        streamed run (the load phase's, after the two solo runs of warm references): on a fast
        engine a streamed stop request can end before the next one arrives."""
        key = (repr(ctx.body.get("prompt") or ctx.body.get("messages")), repr(ctx.body["stop"]))
        self.runs[key] = self.runs.get(key, 0) + 1
        return ctx.in_flight >= 2 or self.runs[key] >= 3

    def chunk(self, ctx, chunk):
        if not ctx.body.get("stop") or not ctx.streamed:
            return chunk
        if "selected" not in ctx.state:
            with self._lock:
                ctx.state["selected"] = not self.picked and bool(self.select(ctx))
                if ctx.state["selected"]:
                    self.picked.append(ctx.number)
        if not ctx.state["selected"]:
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids")
            lp = ch.get("logprobs") or {}
            if ids:  # the last ID and logprob entries seen: the finishing delta may carry none
                ctx.state["last"] = (ids[-1], {k: lp[k][-1] for k in LP_KEYS
                                               if isinstance(lp.get(k), list) and lp[k]})
            if ch.get("finish_reason") == "stop" and "last" in ctx.state:
                last_id, last_lp = ctx.state["last"]
                ch["token_ids"] = list(ids or []) + [last_id] * self.extra
                if last_lp:
                    lp = ch["logprobs"] = ch.get("logprobs") or {}
                    for k, v in last_lp.items():
                        lp[k] = list(lp.get(k) or []) + [v] * self.extra
                ctx.state["appended"] = True
                self.hit(ctx)
        if ctx.state.get("appended") and chunk.get("usage"):
            u = chunk["usage"]
            u["completion_tokens"] += self.extra
            u["total_tokens"] = (u.get("prompt_tokens") or 0) + u["completion_tokens"]
        return chunk


class PenaltyOnNeighbour(FamilyFault):
    """A request with default parameters that arrives while a request with a penalty
    (repetition / frequency / presence) or a logit bias is in flight gets its tokens from
    position ``start`` changed (:func:`shifted`, text to match): what a neighbour's penalty
    applied to its batch row does; the same request with no penalised neighbour is untouched."""

    name = "penalty_on_neighbour"
    family = "mixed parameters"
    scenarios = ("mixed_params",)
    summary = "a default request beside a penalised one gets the penalty (tokens from 2 on)"
    expect = "parity (vs the solo reference with its own parameters)"

    def __init__(self, start: int = 2):
        super().__init__()
        self.start = start

    def request(self, ctx, body):
        if is_default(body) and self.beside(ctx, lambda o: any(k in o.body for k in PENALTIES)):
            ctx.state["selected"] = True
            self.hit(ctx)
        return body

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            changed = False
            for i in range(len(ids)):
                if ctx.tokens_so_far + i >= self.start:
                    ids[i] = shifted(ids[i])
                    changed = True
            if changed:
                ch["text"] = "".join(f" t{t}" for t in ids)
        return chunk


class StopOnNeighbour(FamilyFault):
    """A streamed request without per-request parameters that shares the engine with a request
    with ``stop_token_ids`` (in flight when it arrives, or at any of its chunks before position
    ``start``: a stop request may come and go within a few steps) ends at position ``start``
    with finish_reason "stop" and usage to match: a neighbour's stop applied to its batch row."""

    name = "stop_id_on_neighbour"
    family = "token-level stops"
    scenarios = ("mixed_params",)
    summary = "a default request beside one with stop_token_ids stops early (at 3, \"stop\")"
    expect = "parity (vs the solo reference)"

    def __init__(self, start: int = 3):
        super().__init__()
        self.start = start

    def _pick(self, ctx) -> None:
        if (not ctx.state.get("selected") and is_default(ctx.body) and ctx.streamed
                and ctx.tokens_so_far <= self.start
                and self.beside(ctx, lambda o: bool(o.body.get("stop_token_ids")))):
            ctx.state["selected"] = True
            self.hit(ctx)

    def request(self, ctx, body):
        self._pick(ctx)
        return body

    def chunk(self, ctx, chunk):
        self._pick(ctx)
        if not ctx.state.get("selected"):
            return chunk
        if ctx.state.get("cut"):  # after the cut: only the finish and the usage go through
            done = [ch for ch in chunk.get("choices") or [] if ch.get("finish_reason")]
            if not done and not chunk.get("usage"):
                return None
            for ch in done:
                ch.update(token_ids=[], text="", logprobs=None, finish_reason="stop")
            chunk["choices"] = done
            if chunk.get("usage"):
                u = chunk["usage"]
                u["completion_tokens"] = self.start
                u["total_tokens"] = (u.get("prompt_tokens") or 0) + self.start
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            keep = self.start - ctx.tokens_so_far
            if 0 <= keep < len(ids):
                ch["token_ids"] = ids[:keep]
                lp = ch.get("logprobs") or {}
                for k in LP_KEYS:
                    if isinstance(lp.get(k), list):
                        lp[k] = lp[k][:keep]
                ch["finish_reason"] = ch.get("finish_reason") and "stop"
                ctx.state["cut"] = True
        return chunk


class ChatFlipUnderLoad(FamilyFault):
    """Chat answers only: output position ``at`` becomes another ID (:func:`shifted`) while
    ``min_in_flight`` (default 2) or more requests are in flight; completions are untouched (a
    defect of the chat path). ``min_in_flight=1``: every chat answer (a test whose point is the
    chat path, not the load: how many requests overlap depends on the machine's speed)."""

    name = "chat_flip_under_load"
    family = "chat completions"
    scenarios = ("chat_api",)
    summary = "chat answers under load get position 5 changed (completions untouched)"
    expect = "parity (chat answer vs the completions reference of its template IDs)"
    chat = True

    def __init__(self, at: int = 5, min_in_flight: int = 2):
        super().__init__()
        self.at, self.min_in_flight = at, min_in_flight

    def chunk(self, ctx, chunk):
        if "messages" not in ctx.body or ctx.in_flight < self.min_in_flight:
            return chunk
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                if ctx.tokens_so_far + i == self.at:
                    ids[i] = shifted(ids[i])
                    self.hit(ctx)
        return chunk


def corrupt_if_selected(ctx: RequestCtx, chunk: dict) -> dict:
    """Every token of ``chunk`` shifted (:func:`shifted`, text to match) when the fault selected
    ``ctx`` (``ctx.state["selected"]``); the chunk unchanged otherwise."""
    if ctx.state.get("selected"):
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                ids[i] = shifted(ids[i])
            if ids:
                ch["text"] = "".join(f" t{t}" for t in ids)
    return chunk


class CorruptAfterDisconnect(FamilyFault):
    """Every token changed in each completion that arrives after a client closed its stream
    early and whose prompt starts with the same ``block`` tokens as the abandoned prompt: an
    engine whose KV blocks, freed by an aborted request, corrupt the requests that reuse them.
    Keyed to the shared leading tokens, not to arrival order (on a slow machine a neighbour of
    the disconnect phase can reach the proxy after the client has gone, and it shares no block).
    ``gone``: the numbers of the requests whose client went away; ``hit_prompts``: the first
    ``block`` IDs of the changed ones' prompts."""

    name = "corrupt_after_disconnect"
    family = "client disconnects"
    scenarios = ("disconnects",)
    summary = "requests sharing the first 16 tokens of an abandoned prompt come back corrupted"
    expect = "parity (the follow-ups vs their references)"

    def __init__(self, block: int = 16):
        super().__init__()
        self.block = block
        self.gone: list[int] = []
        self.heads: set[tuple[int, ...]] = set()
        self.hit_prompts: list[tuple[int, ...]] = []

    def _head(self, body: dict) -> tuple[int, ...]:
        return tuple(body.get("prompt") or ())[:self.block]

    def disconnected(self, ctx):
        with self._lock:
            self.gone.append(ctx.number)
            self.heads.add(self._head(ctx.body))

    def request(self, ctx, body):
        head = self._head(body)
        with self._lock:
            selected = head in self.heads
            if selected:
                self.hit_prompts.append(head)
        if selected:
            ctx.state["selected"] = True
            self.hit(ctx)
        return body

    def chunk(self, ctx, chunk):
        return corrupt_if_selected(ctx, chunk)


class ServeFromOriginal(FamilyFault):
    """Answer a completion whose prompt differs in exactly one token from a prompt answered
    before (same length and max_tokens) with that prompt's answer (token IDs and logprobs,
    position by position), as an engine whose block hashes collide serves a near duplicate from
    the original's cached KV. Forgets every answer when the engine's prefix cache is reset
    (``POST /reset_prefix_cache`` through the proxy). ``refuse_reset``: the proxy answers that
    endpoint 404 (an engine without VLLM_SERVER_DEV_MODE=1). ``served``: (request number,
    number of the request whose answer it got)."""

    name = "serve_from_original"
    family = "prefix-cache isolation"
    scenarios = ("prefix_isolation",)
    summary = "a near duplicate (one token changed) is answered with the original's tokens"
    expect = "parity (vs its reference on a fresh cache)"

    def __init__(self, refuse_reset: bool = False):
        super().__init__()
        self.refused = ("/reset_prefix_cache",) if refuse_reset else ()
        self.answers: dict[tuple, tuple[int, list]] = {}  # (prompt, max_tokens) -> (no, tokens)
        self.served: list[tuple[int, int]] = []
        self.resets = 0

    def prefix_cache_reset(self):
        with self._lock:
            self.answers.clear()
            self.resets += 1

    def request(self, ctx, body):
        p, mt = tuple(body.get("prompt") or ()), body.get("max_tokens")
        with self._lock:
            for (q, qmt), (no, toks) in self.answers.items():
                if qmt == mt and len(q) == len(p) and sum(a != b for a, b in zip(p, q)) == 1:
                    ctx.state["serve"] = toks
                    self.served.append((ctx.number, no))
                    break
        if "serve" in ctx.state:
            self.hit(ctx)
        ctx.state["seen"] = []
        return body

    def chunk(self, ctx, chunk):
        serve = ctx.state.get("serve")
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            lp = ch.get("logprobs") or {}
            for i in range(len(ids)):
                if serve is not None and pos + i < len(serve):
                    tok, top, tlp = serve[pos + i]
                    ids[i] = tok
                    if lp.get("top_logprobs") and top is not None:
                        lp["top_logprobs"][i] = dict(top)
                    if lp.get("token_logprobs") and tlp is not None:
                        lp["token_logprobs"][i] = tlp
                    if lp.get("tokens"):
                        lp["tokens"][i] = f"token_id:{tok}"
                elif serve is None:
                    top = (lp.get("top_logprobs") or [None] * len(ids))[i]
                    tlp = (lp.get("token_logprobs") or [None] * len(ids))[i]
                    ctx.state["seen"].append((ids[i], dict(top) if top else None, tlp))
            if serve is None and ch.get("finish_reason") is not None:
                key = (tuple(ctx.body.get("prompt") or ()), ctx.body.get("max_tokens"))
                with self._lock:
                    self.answers[key] = (ctx.number, list(ctx.state["seen"]))
        return chunk


def unseeded_sample(ctx: RequestCtx) -> bool:
    """Whether ``ctx`` is a sampled request (temperature > 0) without a seed."""
    b = ctx.body
    return float(b.get("temperature") or 0) > 0 and b.get("seed") is None


class FirstTokenUnderLoad(FamilyFault):
    """Every unseeded sampled request that arrives with another in flight answers ``token``
    first, its logprobs consistent with it: each sample is plausible on its own, only the
    distribution of first tokens under load against the solo samples shows it."""

    name = "sampled_first_token_under_load"
    family = "sampled requests"
    scenarios = ("sampled",)
    summary = "unseeded samples under load all start with token 17 (logprobs consistent)"
    expect = "sampled_distribution"

    def __init__(self, token: int = 17):
        super().__init__()
        self.token = token

    def chunk(self, ctx, chunk):
        if ctx.tokens_so_far == 0 and unseeded_sample(ctx) and ctx.in_flight >= 2:
            for ch in chunk.get("choices") or []:
                ids = ch.get("token_ids") or []
                if ids:
                    top = top_of(ch, 0)
                    if top:
                        set_top(ch, 0, top_first(top, self.token), self.token)
                    ids[0] = self.token
                    ch["text"] = "#" + (ch.get("text") or "")[1:]
                    self.hit(ctx)
                    break
        return chunk


class ChoiceTokenChanged(FamilyFault):
    """A request for ``n`` > 1 choices that arrives while another request is in flight gets
    choice ``index``'s IDs from output position ``start`` on changed (:func:`shifted`, text to
    match): one choice of several broken under load, the others right."""

    name = "choice_token_changed"
    family = "several choices"
    scenarios = ("choices",)
    summary = "choice 1 of a request for n > 1 choices under load changed from position 2 on"
    expect = "parity (the choice vs its reference)"

    def __init__(self, index: int = 1, start: int = 2):
        super().__init__()
        self.index, self.start = index, start

    def request(self, ctx, body):
        if int(body.get("n") or 1) > self.index and ctx.in_flight >= 2:
            ctx.state["selected"] = True
            self.hit(ctx)
        return body

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected"):
            return chunk
        seen = ctx.state.setdefault("seen", 0)
        for ch in chunk.get("choices") or []:
            if ch.get("index") != self.index:
                continue
            ids = ch.get("token_ids") or []
            for k in range(len(ids)):
                if seen + k >= self.start:
                    ids[k] = shifted(ids[k])
            if ids:
                ch["text"] = "".join(f" t{t}" for t in ids)
            ctx.state["seen"] = seen + len(ids)
        return chunk


FAMILIES: dict[str, type[FamilyFault]] = {c.name: c for c in (
    IdsAfterStop, PenaltyOnNeighbour, StopOnNeighbour, ChatFlipUnderLoad,
    CorruptAfterDisconnect, ServeFromOriginal, FirstTokenUnderLoad, ChoiceTokenChanged)}
