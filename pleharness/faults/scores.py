"""Planted fault classes of the score families (issue 35 items 4 and 6), beside
:mod:`.families`: prompt logprobs shifted by one position, and emitted-token logprobs moved while
each answer stays self-consistent. Only a comparison with the same request's solo scores can
see either; :data:`SCORES` by name."""
from __future__ import annotations

from .families import FamilyFault


def asks_scores(body: dict) -> bool:
    """Whether a completions request body asks for the prompt's scores (``prompt_logprobs``, or
    ``echo`` with ``logprobs``)."""
    return body.get("prompt_logprobs") is not None or (
        bool(body.get("echo")) and body.get("logprobs") is not None)


class ShiftedPromptLogprobs(FamilyFault):
    """A request that asks for the prompt's scores and arrives while another request is in
    flight gets them shifted by one position: entry t holds what the engine gave for entry
    t - 1 (entry 1 none), the public bug pattern (an off-by-one in the gather of the prompt's
    logits rows under batching). With ``relabel``, entry t holds entry t + 1's scores (the last
    entry kept) keyed as prompt token t's: the IDs line up and every entry is complete and
    self-consistent, only the values are the next position's, so only the comparison with the
    solo request can tell."""

    name = "prompt_logprobs_shifted"
    family = "prompt logprobs"
    scenarios = ("prompt_logprobs",)
    summary = "prompt scores under load shifted by one position (entry t holds t - 1's)"
    expect = "prompt_logprobs, prompt_logprobs_parity"

    def __init__(self, relabel: bool = False):
        super().__init__()
        self.relabel = relabel

    def request(self, ctx, body):
        if asks_scores(body) and ctx.in_flight >= 2:
            ctx.state["selected"] = True
            self.hit(ctx)
        return body

    def _shift(self, entries: list, prompt: list[int], key) -> list:
        if not self.relabel:
            return [entries[0], None] + list(entries[1:-1])
        out = list(entries)
        for t in range(1, len(out) - 1):  # entry t <- entry t + 1, keyed as token t's
            e = entries[t + 1]
            if e:
                old, new = key(prompt[t + 1]), key(prompt[t])
                out[t] = {(new if k == old else old if k == new else k): v
                          for k, v in e.items()}
        return out

    def chunk(self, ctx, chunk):
        if not ctx.state.get("selected") or ctx.state.get("done"):
            return chunk
        prompt = list(ctx.body.get("prompt") or [])
        for ch in chunk.get("choices") or []:
            if ch.get("prompt_logprobs"):  # prompt_logprobs (non-streamed)
                ch["prompt_logprobs"] = self._shift(ch["prompt_logprobs"], prompt, str)
                ctx.state["done"] = True
            lp = ch.get("logprobs") or {}
            tops = lp.get("top_logprobs")
            if ctx.body.get("echo") and tops and len(tops) >= len(prompt):  # echo: its head
                n = len(prompt)
                lp["top_logprobs"] = self._shift(tops[:n], prompt,
                                                 lambda t: f"token_id:{t}") + tops[n:]
                tl = lp.get("token_logprobs")
                if tl:
                    new = [lp["top_logprobs"][t].get(f"token_id:{prompt[t]}")
                           if lp["top_logprobs"][t] else None for t in range(n)]
                    lp["token_logprobs"] = new + tl[n:]
                ctx.state["done"] = True
        return chunk


class LogprobsOffUnderLoad(FamilyFault):
    """Greedy requests with ``logprobs`` in flight with another request (when they arrive, or at
    any later chunk) get every logprob from output position ``start`` on lowered by ``by``
    nats, the emitted token's and its top candidates' alike: ranks, margins and the top-1 rule still hold, each answer is
    self-consistent (what a draft model's logprobs reported for the target's tokens, or a
    logprob row taken from another batch row, looks like); only the comparison with the solo
    run's logprobs can tell."""

    name = "logprobs_off_under_load"
    family = "emitted-token logprobs"
    scenarios = ("transitions",)
    summary = "logprobs of greedy answers under load lowered by 1 nat from position 1 on"
    expect = "logprob_parity"

    def __init__(self, start: int = 1, by: float = 1.0):
        super().__init__()
        self.start, self.by = start, by

    def calibrate(self, envelope):
        """Lower by 1 nat, or by twice the measured logprob tolerance where that is larger (a
        shift within the engine's own numerics is no defect)."""
        tol = float((envelope or {}).get("logprob_tolerance_nats") or 0)
        self.by = max(self.by, round(2 * tol, 4))
        self.summary = (f"logprobs of greedy answers under load lowered by {self.by:g} nat"
                        f"{'s' if self.by != 1 else ''} from position 1 on")

    def chunk(self, ctx, chunk):
        b = ctx.body
        if b.get("logprobs") is None or float(b.get("temperature") or 0):
            return chunk
        if not ctx.state.get("selected"):  # in flight with another, now or when it arrived
            ctx.state["selected"] = ctx.in_flight >= 2 or self.beside(ctx, lambda o: True)
            if not ctx.state["selected"]:
                return chunk
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            lp = ch.get("logprobs") or {}
            tops, chosen = lp.get("top_logprobs") or [], lp.get("token_logprobs") or []
            for i in range(len(ch.get("token_ids") or [])):
                if pos + i < self.start:
                    continue
                if i < len(tops) and tops[i]:
                    tops[i] = {k: v - self.by for k, v in tops[i].items()}
                if i < len(chosen) and chosen[i] is not None:
                    chosen[i] -= self.by
                    self.hit(ctx)
            pos += len(ch.get("token_ids") or [])
        return chunk


SCORES: dict[str, type[FamilyFault]] = {c.name: c for c in (
    ShiftedPromptLogprobs, LogprobsOffUnderLoad)}
