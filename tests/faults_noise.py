"""A clean engine's numerics, as a bf16 mixture-of-experts engine has them under batching (issue
47): an engine double that corrupts nothing, for the tests that a noisy clean engine comes out
green (and the planted classes are still detected beside it).

Measured on an H100 (vLLM 0.26, bf16 MoE, shared/DESIGN.md): a token's logprob moved by up to
0.82 nats between its solo and its batched run, greedy tokens flipped under load at reference
margins up to 2.1 nats in the control configuration too, and far-tail prompt logprobs (-40 nats)
moved by 3 nats. :class:`Numerics` plants the same on the CPU engine's exact float32 answers,
deterministically (the same request under load gets the same noise in every configuration, so a
control run reproduces it, as it does on the GPU), only on greedy /v1/completions requests that
arrived while another was in flight:

- every emitted token's row of logprobs (the token's and its top candidates') moves by the same
  offset in [-``jitter``, ``jitter``] nats, drawn per (prompt, position) (ranks and margins kept,
  every logprob stays <= 0);
- the first output position whose top-1/top-2 margin is below ``flip_margin`` nats emits its
  runner-up, listed first (a numerical flip: each side's token in the other's top candidates);
- a prompt position whose prompt token is outside the top-k (``prompt_logprobs``) moves by up to
  ``tail`` nats; the others by up to ``jitter`` / 3.

Requests with stop strings, penalties, logit bias, constraints, several choices or echo pass
untouched (their own checks read the text and positions the noise would have to keep in step).
"""
from __future__ import annotations

import random

from doubles import Fault, set_top, top_of

UNTOUCHED = ("stop", "stop_token_ids", "logit_bias", "min_tokens", "structured_outputs",
             "guided_json", "guided_regex", "guided_choice", "response_format",
             "repetition_penalty", "frequency_penalty", "presence_penalty", "echo", "min_p",
             "top_k", "top_p", "skip_special_tokens")


class Numerics(Fault):
    """See the module docstring. The engine it sits in front of (the float32 CPU engine) is
    served to the harness as a bfloat16 one (``/server_info``'s ``model_config.dtype``): these
    are half-precision numerics, and the harness judges them as such."""

    def server_info(self, data):
        cfg = data.get("vllm_config") if isinstance(data.get("vllm_config"), dict) else data
        if isinstance(cfg.get("model_config"), dict):
            cfg["model_config"]["dtype"] = "torch.bfloat16"
        return data

    def __init__(self, jitter: float = 0.9, flip_margin: float = 0.6, tail: float = 3.0):
        self.jitter, self.flip_margin, self.tail = jitter, flip_margin, tail
        self.flips = 0

    @staticmethod
    def _rng(prompt, *where) -> random.Random:
        return random.Random(f"{tuple(prompt)}:{where}")

    def _plain(self, ctx) -> bool:
        b = ctx.body
        return (not ctx.chat and not float(b.get("temperature") or 0)
                and int(b.get("n") or 1) == 1 and not any(k in b for k in UNTOUCHED))

    def chunk(self, ctx, chunk):
        if "noisy" not in ctx.state:
            ctx.state["noisy"] = ctx.in_flight >= 2 and self._plain(ctx)
        if not ctx.state["noisy"]:
            return chunk
        prompt = ctx.body.get("prompt") or []
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            if ch.get("prompt_logprobs"):
                self._prompt(ch["prompt_logprobs"], prompt,
                             int(ctx.body.get("prompt_logprobs") or 0))
            ids = ch.get("token_ids") or []
            for i in range(len(ids)):
                top = top_of(ch, i)
                if not top:
                    continue
                vals = sorted(top.values(), reverse=True)
                if (not ctx.state.get("flipped") and pos + i >= 1 and len(vals) >= 2
                        and vals[0] - vals[1] < self.flip_margin):
                    alt = max((t for t in top if t != ids[i]), key=lambda t: top[t])
                    # the runner-up emitted: the two trade their logprobs
                    top = {**top, alt: top[ids[i]], ids[i]: top[alt]}
                    ids[i] = alt
                    ctx.state["flipped"] = True
                    self.flips += 1
                d = self._rng(prompt, pos + i).uniform(-self.jitter, self.jitter)
                d = min(d, -max(top.values()))
                set_top(ch, i, {t: v + d for t, v in top.items()}, ids[i])
            pos += len(ids)
        return chunk

    def _prompt(self, entries: list, prompt: list, k: int) -> None:
        for t in range(1, min(len(entries), len(prompt))):
            e = entries[t]
            if not e:
                continue
            tok = e.get(str(prompt[t]))
            rng = self._rng(prompt, "prompt", t)
            if tok is not None and (tok.get("rank") or 0) > k:  # the far tail: below the top-k
                floor = min(v["logprob"] for kk, v in e.items() if kk != str(prompt[t]))
                tok["logprob"] = min(floor - 1e-3,
                                     tok["logprob"] + rng.uniform(-self.tail, self.tail))
                continue
            d = rng.uniform(-self.jitter / 3, self.jitter / 3)
            d = min(d, -max(v["logprob"] for v in e.values()))
            for v in e.values():
                v["logprob"] += d


class Chain(Fault):
    """Several faults in order (each sees the previous one's chunk): a clean engine's numerics
    under a planted fault."""

    def __init__(self, *faults: Fault):
        self.faults = faults

    def metrics(self, text):
        for f in self.faults:
            text = f.metrics(text)
        return text

    def server_info(self, data):
        for f in self.faults:
            data = f.server_info(data)
        return data

    def request(self, ctx, body):
        for f in self.faults:
            body = f.request(ctx, body)
        return body

    def chunk(self, ctx, chunk):
        for f in self.faults:
            if chunk is None:
                return None
            chunk = f.chunk(ctx, chunk)
        return chunk
