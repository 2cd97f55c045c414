"""Doubles for speculative-decoding health (issue 27): a proxy fault that makes the engine's
counters report shorter accepted steps while every token stays right, as a broken proposer or
draft model does (its drafts are rejected and the target model recomputes the same tokens)."""
from __future__ import annotations

import re

from doubles import Fault

ACCEPTED = re.compile(r"^(vllm:spec_decode_num_accepted_tokens(?:_per_pos)?_total(?:\{[^}]*\})?)"
                      r"\s+(\S+)$")


class ShortenAccepted(Fault):
    """/metrics as the proxy serves it: every accepted-token counter (the total and the
    per-position ones) multiplied by ``factor`` (< 1: fewer drafts accepted, the rest counted as
    rejected); drafts and draft tokens unchanged. ``scraped``: how many /metrics answers it
    rewrote."""

    def __init__(self, factor: float):
        self.factor = factor
        self.scraped = 0

    def metrics(self, text: str) -> str:
        self.scraped += 1
        out = []
        for line in text.splitlines():
            m = ACCEPTED.match(line)
            if m:
                line = f"{m.group(1)} {float(m.group(2)) * self.factor}"
            out.append(line)
        return "\n".join(out) + "\n"
