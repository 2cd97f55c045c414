"""Scenario kind ``determinism``: N identical greedy requests in flight together.

Every request carries the same prompt and sampling (temperature 0); a deterministic engine returns
one distinct output. The phase records the number of distinct outputs and how many requests
produced each (the distribution); more than one distinct output fails the phase check
``determinism`` (shared/DESIGN.md, "Identical burst").
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..manifest import CheckResult
from ..prompts import seeded_prompts
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class DeterminismParams(Params):
    """Parameters of ``determinism``: ``n`` identical requests of a seeded random prompt of
    ``prompt_len`` tokens, ``max_tokens`` each."""

    n: int = Field(32, ge=2, le=1024, description="identical requests in flight together")
    prompt_len: int = Field(64, ge=1, le=10_000_000)
    max_tokens: int = Field(32, ge=1, le=1_000_000)
    seed: int = 7


class DeterminismRow(TableRow):
    """One phase of identical requests (``tables.determinism``): how many, how many distinct
    outputs, and the requests per output hash (most common first)."""

    phase: str
    requests: int
    distinct_outputs: int
    distribution: list[dict[str, Any]]


@register
class Determinism(Scenario):
    """Kind ``determinism``: see the module docstring (one phase, check ``determinism``)."""

    kind = "determinism"
    summary = "N identical greedy requests in flight together: count distinct outputs (1 expected)"
    Params = DeterminismParams
    tables = {"determinism": DeterminismRow}

    phases = 1

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        vocab = ctx.facts.vocab_or()
        m = ctx.facts.max_model_len
        n = p.prompt_len if m is None else min(p.prompt_len, int(m) - p.max_tokens)
        if n < 1:
            self.leave_out_phases(ctx, [(f"identical-x{p.n}", p.n)], f"params.max_tokens "
                                  f"{p.max_tokens} leaves no room for a prompt: max_model_len "
                                  f"is {m}")
            return
        if n < p.prompt_len:
            ctx.note("determinism_notes", f"prompt shortened to {n} tokens (params.prompt_len "
                     f"{p.prompt_len} + max_tokens {p.max_tokens} exceeds max_model_len {m})",
                     echo=True)
        (prompt,) = seeded_prompts(p.seed, 1, n, n, 16, vocab)
        specs = [RequestSpec(prompt, p.max_tokens, compare=False) for _ in range(p.n)]
        outs = ctx.run_phase(f"identical-x{p.n}", p.n, specs)
        if not outs:
            return
        counts = Counter(o.record.output_hash for o in outs if o.record.error is None)
        dist = [{"output_hash": h, "requests": n} for h, n in counts.most_common()]
        ph = outs.phase
        ok = len(counts) == 1
        ctx.add_phase_check(ph, CheckResult(
            name="determinism", status="pass" if ok else "fail",
            detail=f"{len(counts)} distinct output(s) from {sum(counts.values())} identical "
                   f"requests: {', '.join(str(d['requests']) for d in dist)}"),
            reason=f"{len(counts)} distinct outputs from identical requests")
        ctx.add_table("determinism", [
            DeterminismRow(phase=ph.name, requests=p.n, distinct_outputs=len(counts),
                           distribution=dist)])
