"""The judge: one verdict rule for every request, in every command.

A request's output is judged against its single-request reference (parity: the SHA256 of the
token IDs, :mod:`pleharness.parity`); a mismatch is analysed (:func:`pleharness.divergence.analyse`:
the near-tie rule, the golden classifier where a golden model runs), the reference-free checks
run on it (:mod:`pleharness.checks`), and "which side is wrong" is decided: by the golden model at
once where it can (:func:`pleharness.divergence.golden_side`), else by the majority over every
run of the prompt after the suite (:func:`pleharness.run.sides.judge_sides`). A reference found corrupt fails the run
that produced it (check ``corrupt_reference``) and is replaced; the runs compared with it are
judged again.

Used by the run context (every phase of ``stress`` and ``fuzz``), by attribution
(:func:`finish_phase`, :func:`refinish`) and by ``explain``'s replays (:func:`compare_outputs`),
so every command reaches the same verdict on the same evidence.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..checks import REGISTRY
from ..divergence import (Rule, analyse, compare_outputs, first_divergence,  # noqa: F401
                          golden_side, is_half_precision, noise_floor, settle_under, solo_gaps)
from ..checks.logprob_parity import judge as judge_logprobs
from ..checks.logprob_parity import measure as measure_logprobs
from ..checks.logprob_sanity import shapes_logits
from ..engine.completion import Completion
from ..golden import GoldenError
from ..manifest import (CheckResult, Divergence, Manifest, PhaseRecord, ReferenceRecord,
                        RequestRecord, SideEvidence)
from ..parity import token_hash
from ..request import RequestSpec
from .settlement import parity_status, record_settlement


class Judge:
    """Judges every request of a run (parity, divergence, checks, which side is wrong).

    ``manifest``: where verdicts are kept (its references, summary and run options are written:
    a corrupt reference is replaced there); ``references``: the live references by request key
    (shared with :class:`pleharness.run.references.References`); ``golden``: the golden model
    (:class:`pleharness.golden.GoldenModel`) or None; ``check_registry``: request checks by name;
    ``save``: writes the manifest; ``warn``: prints a warning line.
    """

    def __init__(self, manifest: Manifest, references: dict[tuple, ReferenceRecord],
                 rule: Rule, golden=None, check_registry: Mapping | None = None,
                 save: Callable[[], None] = lambda: None,
                 warn: Callable[[str], None] = lambda _text: None):
        self.manifest = manifest
        self.references = references
        self.rule = rule
        self.golden = golden
        self.check_registry = REGISTRY if check_registry is None else check_registry
        self.save = save
        self.warn = warn
        self.golden_error: str | None = None  # why the golden classifier stopped being used
        # (record, prompt, output) of the greedy, unparameterised solo reference runs: the
        # half-precision golden noise floor (:meth:`finish_judgement`)
        self._solo_runs: list[tuple[RequestRecord, list[int], list[int]]] = []
        # prefix-cache epochs: a reset (POST /reset_prefix_cache) starts a new one; a run's
        # epoch says whether two warm runs saw the same cache (solo repeatability)
        self.cache_epoch = 0
        self._epochs: dict[str, int] = {}

    def golden_failed(self, why: str) -> None:
        """Stop using the golden model (recorded once in ``run_options``)."""
        self.golden_error = why
        self.manifest.run_options.golden_classifier_error = why

    def judge_request(self, ph: PhaseRecord, spec: RequestSpec, c: Completion,
                      rec: RequestRecord, check_ctx: Any) -> None:
        """Judge ``rec`` (the record of ``spec``'s completion ``c`` in phase ``ph``): parity
        against the reference of ``spec.ref_key`` (a missing reference fails), the request
        checks of ``spec.checks`` (each called as ``check(check_ctx, spec, c, params)``; an
        unregistered one is recorded as skipped), then the divergence, if any
        (:meth:`_judge`)."""
        if spec.compare:
            ref = self.references.get(spec.ref_key)
            if ref is None:
                rec.match = False
                rec.checks.append(CheckResult(name="parity", status="fail",
                                              detail="no single-request reference for this prompt"))
            elif c.error is None:
                rec.reference_hash = ref.output_hash
                rec.match = rec.output_hash == ref.output_hash
                if not rec.match:
                    rec.first_divergence = first_divergence(ref.output_ids, c.token_ids)
                    rec.output_ids = list(c.token_ids)
                if ph.role != "reference" and rec.id != ref.request_id:
                    diffs = measure_logprobs(spec, c, ref, self.rule.near_tie_nats)
                    why = self.manifest.run_options.near_tie_source or "the dtype bound"
                    if diffs is not None:  # judged again at the run's measured envelope
                        rec.logprob_diffs = diffs
                        rec.checks.append(judge_logprobs(diffs, self.rule.near_tie_nats, why,
                                                         c.token_ids))
            else:
                rec.reference_hash = ref.output_hash
                rec.match = False
        for check_name, params in spec.checks.items():
            check = self.check_registry.get(check_name)
            if check is None:
                rec.checks.append(CheckResult(name=check_name, status="skip",
                                              detail="check not registered"))
            else:
                rec.checks.append(check(check_ctx, spec, c, params))
        self._epochs[rec.id] = self.cache_epoch
        if ph.role == "reference" and c.error is None and rec.output_ids is None:
            rec.output_ids = list(c.token_ids)  # every solo run: pleharness.differential
        if rec.match is False and c.error is None and rec.first_divergence is not None:
            self._judge(ph, rec, spec, c, self.references[spec.ref_key])
        if (ph.role == "reference" and c.error is None and self.golden is not None
                and is_half_precision(self.rule.serving_dtype) and floor_run(spec)):
            self._solo_runs.append((rec, list(spec.prompt.ids), list(c.token_ids)))

    @property
    def _half(self) -> bool:
        return is_half_precision(self.rule.serving_dtype)

    def _solo_repeat(self, ph: PhaseRecord, rec: RequestRecord, spec: RequestSpec,
                     ref: ReferenceRecord) -> str | None:
        """The solo-repeatability evidence for ``rec``'s divergence from ``ref`` (a sentence), or
        None when it does not apply. It applies when both runs ran alone (``rec``'s phase is C1,
        the reference is a solo run of this engine), greedy with the same parameters (one
        reference key), over the same computation (prefix caching off, or both runs warm in
        one prefix-cache epoch: no reset between them), on an engine whose probe measured that
        solo greedy runs repeat (``engine_probe.greedy_repeats``). Then the two runs computed
        exactly the same thing and an engine that repeats itself alone must give one output:
        the divergence is hard whatever the margins or the golden model say (issue 32).
        A request of several choices (``n`` > 1) never applies: its choices share every step
        (not alone) and greedy ones are sent as top-1 sampling, which on vLLM keeps every token
        tied at the top and draws among them (GPU run q: an exact bf16 tie, 0.0 nats, drew
        differently in two C1 runs of one prompt on a clean engine)."""
        if ph.concurrency != 1 or spec.temperature > 0 or (spec.n or 1) > 1 \
                or ref.source != "solo" \
                or ref.temperature or ref.request_id is None or ref.request_id == rec.id:
            return None
        if (self.manifest.engine_probe or {}).get("greedy_repeats") is not True:
            return None
        fact = (self.manifest.facts.get("prefix_caching") or {}).get("value")
        if fact is False or str(fact).lower() == "false":
            cache = "prefix caching is off (both computed the whole prompt)"
        elif ref.cache_state == "warm" and self._epochs.get(ref.request_id) == self.cache_epoch:
            cache = "both ran warm (prefix-cached) with no cache reset between them"
        else:
            return None
        return (f"the engine does not repeat itself alone at this prompt: the reference run "
                f"{ref.request_id} and run {rec.id} both ran alone (C1), greedy, with the same "
                f"parameters; {cache}; the engine probe measured that solo greedy runs repeat")

    def _judge(self, ph: PhaseRecord, rec: RequestRecord, spec: RequestSpec, c: Completion,
               ref: ReferenceRecord, again: bool = False) -> Divergence:
        """Analyse the divergence of ``rec`` (output ``c``) from ``ref``, judge which side is wrong
        where the golden model can (:func:`pleharness.divergence.golden_side`; else the majority
        pass at the end of the run, :func:`pleharness.run.sides.judge_sides`), add the parity check. A corrupt
        reference (the golden model finds the reference's token implausible) fails its own run
        (:meth:`_corrupt_reference`) and is replaced by the golden continuation, against which
        ``rec`` is judged again."""
        failed = [ch.name for ch in rec.checks if ch.status == "fail" and ch.name != "parity"]
        pos = rec.first_divergence
        g = self._golden_evidence(spec, ref.output_ids, c.token_ids, pos)
        d = analyse(ref.output_ids, c.token_ids, pos, ref.margins, self.rule.near_tie_nats, failed,
                    golden=g,
                    reference_top=ref.top_ids[pos] if ref.top_ids and pos < len(ref.top_ids)
                    else None,
                    observed_top=c.logprobs[pos] if c.logprobs and pos < len(c.logprobs)
                    else None)
        d.solo_repeat = self._solo_repeat(ph, rec, spec, ref)
        settle_under(d, self.rule, spec.temperature)
        ev = SideEvidence(reference_run=ref.request_id, reference_source=ref.source,
                          observed_run=rec.id, observed_role=ph.role)
        if g is not None:
            lps = {int(k): float(v) for k, v in g["logprobs"].items()}
            if d.reference_token in lps:
                ev.golden_logprob_reference = round(lps[d.reference_token], 6)
            if d.observed_token in lps:
                ev.golden_logprob_observed = round(lps[d.observed_token], 6)
            if self._half:
                # half precision: the golden model decides a side only once its noise floor on
                # this engine is measured and found informative (finish_judgement)
                ev.detail = "golden logprobs kept; the side waits for the measured golden floor"
            else:
                side, why = golden_side(d.reference_token, d.observed_token, g,
                                        self.rule.near_tie_nats)
                ev.method, ev.tolerance_nats, ev.detail = "golden", self.rule.near_tie_nats, why
                d.corrupt_side = side
        d.side_evidence = ev
        rec.divergence = d
        m = "n/a (no reference logprobs)" if d.margin_nats is None else \
            f"{d.margin_nats:.4f} nats"
        gg = "" if d.golden_gap_nats is None else f", golden gap {d.golden_gap_nats:.4f} nats"
        if d.classified_by == "golden" and not d.observed_in_golden_top:
            gg += " (observed token not in the golden top-k)"
        rec.checks = [ch for ch in rec.checks if ch.name != "parity"]
        rec.checks.append(CheckResult(
            name="parity", status=parity_status(d),
            detail=(side_sentence(d, rec.prompt_key) + "; " if d.corrupt_side in
                    ("reference", "load") else "")
                   + f"{d.cls} at position {d.position}: reference "
                   f"{d.reference_token} vs observed {d.observed_token}, reference "
                   f"top-1/top-2 margin {m}{gg}; threshold {self.rule.near_tie_nats:g} nats"
                   + (" (strict)" if self.rule.strict else "")
                   + (" (seeded sample: never a near tie)" if spec.temperature > 0 else "")
                   + (f"; {d.solo_repeat}" if d.solo_repeat else "")))
        if d.corrupt_side == "reference" and d.fails and ref.source != "golden" and not again:
            self._corrupt_reference(ph, rec, spec, c, ref, d)
        return d

    def _corrupt_reference(self, ph: PhaseRecord, rec: RequestRecord, spec: RequestSpec,
                           c: Completion, ref: ReferenceRecord, d: Divergence) -> None:
        """The golden model says ``ref`` is the corrupt side of ``rec``'s divergence: the run it
        came from fails (check ``corrupt_reference``; on ``rec`` itself when that run is not in
        this manifest), the kept reference is replaced by the golden continuation (recorded with
        ``replaces``), and ``rec`` is judged again against it."""
        text = side_sentence(d, rec.prompt_key)
        mark_corrupt_reference(self.manifest, ref, rec, text)
        self.manifest.summary.add_corrupt_reference(
            {"reference_run": ref.request_id, "reference_source": ref.source,
             "prompt_key": ref.prompt_key, "prompt_hash": ref.prompt_hash,
             "max_tokens": ref.max_tokens, "method": "golden", "evidence": text,
             "revealed_by": rec.id, "judged_against": "golden continuation"})
        if self.references.get(spec.ref_key) is not ref:
            return
        try:
            gold = self.golden.generate(list(spec.prompt.ids), spec.max_tokens)
        except GoldenError as exc:
            self.manifest.summary.corrupt_references[-1]["judged_against"] = \
                f"the corrupt reference (golden continuation failed: {exc})"
            return
        new = ReferenceRecord(
            prompt_key=ref.prompt_key, prompt_hash=ref.prompt_hash, prompt_len=ref.prompt_len,
            max_tokens=ref.max_tokens, output_hash=token_hash(gold.ids),
            output_ids=list(gold.ids), margins=gold.margins(),
            top_ids=[[t for t, _ in top] for top in gold.top], source="golden",
            cache_state="n/a", temperature=ref.temperature, seed=ref.seed,
            replaces=f"{ref.request_id or ref.source}: {text}")
        self.references[spec.ref_key] = new
        self.manifest.references = [r for r in self.manifest.references if r is not ref] + [new]
        rejudge(rec, new, "the golden continuation (it replaced the corrupt reference "
                f"{ref.request_id or ref.source})")
        if rec.match is False:
            rec.first_divergence = first_divergence(new.output_ids, c.token_ids)
            self._judge(ph, rec, spec, c, new, again=True)


    def finish_judgement(self) -> None:
        """After the suite, on a half-precision engine with a golden model: measure the golden
        model's noise floor on this engine and decide what it may decide (issue 32).

        The floor: the golden gaps (:func:`pleharness.divergence.solo_gaps`) of the greedy,
        unparameterised solo reference runs (:func:`floor_run`), each prompt counted once,
        leaving out prompts whose own runs disagree (any two greedy, unparameterised runs of it
        with different outputs) and runs that failed; its quantile is the tolerance
        (:func:`pleharness.divergence.noise_floor`, recorded in
        ``run_options.golden_tolerance``). Where the floor lies within
        :func:`pleharness.divergence.golden_bound` the golden model is informative: every
        golden divergence is judged again against the tolerance and its side decided by the
        golden logprobs at that tolerance (a gap at or below the floor is never evidence of
        corruption). Above the bound it decides nothing: those divergences fall back to the
        engine margin (and the later steps of :func:`pleharness.divergence.settle`), their side
        to the majority. Float32 engines: nothing changes."""
        if self.golden is None or not self._half:
            return
        gaps: list[float] = []
        runs, left_out = self._floor_runs()
        try:
            for prompt, out in runs:
                gaps += solo_gaps(self.golden.force(prompt, out), out)
        except GoldenError as exc:
            self.manifest.run_options.golden_tolerance = {
                "source": f"not measured (golden model failed: {exc})", "informative": False,
                "tolerance_nats": self.rule.near_tie_nats}
            tol, informative = self.rule.near_tie_nats, False
        else:
            tol, info = noise_floor(gaps, self.rule.serving_dtype, self.rule.near_tie_nats)
            info["solo_runs_scored"] = len(runs)
            info.update(left_out)
            self.manifest.run_options.golden_tolerance = info
            informative = info["informative"]
        changed = set()
        for r in self.manifest.requests:
            d = r.divergence
            if d is None or d.golden_top is None or r.match is not False:
                continue
            before = (d.cls, d.fails)
            d.golden_informative = informative
            d.golden_tolerance_nats = tol if informative else None
            bound = self.manifest.run_options.golden_tolerance.get('informative_bound_nats')
            record_settlement(r, self.rule, lambda d: (
                f"; {d.cls} against the measured half-precision golden tolerance {tol:g} nats"
                if informative else
                f"; golden model uninformative on this engine (its floor is above {bound} "
                f"nats): {d.cls} by {d.decided_by}"))
            ev = d.side_evidence
            if informative and ev is not None:
                self._golden_side(d, ev, tol)
            if (d.cls, d.fails) != before or d.corrupt_side:
                changed.add(r.phase)
        refinish(self.manifest, changed)
        self.save()

    def _floor_runs(self) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
        """The (prompt, output) pairs of the golden noise floor and what was left out."""
        outputs: dict[tuple, set] = {}
        for r in self.manifest.requests:
            if r.error is None and r.output_hash and not r.temperature and not r.params:
                outputs.setdefault((r.prompt_hash, r.max_tokens), set()).add(r.output_hash)
        runs, seen = [], set()
        failed = repeated = disagree = 0
        for r, prompt, out in self._solo_runs:
            if r.failed_checks:
                failed += 1  # its corrupted tokens would open the gate for what they show
            elif r.prompt_hash in seen:
                repeated += 1
            elif len(outputs.get((r.prompt_hash, r.max_tokens), ())) > 1:
                disagree += 1
            else:
                seen.add(r.prompt_hash)
                runs.append((prompt, out))
        return runs, {"solo_runs_left_out": failed + repeated + disagree,
                      "left_out_failed": failed, "left_out_prompt_repeats": repeated,
                      "left_out_prompts_whose_runs_disagree": disagree}

    @staticmethod
    def _golden_side(d: Divergence, ev: SideEvidence, tol: float) -> None:
        """The side of ``d`` by the golden logprobs kept on ``ev`` at the measured tolerance
        ``tol`` (nats), once the golden model is known to be informative; the corrupt reference
        it names is acted on with the other sides, after the control run (:func:`pleharness.run.sides.judge_sides`)."""
        if ev.golden_logprob_reference is None or ev.golden_logprob_observed is None:
            return
        g = {"logprobs": {d.reference_token: ev.golden_logprob_reference,
                          d.observed_token: ev.golden_logprob_observed},
             "top": d.golden_top or []}
        side, why = golden_side(d.reference_token, d.observed_token, g, tol)
        ev.tolerance_nats, ev.detail = tol, why
        if side != "undecided":
            ev.method, d.corrupt_side = "golden", side


    def _golden_evidence(self, spec: RequestSpec, reference: Sequence[int],
                         observed: Sequence[int], pos: int) -> dict | None:
        """Teacher-forced golden logprobs at the first divergent position ``pos`` (the common
        prefix is prompt + observed[:pos]); None without a golden model. A golden model that
        fails is recorded once (``golden_error``) and not asked again. None for a sampled
        request (temperature > 0): its token was drawn, not the argmax, so a golden logprob
        cannot say which side is corrupt (a seeded choice's less likely draw once replaced its
        reference, issue 35 item 2)."""
        if self.golden is None or self.golden_error is not None or spec.temperature > 0:
            return None
        if shapes_logits(spec):  # the golden model knows no penalties or logit bias
            return None
        toks = [t for t in (reference[pos] if pos < len(reference) else None,
                            observed[pos] if pos < len(observed) else None) if t is not None]
        if len(toks) < 2:
            return None
        try:
            lps, top = self.golden.score(list(spec.prompt.ids), list(observed[:pos]), toks)
        except GoldenError as exc:
            self.golden_failed(str(exc))
            self.warn(f"golden classifier off: {self.golden_error}")
            return None
        return {"logprobs": lps, "top": top}


def floor_run(spec: RequestSpec) -> bool:
    """Whether a solo reference run of ``spec`` may enter the golden noise floor: greedy,
    compared, with no request parameter beyond the defaults (no stop strings, penalties or logit
    bias: the golden model knows none of them) and no sampling truncation. The sampled,
    mixed_params and stop_strings kinds' solo runs therefore never move the floor."""
    return (spec.temperature == 0 and spec.compare and not spec.params and spec.top_p is None
            and spec.top_k is None and spec.abandon_after_tokens is None)


def finish_phase(ph: PhaseRecord, records: Sequence[RequestRecord]) -> None:
    """Aggregate phase ``ph`` from its request ``records`` (matched, near ties, mismatches,
    errors, tokens, medians) and judge it: ``fail`` on any problem record or failed check (parity
    failures count as mismatches), with the reason; else ``pass``, with the warnings as reason."""
    recs = list(records)
    ph.matched = sum(1 for r in recs if r.match is True)
    ph.near_ties = sum(1 for r in recs if r.tolerated)
    ph.mismatched = sum(1 for r in recs if r.parity_failed)
    ph.errors = sum(1 for r in recs if r.request_error)
    ph.completion_tokens = sum(r.output_len for r in recs if r.error is None)
    ph.requests = len(recs)
    if ph.wall_s:
        ph.decode_tok_per_s = ph.completion_tokens / ph.wall_s
    ttfts = [r.ttft_s for r in recs if r.ttft_s is not None]
    lats = [r.latency_s for r in recs if r.latency_s is not None and r.error is None]
    ph.ttft_s_median = statistics.median(ttfts) if ttfts else None
    ph.latency_s_median = statistics.median(lats) if lats else None
    # parity failures are counted as mismatches, not as failed checks
    failed_checks = [c for r in recs for c in r.failed_checks if c.name != "parity"]
    failed_checks += [c for c in ph.checks if c.status == "fail"]
    if any(r.is_problem for r in recs) or failed_checks:
        ph.status = "fail"
        why = []
        if ph.mismatched:
            why.append(f"{ph.mismatched} hash mismatch(es)")
        if ph.errors:
            why.append(f"{ph.errors} request error(s)")
        if failed_checks:
            why.append(f"{len(failed_checks)} failed check(s)")
        ph.reason = ", ".join(why) or "failed request(s)"
    else:
        ph.status = "pass"
        aic = sum(1 for r in recs if r.tolerated
                  and r.divergence.attribution == "also_in_control")
        why = []
        if ph.near_ties - aic:
            why.append(f"{ph.near_ties - aic} near-tie divergence(s) (warning)")
        if aic:
            why.append(f"{aic} divergence(s) also in the control run (warning)")
        ph.reason = "; ".join(why)


# -- which side is wrong: shared by the golden path above and the majority pass ----------------

def _tok(t) -> str:
    return "its end" if t is None else f"token {t}"


def side_sentence(d: Divergence, prompt_key: str) -> str:
    """'the reference run r00003 of prompt chat-len4 is the outlier: golden logprob of its token
    60 is -3.46, of the load run r00017's token 120 is -0.06' (or the majority's vote counts)."""
    ev = d.side_evidence or SideEvidence()
    ref_run = (f"the reference run {ev.reference_run}" if ev.reference_run else
               f"the reference ({ev.reference_source or 'elsewhere'})")
    obs_run = f"the {ev.observed_role or 'load'} run {ev.observed_run}"
    if d.corrupt_side == "reference":
        who, other, own_tok, other_tok = ref_run, obs_run, d.reference_token, d.observed_token
        own_lp, other_lp = ev.golden_logprob_reference, ev.golden_logprob_observed
        own_votes, other_votes = ev.votes_reference, ev.votes_observed
    elif d.corrupt_side == "load":
        who, other, own_tok, other_tok = obs_run, ref_run, d.observed_token, d.reference_token
        own_lp, other_lp = ev.golden_logprob_observed, ev.golden_logprob_reference
        own_votes, other_votes = ev.votes_observed, ev.votes_reference
    else:
        return (f"undecided which side of prompt {prompt_key}'s divergence is wrong "
                f"({ev.detail or 'no evidence'})")
    head = f"{who} of prompt {prompt_key} is the outlier: "
    if ev.method == "golden" and own_lp is not None and other_lp is not None:
        return (head + f"golden logprob of its {_tok(own_tok)} is {own_lp:.2f}, of {other}'s "
                f"{_tok(other_tok)} is {other_lp:.2f}")
    if ev.method == "majority":
        return (head + f"{own_votes} of {ev.votes_total} runs of this prompt gave its output, "
                f"{other_votes} gave {other}'s")
    return head + ev.detail


def refinish(manifest: Manifest, phase_names: set[str]) -> None:
    """Recompute the aggregates and status of the named phases from their records, and say that
    records were changed in place (:meth:`Manifest.records_changed`)."""
    if not phase_names:
        return
    by_phase: dict[str, list[RequestRecord]] = {}
    for r in manifest.requests:
        by_phase.setdefault(r.phase, []).append(r)
    for ph in manifest.phases:
        if ph.name in phase_names:
            finish_phase(ph, by_phase.get(ph.name, []))
    manifest.records_changed()


def mark_corrupt_reference(manifest: Manifest, ref: ReferenceRecord, rec: RequestRecord,
                           text: str) -> None:
    """Fail the run that produced the corrupt reference ``ref`` (check ``corrupt_reference``,
    with ``text``); when that run is not in ``manifest`` (a reference from another engine or
    manifest), the check goes on ``rec``, the run that revealed it. Phases are re-finished."""
    target = next((r for r in manifest.requests if ref.request_id and r.id == ref.request_id),
                  None) or rec
    if not any(ch.name == "corrupt_reference" for ch in target.checks):
        target.checks.append(CheckResult(name="corrupt_reference", status="fail", detail=text))
    if target is not rec:
        refinish(manifest, {target.phase})


def rejudge(rec: RequestRecord, new: ReferenceRecord, what: str) -> None:
    """Judge ``rec`` again against ``new`` (the output that replaced a corrupt reference): equal
    means it matches (its divergence from the corrupt reference is kept as evidence, no longer
    failing); otherwise it stays a mismatch (the caller analyses it again)."""
    if rec.output_hash == new.output_hash:
        rec.match = True
        rec.reference_hash = new.output_hash
        d = rec.divergence
        if d is not None:
            d.fails = False
            if d.side_evidence is not None:
                d.side_evidence.judged_against = what
        for ch in rec.checks:
            if ch.name == "parity":
                ch.status = "pass"
                ch.detail = f"matches {what}; it differed from the corrupt reference: " + ch.detail
    else:
        rec.reference_hash = new.output_hash
