"""The core fault classes of ``ple-harness selftest`` (:data:`CORE`): one planted engine fault each,
applied by :class:`pleharness.faults.proxy.FaultProxy` to the answers of a real engine; the
request-feature families are in :mod:`.families`, both together in
:data:`pleharness.faults.BUILTIN`.

Each class is a :class:`SelftestFault` with a ``name`` (the selftest's row), a one-line
``summary`` (what a broken engine would do) and ``expect`` (the checks of this harness that should
see it, for the report). Every class records the requests it changed in ``hits`` (arrival
numbers); a class that never fired is reported "missed (never triggered)", never as detected.
Requests are picked by arrival number (``every``-th completion request, 1-based) or by what the
engine was doing when they arrived (in flight together, a prompt's later runs), never at random,
so a pass is reproducible on the same schedule.

Token edits keep the answer self-consistent where a real corrupting engine would (the text, the
logprobs' top-1 entry, the usage block), so that each class is caught by the rule it is about, not
by a side effect of a sloppy edit.
"""
from __future__ import annotations

import threading

from ..parity import token_hash
from .rules import Counted, Fault, RequestCtx, set_top, top_first, top_of

OOV_ID = 1_000_003  # an ID above any vocabulary this harness serves (vocab_range: id < V)


class SelftestFault(Fault):
    """Base: a named fault that records the requests it changed: their arrival numbers
    (``hits``) and what they asked (``keys``: (prompt hash, max_tokens) of a completions request,
    ("chat",) for a chat request), so that a detection is counted only on a request the fault
    changed (:func:`pleharness.selftest.judge`)."""

    name: str = ""
    summary: str = ""
    expect: str = ""  # the harness rule(s) that should catch it

    def __init__(self) -> None:
        self.hits: list[int] = []
        self.keys: set[tuple] = set()
        self._lock = threading.Lock()

    def hit(self, ctx: RequestCtx) -> None:
        """Record ``ctx`` as changed (once per request)."""
        if not ctx.state.get("hit"):
            ctx.state["hit"] = True
            prompt = ctx.body.get("prompt")
            key = (("chat",) if getattr(ctx, "chat", False) or not isinstance(prompt, list) else
                   (token_hash([int(t) for t in prompt]), ctx.body.get("max_tokens")))
            with self._lock:
                self.hits.append(ctx.number)
                self.keys.add(key)

    def vacuous(self, m) -> str | None:
        """Why this class could not fire on this engine, from its pass's manifest ``m``, or
        None (default: never vacuous; a class that never fired missed). Family classes whose
        requests an engine cannot serve override it
        (:meth:`pleharness.faults.families.FamilyFault.vacuous`)."""
        return None

    def calibrate(self, envelope: dict | None) -> None:
        """Size the planted change to the engine's measured numerics (the clean pass's
        ``run_options.numerics_envelope``: ``near_tie_nats``, ``logprob_tolerance_nats``), so
        that what is planted is a defect on this engine, not a change its own numerics make:
        on a bf16 mixture-of-experts engine a flip at a 1-nat margin is numerics (issue 47).
        Default: nothing to size."""


class _EveryNth(SelftestFault):
    """Changes every ``every``-th completion request (arrival numbers every, 2 * every, ...)."""

    every = 4

    def picked(self, ctx: RequestCtx) -> bool:
        return ctx.number % self.every == 0

    def chunk(self, ctx, chunk):
        if not self.picked(ctx):
            return chunk
        out = self.edit(ctx, chunk)
        return out

    def edit(self, ctx: RequestCtx, chunk: dict) -> dict | None:  # pragma: no cover - abstract
        raise NotImplementedError


def _confident_flip(fault: SelftestFault, ctx: RequestCtx, chunk: dict, start: int = 2,
                    margin: float = 1.0) -> dict:
    """Replace the token at the first position >= ``start`` whose top-1/top-2 margin in this
    answer is >= ``margin`` nats with its runner-up (or id +- 1 without logprobs), top-1 logprob
    moved to it: a hard, self-consistent flip of one token (decided once per request)."""
    pos = ctx.tokens_so_far
    for ch in chunk.get("choices") or []:
        ids = ch.get("token_ids") or []
        for i in range(len(ids)):
            if ctx.state.get("flipped") is None and pos + i >= start:
                top = top_of(ch, i)
                vals = sorted(top.values(), reverse=True)
                if not top or (len(vals) >= 2 and vals[0] - vals[1] >= margin):
                    alt = [t for t in sorted(top, key=lambda t: -top[t]) if t != ids[i]]
                    new = alt[0] if alt else (ids[i] - 1 if ids[i] > 16 else ids[i] + 1)
                    if top:
                        set_top(ch, i, top_first(top, new), new)
                    else:
                        ids[i] = new
                    ch["text"] = ""
                    ctx.state["flipped"] = pos + i
                    fault.hit(ctx)
        pos += len(ids)
    return chunk


class FlipUnderLoad(SelftestFault):
    """One token flipped (a confident position, logprobs consistent) in the answers to requests
    that arrived while another completion was in flight; a request alone is never touched. Only a
    comparison of a loaded run with its single-request reference can see it."""

    name = "flip_under_load"
    summary = "one token flipped, only when 2 or more requests are in flight"
    expect = "parity (vs the single-request reference)"
    margin = 1.0  # nats: the flipped position's top-1/top-2 margin is at least this

    def calibrate(self, envelope):
        """A confident position: a margin of at least twice the measured near-tie threshold."""
        self.margin = _confident_margin(envelope)

    def chunk(self, ctx, chunk):
        if ctx.in_flight < 2:
            return chunk
        return _confident_flip(self, ctx, chunk, margin=self.margin)


def _confident_margin(envelope) -> float:
    """The margin (nats) of a confident flip on an engine with this envelope: 1 nat, or twice
    the measured near-tie threshold where that is larger."""
    return max(1.0, 2 * float((envelope or {}).get("near_tie_nats") or 0))


class CorruptWarm(Counted, SelftestFault):
    """One token flipped (as :class:`FlipUnderLoad`) in every run of a (prompt, max_tokens) after
    its first: the prefix-cached (warm) runs differ from the cold one, the same way every time."""

    name = "corrupt_warm"
    summary = "one token flipped in every warm (second and later) run of a prompt"
    expect = "parity (warm vs cold run)"

    def __init__(self) -> None:
        Counted.__init__(self)
        SelftestFault.__init__(self)

    margin = 1.0

    def calibrate(self, envelope):
        """As :meth:`FlipUnderLoad.calibrate`."""
        self.margin = _confident_margin(envelope)

    def chunk(self, ctx, chunk):
        if self.occurrence(ctx) < 2:
            return chunk
        return _confident_flip(self, ctx, chunk, margin=self.margin)


class OutOfVocab(_EveryNth):
    """Every 4th request: its second token becomes an ID above the vocabulary."""

    name = "oov_id"
    summary = f"the second output token of every 4th request becomes ID {OOV_ID}"
    expect = "vocab_range"

    def edit(self, ctx, chunk):
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                if pos + i == 1:
                    ids[i] = OOV_ID
                    self.hit(ctx)
            pos += len(ids)
        return chunk


class ZeroRun(_EveryNth):
    """Every 4th request: every token from the second on becomes ID 0 (a NaN row's argmax)."""

    name = "token0_run"
    summary = "every 4th request: tokens from the second on become ID 0 (NaN logits)"
    expect = "degeneration (run of token 0)"

    def edit(self, ctx, chunk):
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                if pos + i >= 1:
                    if top_of(ch, i):
                        set_top(ch, i, top_first(top_of(ch, i), 0), 0)
                    else:
                        ids[i] = 0
                    ch["text"] = ""
                    self.hit(ctx)
            pos += len(ids)
        return chunk


class DropDelta(_EveryNth):
    """Every 4th streamed request: the SSE chunk that carries its third token is not sent (the
    usage block still counts it)."""

    name = "dropped_delta"
    summary = "every 4th streamed request loses the streamed chunk with its third token"
    expect = "usage (completion_tokens vs IDs received), parity"

    def picked(self, ctx):
        return ctx.streamed and super().picked(ctx)

    def edit(self, ctx, chunk):
        n = sum(len(c.get("token_ids") or []) for c in chunk.get("choices") or [])
        if n and ctx.tokens_so_far <= 2 < ctx.tokens_so_far + n:
            self.hit(ctx)
            return None
        return chunk


class UsageMismatch(_EveryNth):
    """Every 4th request: usage.completion_tokens one more than the tokens sent."""

    name = "usage_mismatch"
    summary = "every 4th request reports usage.completion_tokens + 1"
    expect = "usage"

    def edit(self, ctx, chunk):
        u = chunk.get("usage")
        if u and u.get("completion_tokens") is not None:
            u["completion_tokens"] += 1
            if u.get("total_tokens") is not None:
                u["total_tokens"] += 1
            self.hit(ctx)
        return chunk


class WrongFinish(_EveryNth):
    """Every 4th request: finish_reason "length" reported as "stop" (max_tokens IDs came back
    with ignore_eos)."""

    name = "wrong_finish"
    summary = "every 4th request ends with finish_reason \"stop\" instead of \"length\""
    expect = "usage (finish_reason)"

    def edit(self, ctx, chunk):
        for ch in chunk.get("choices") or []:
            if ch.get("finish_reason") == "length":
                ch["finish_reason"] = "stop"
                self.hit(ctx)
        return chunk


class SentinelLogprob(_EveryNth):
    """Every 4th request: every top-logprob entry after the first becomes -9999.0 (vLLM's -inf)
    on token IDs 0, 1, ...; the emitted token's own entry is kept."""

    name = "sentinel_logprob"
    summary = "every 4th request: top-logprob runners-up replaced by the -9999.0 sentinel"
    expect = "logprob_sanity"

    def edit(self, ctx, chunk):
        for ch in chunk.get("choices") or []:
            tops = (ch.get("logprobs") or {}).get("top_logprobs") or []
            for j, top in enumerate(tops):
                if top and len(top) > 1:
                    first = next(iter(top.items()))
                    tops[j] = dict([first] + [(f"token_id:{t}", -9999.0)
                                              for t in range(len(top) - 1)])
                    self.hit(ctx)
        return chunk


class CutShort(_EveryNth):
    """Every 4th request ends after half its max_tokens (at least 1), with finish_reason
    "length" and usage counting what was sent: consistent, but short, although ignore_eos was
    set."""

    name = "cut_short"
    summary = "every 4th request ends after half its max_tokens (finish_reason and usage consistent)"
    expect = "usage (fewer IDs than max_tokens with ignore_eos)"

    def edit(self, ctx, chunk):
        cut = max(1, int(ctx.body.get("max_tokens") or 2) // 2)
        if chunk.get("usage"):
            u = chunk["usage"]
            u["completion_tokens"] = min(cut, u.get("completion_tokens") or cut)
            u["total_tokens"] = (u.get("prompt_tokens") or 0) + u["completion_tokens"]
        kept = []
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            n = max(0, min(len(ids), cut - ctx.tokens_so_far))
            if n == 0 and (ids or ctx.tokens_so_far >= cut):
                if ids:
                    self.hit(ctx)
                continue  # wholly after the cut
            if n < len(ids):
                self.hit(ctx)
                ch["token_ids"], ch["text"] = ids[:n], ""
                for k, v in (ch.get("logprobs") or {}).items():
                    if isinstance(v, list):
                        ch["logprobs"][k] = v[:n]
            if ctx.tokens_so_far + n == cut:
                ch["finish_reason"] = "length"
            kept.append(ch)
        if not kept and not chunk.get("usage"):
            return None
        chunk["choices"] = kept
        return chunk


CORE: dict[str, type[SelftestFault]] = {c.name: c for c in (
    FlipUnderLoad, CorruptWarm, OutOfVocab, ZeroRun, DropDelta, UsageMismatch, WrongFinish,
    SentinelLogprob, CutShort)}
