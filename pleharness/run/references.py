"""References: the outputs each request is compared with, in one place for every mode.

``--reference`` modes (:data:`pleharness.config.REFERENCE_MODES`):

* ``solo`` (default): each (prompt, max_tokens[, sampling]) run alone on the engine under test,
  one request in flight; ``cold`` keeps the first run, ``warm`` runs it twice and keeps the
  second (prefix-cached) run, judging the second against the first.
* ``golden``: the golden model's greedy continuation (:mod:`pleharness.golden`); the engine's own
  single-request runs are then compared with it like any other request.
* ``engine``: taken beforehand on a reference engine (a *collect-only* pass: the same scenarios
  run there, only their reference phases are issued) and handed in.
* ``manifest:PATH``: read from an earlier run's manifest and handed in.

With ``engine`` / ``manifest`` references nothing is run here: a missing reference is an explicit
parity failure. Scenarios never branch on the mode: they call
:meth:`References.take` (through ``ctx.take_references``) and get the phase it ran, or None.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..divergence import margins
from ..golden import GoldenError
from ..manifest import Manifest, ReferenceRecord
from ..parity import token_hash
from ..request import Outcome, RequestSpec

MODES_RUN_HERE = ("solo", "golden")  # the modes whose references are taken on this engine


def golden_models(spec: RequestSpec) -> bool:
    """Whether the golden model's continuation can be ``spec``'s reference (``--reference
    golden``): a greedy request with no per-request parameters. The golden model decodes
    max_tokens greedy tokens with no stop strings, penalties or logit bias and never stops at
    EOS (:mod:`pleharness.golden`), so a sampled or parameterised request (``sampled``,
    ``stop_strings``, ``mixed_params``) takes the engine's own solo run as its reference even
    in golden mode (its phase is named ``...-engine`` beside the golden prompts')."""
    return spec.temperature == 0.0 and not spec.params


class References:
    """The references of one run context, by request key (:attr:`RequestSpec.ref_key`).

    ``mode``: solo | golden | engine | manifest; ``collect_only``: this is the reference engine's
    pass (``--reference engine``: references are taken, nothing else is run);
    ``cache_state``: cold | warm (the default of :meth:`take`); ``source``: recorded on the
    references stored here (solo, or engine on the reference engine); ``known``: the references
    handed in (engine / manifest modes); ``run_phase``: the context's
    :meth:`pleharness.run.context.RunContext.run_phase`; ``save``: writes the manifest.
    """

    def __init__(self, manifest: Manifest, *, mode: str = "solo", collect_only: bool = False,
                 cache_state: str = "warm", source: str = "solo",
                 known: Mapping[tuple, ReferenceRecord] | None = None, golden=None,
                 run_phase: Callable | None = None, save: Callable[[], None] = lambda: None):
        self.manifest = manifest
        self.mode = mode
        self.collect_only = collect_only
        self.cache_state = cache_state
        self.source = source
        self.golden = golden
        self.by_key: dict[tuple, ReferenceRecord] = dict(known or {})
        self.run_phase = run_phase
        self.save = save

    @property
    def taken_here(self) -> bool:
        """Whether references are run on this engine (solo, golden, or the collect-only pass)."""
        return self.mode in MODES_RUN_HERE or self.collect_only

    def take(self, specs: Sequence[RequestSpec], phase_name: str = "references",
             cache_state: str | None = None):
        """Take the references ``specs`` still lack (see the module docstring and
        :meth:`pleharness.run.context.RunContext.take_references`). Returns the
        :class:`~pleharness.run.phases.PhaseResult` of the kept outputs, or None when nothing was
        run here (every reference exists, they come from elsewhere, or this is the collect-only
        pass, whose phases belong to the reference engine, not to the run under test).

        A seeded sampled spec may use a reference handed in under its greedy key when that
        reference holds the same sampling (golden manifests are keyed without sampling); every
        sampled spec's reference records its sampling (temperature, seed)."""
        self._alias_sampled(specs)
        result = self._take(specs, phase_name, cache_state) if self.taken_here else None
        for s in specs:  # the manifest's references say which sampling they hold
            ref = self.by_key.get(s.ref_key)
            if s.temperature > 0 and ref is not None:
                ref.temperature, ref.seed = s.temperature, s.seed
        return None if self.collect_only else result

    def _alias_sampled(self, specs: Sequence[RequestSpec]) -> None:
        for s in specs:
            g = self.by_key.get((s.prompt.hash, s.max_tokens))
            if s.temperature > 0 and s.ref_key not in self.by_key and g is not None \
                    and (g.temperature, g.seed) == (s.temperature, s.seed):
                self.by_key[s.ref_key] = g

    def _take(self, specs: Sequence[RequestSpec], phase_name: str, cache_state: str | None):
        state = cache_state or self.cache_state
        todo, seen = [], set()
        for s in specs:
            if s.ref_key not in self.by_key and s.ref_key not in seen:
                seen.add(s.ref_key)
                # a copy keeps the sampling (temperature, seed); references stream, except a
                # request with prompt_logprobs (vLLM refuses them streamed: a 400); one
                # request of one choice (a choice's seed is its own, RequestSpec.n)
                todo.append(replace(s, compare=False, stream=s.prompt_logprobs is None,
                                    abandon_after_tokens=None, n=1, choice=0))
        if not todo:
            return None
        if self.mode == "golden" and not self.collect_only:
            own = [s for s in todo if not golden_models(s)]
            gold = [s for s in todo if golden_models(s)]
            result = self._solo(own, phase_name + ("-engine" if gold else ""), state) \
                if own else None
            return self._golden(gold, phase_name, state) if gold else result
        return self._solo(todo, phase_name, state)

    def _solo(self, todo: Sequence[RequestSpec], phase_name: str, state: str):
        """The engine's own single-request runs of ``todo`` as their references: cold, then warm
        (kept) when ``state`` is warm; cold (kept) otherwise."""
        if state == "warm":
            cold = self.run_phase(phase_name + "-cold", 1, todo, role="reference")
            self.store(cold, "cold")
            again = [replace(s, compare=True) for s in todo]
            outcomes = self.run_phase(phase_name, 1, again, role="reference")
            self.store(outcomes, "warm")
        else:
            outcomes = self.run_phase(phase_name, 1, todo, role="reference")
            self.store(outcomes, "cold")
        return outcomes

    def _golden(self, todo: Sequence[RequestSpec], phase_name: str, state: str):
        """``--reference golden``: each prompt's reference is the golden model's greedy
        continuation (:mod:`pleharness.golden`); the engine's own single-request runs (cold, then
        warm when ``state`` is warm) are then compared with it like any other request."""
        if self.golden is None:
            raise GoldenError("--reference golden: no golden model")
        for s in todo:
            g = self.golden.generate(list(s.prompt.ids), s.max_tokens)
            ref = ReferenceRecord(
                prompt_key=s.prompt.key, prompt_hash=s.prompt.hash, prompt_len=len(s.prompt),
                max_tokens=s.max_tokens, output_hash=token_hash(g.ids), output_ids=list(g.ids),
                margins=g.margins(), top_ids=[[t for t, _ in top] for top in g.top],
                source="golden", cache_state="n/a")
            self.by_key[s.ref_key] = ref
            self.manifest.references.append(ref)
        self.save()
        solo = [RequestSpec(s.prompt, s.max_tokens, compare=True, logprobs=s.logprobs,
                            checks=s.checks) for s in todo]
        if state == "warm":
            self.run_phase(phase_name + "-cold", 1, solo, role="reference")
        return self.run_phase(phase_name, 1, solo, role="reference")

    def store(self, outcomes: Sequence[Outcome], cache_state: str) -> None:
        """Make successful outcomes the references of their (prompt, max_tokens), replacing a
        previous (cold) reference of the same key and keeping its hash as ``cold_output_hash``."""
        for o in outcomes:
            c = o.completion
            if c.error is not None:
                continue
            old = self.by_key.get(o.spec.ref_key)
            ref = ReferenceRecord(
                prompt_key=o.spec.prompt.key, prompt_hash=o.spec.prompt.hash,
                prompt_len=len(o.spec.prompt), max_tokens=o.spec.max_tokens,
                output_hash=token_hash(c.token_ids), output_ids=list(c.token_ids),
                margins=margins(c.logprobs), source=self.source,
                top_ids=[sorted(t) for t in c.logprobs] if c.logprobs is not None else None,
                token_logprobs=list(c.token_logprobs) if c.token_logprobs else None,
                cache_state=cache_state, request_id=o.record.id,
                cold_output_hash=old.output_hash if old is not None else None,
                params=o.spec.params or None, temperature=o.spec.temperature, seed=o.spec.seed)
            if old is not None:
                self.manifest.references = [r for r in self.manifest.references if r is not old]
            self.by_key[o.spec.ref_key] = ref
            self.manifest.references.append(ref)
        self.save()
