"""The majority pass: which side of each divergence is wrong, after the suite and the control run
(:func:`judge_sides`), and the corrupt references it finds replaced by the majority output. The
per-request judge is :mod:`pleharness.run.judge`; this is the last step of a stress job's
judgement (references, suite, golden floor, control, sides)."""
from __future__ import annotations

from dataclasses import replace

from ..divergence import (DEFAULT_NEAR_TIE_NATS, Rule, analyse, first_divergence, majority_side,
                          settle_under)
from ..manifest import Divergence, Manifest, ReferenceRecord, RequestRecord, SideEvidence
from ..request import params_key
from .judge import mark_corrupt_reference, refinish, rejudge, side_sentence
from .settlement import parity_status


def _vote_key(r: RequestRecord | ReferenceRecord) -> tuple:
    """(prompt hash, max_tokens, temperature, seed, params): the runs that vote together, and
    (with the reference hash) the key of a corrupt reference: a greedy and a seeded request of
    one prompt can have equal references (a one-token answer often is the greedy token) and are
    still judged apart."""
    return (r.prompt_hash, r.max_tokens, r.temperature, r.seed, params_key(r.params))


def judge_sides(main: Manifest, control: Manifest | None = None) -> dict[str, int]:
    """The majority pass, after the suite (and the control run): every divergence whose side the
    golden model did not decide is judged by the majority over every run of the same prompt,
    sampling and max_tokens in the run: the cold and warm solo references, the load repeats, and
    the control run's twins (``control``, any concurrency) (:func:`majority_side`: crowded
    runs under test alone never outvote a reference that every run alone gave). A reference
    judged corrupt fails the run that produced it (check ``corrupt_reference``), is replaced in
    ``main.references`` by the majority output (source ``majority``, ``replaces`` says which
    run), and every run compared with it is judged again against that output. Only a failing
    divergence (hard or unknown, not a near tie or a control-explained one) makes its reference
    corrupt; a near tie still records which side is the outlier
    (``side_evidence.judged_against``; ``summary.corrupt_references`` lists each).

    Returns counts by corrupt side {"reference", "load", "undecided"} over all divergences."""
    votes: dict[tuple, dict[str, list[str]]] = {}
    for src, ms in (("", main), ("control:", control)):
        for r in (ms.requests if ms is not None else []):
            if r.error is None and r.output_hash is not None:
                votes.setdefault(_vote_key(r), {}).setdefault(r.output_hash, []).append(
                    src + r.id)
    run_ids = {r.id for r in main.requests}
    crowded = {r.id for r in main.requests if (r.concurrency or 1) > 1}
    corrupt: dict[tuple, tuple[str, list[RequestRecord]]] = {}
    changed: set[str] = set()
    for r in main.requests:
        d = r.divergence
        if d is not None and _golden_corrupt_pending(d):
            # half precision: the golden model named the reference once its floor was measured
            # informative; acted on here, after the control run, so a divergence the control
            # reproduces (which no longer fails) never makes a corrupt reference
            corrupt.setdefault(_vote_key(r) + (r.reference_hash,), (r.output_hash, []))[1] \
                .append(r)
            changed.add(r.phase)
            continue
        if d is None or d.corrupt_side in ("reference", "load"):
            continue
        ev = d.side_evidence or SideEvidence(observed_run=r.id)
        v = votes.get(_vote_key(r), {})
        if ev.reference_run is None or ev.reference_run not in run_ids:
            v = {**v, r.reference_hash or "": list(v.get(r.reference_hash or "", []))
                 + [f"reference ({ev.reference_source or 'elsewhere'})"]}
        if ev.reference_source == "golden":
            continue  # the golden model's own continuation: judged by the golden model only
        side, why = majority_side(r.reference_hash, r.output_hash, v, crowded)
        ev.method, ev.detail = "majority", why
        ev.votes_reference = len(v.get(r.reference_hash or "", ()))
        ev.votes_observed = len(v.get(r.output_hash or "", ()))
        ev.votes_total = sum(len(x) for x in v.values())
        ev.voters = {h[:12]: ids[:20] for h, ids in v.items()}
        d.side_evidence, d.corrupt_side = ev, side
        changed.add(r.phase)
        if side == "reference" and d.fails:  # a near tie is an outlier, not corruption
            corrupt.setdefault(_vote_key(r) + (r.reference_hash,), (r.output_hash, []))[1] \
                .append(r)
        if side == "load":
            for ch in r.checks:
                if ch.name == "parity" and "is the outlier" not in ch.detail:
                    ch.detail = side_sentence(d, r.prompt_key) + "; " + ch.detail
    _replace_corrupt(main, corrupt, votes, changed)
    refinish(main, changed)
    counts = {"reference": 0, "load": 0, "undecided": 0}
    for r in main.requests:
        if r.divergence is not None and r.divergence.corrupt_side in counts:
            counts[r.divergence.corrupt_side] += 1
    main.summary.corrupt_side = counts
    return counts


def _golden_corrupt_pending(d: Divergence) -> bool:
    """A failing divergence whose reference the golden model named corrupt after the suite
    (:meth:`Judge.finish_judgement`), not yet acted on (the float32 path acts at once and
    re-judges against the golden continuation)."""
    ev = d.side_evidence
    return (d.corrupt_side == "reference" and d.fails and ev is not None
            and ev.method == "golden" and ev.reference_source not in (None, "golden")
            and ev.judged_against is None and d.golden_informative is True)


def _replace_corrupt(main: Manifest, corrupt: dict[tuple, tuple[str, list[RequestRecord]]],
                     votes: dict[tuple, dict[str, list[str]]], changed: set[str]) -> None:
    """The majority pass's second half (:func:`judge_sides`): each corrupt reference (by
    vote key (:func:`_vote_key`) and bad hash, with the runs that revealed it) fails its run, is
    replaced by the majority output, and every run compared with it is judged again; the
    phases touched are added to ``changed``. A run judged again against the majority output is
    settled under the run's rule (:meth:`~pleharness.divergence.Rule.of_run`: ``--strict`` and
    a seeded sample fail any divergence) at its own threshold."""
    rule = Rule.of_run(main.run_options)
    ids_by_hash = {r.output_hash: r.output_ids for r in main.requests if r.output_ids}
    refs = {_vote_key(x) + (x.output_hash,): x for x in main.references}
    for key, (_, revealed) in corrupt.items():
        ph_, mt, bad_hash = key[0], key[1], key[-1]
        v = votes.get(key[:-1], {})
        others = [h for h in v if h != bad_hash]
        if not others:
            continue
        best = max(others, key=lambda h: len(v[h]))
        first = revealed[0]
        d = first.divergence
        text = side_sentence(d, first.prompt_key)
        ref = refs.get(key) or ReferenceRecord(
            prompt_key=first.prompt_key, prompt_hash=ph_, prompt_len=first.prompt_len,
            max_tokens=mt, output_hash=bad_hash or "", output_ids=[],
            request_id=d.side_evidence.reference_run, source=d.side_evidence.reference_source
            or "solo")
        mark_corrupt_reference(main, ref, first, text)
        what = (f"the majority output {best[:12]} ({len(v[best])} of "
                f"{sum(len(x) for x in v.values())} runs; it replaced the corrupt reference "
                f"{ref.request_id or ref.source})")
        best_ids = ids_by_hash.get(best)
        if best_ids is None:  # every record with it matched: the reference it matched has it
            best_ids = next((x.output_ids for x in main.references if x.output_hash == best), [])
        new = ReferenceRecord(
            prompt_key=first.prompt_key, prompt_hash=ph_, prompt_len=first.prompt_len,
            max_tokens=mt, output_hash=best, output_ids=list(best_ids), source="majority",
            cache_state="n/a", temperature=first.temperature, seed=first.seed,
            params=first.params,
            replaces=f"{ref.request_id or ref.source}: {text}")
        if ref in main.references:
            main.references = [x for x in main.references if x is not ref] + [new]
        main.summary.add_corrupt_reference(
            {"reference_run": ref.request_id, "reference_source": ref.source,
             "prompt_key": first.prompt_key, "prompt_hash": ph_, "max_tokens": mt,
             "method": (d.side_evidence.method if d.side_evidence else None) or "majority",
             "evidence": text, "revealed_by": first.id, "judged_against": what})
        for r in main.requests:
            if _vote_key(r) + (r.reference_hash,) != key \
                    or r.match is None or r.divergence is None:
                continue
            rejudge(r, new, what)
            if r.match is False and best_ids and r.output_ids:
                pos = first_divergence(best_ids, r.output_ids)
                r.first_divergence = pos
                threshold = r.divergence.threshold_nats or DEFAULT_NEAR_TIE_NATS
                nd = analyse(best_ids, r.output_ids, pos, _margins_at(ref, best_ids, pos),
                             threshold, r.divergence.checks_failed)
                # the run's rule at this threshold: --strict and a seeded sample fail any one
                settle_under(nd, replace(rule, near_tie_nats=threshold), r.temperature)
                nd.corrupt_side = "load"
                nd.side_evidence = SideEvidence(
                    method="majority", observed_run=r.id, reference_source="majority",
                    judged_against=what, detail="differs from the majority output too")
                r.divergence = nd
                for ch in r.checks:
                    if ch.name == "parity":
                        ch.status = parity_status(nd)
                        ch.detail = (f"differs from {what} at position {pos} too ({nd.cls}); "
                                     + ch.detail)
            changed.add(r.phase)


def _margins_at(ref: ReferenceRecord, best_ids: list[int], pos: int | None):
    """The margins to judge a run against the majority output ``best_ids`` at ``pos``: the
    replaced reference's own, where it agrees with the majority output on every token before
    ``pos`` (then its margin at ``pos`` is that of the very same prefix), else None. A run's
    divergence from the majority is so judged by the same margin rule and threshold as any
    other, and being the outlier of many runs never makes a flip inside the threshold hard
    (GPU, issue 47: a C4 flip at 0.25 nats was called hard as the outlier of 24 runs)."""
    if pos is None or not ref.margins or not ref.output_ids:
        return None
    agree = first_divergence(ref.output_ids, best_ids)
    return ref.margins if agree is None or agree >= pos else None
