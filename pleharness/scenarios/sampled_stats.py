"""The statistics of the ``sampled`` kind (:mod:`.sampled`): the samples kept per side, solo and
under load (:func:`collector`, an on_outcome hook that also judges expected text by rate), and the
two-sample tests on them (:func:`distribution_rows`: a permutation test of the first tokens per
distribution prompt, a one-sided Fisher test of the expected-text matches, the stratified exact
test of the degeneration rate), as rows of ``tables.sampled_distribution``
(:class:`DistributionRow`)."""
from __future__ import annotations

import re

from ..checks.sampled_degeneration import NAME as SAMPLED_DEGENERATION
from ..checks.sampled_degeneration import pattern
from ..manifest import CheckResult
from ..request import Outcome, RequestSpec
from ..twosample import fisher_less, permutation_test, stratified_more
from .base import TableRow


class DistributionRow(TableRow):
    """One two-sample test (``tables.sampled_distribution``)."""

    test: str  # first_tokens | expected_text | degeneration
    prompt_key: str
    prompt_len: int | None
    why: str  # why this prompt
    solo: int  # samples alone
    load: int  # samples at C >= 2
    statistic: float | None
    p_value: float
    threshold: float  # alpha / number of tests (Bonferroni)
    verdict: str  # pass | fail
    detail: str


def collector(expect: dict[str, str], eos, samples: dict, matches: dict[str, list[int]],
              degenerate: dict):
    """``collect(side)``: an on_outcome hook for the ``solo`` or ``load`` side that keeps each
    answered sample's token IDs in ``samples`` (by (prompt key, max_tokens), then side); for a
    request judged by ``sampled_degeneration``, its pattern (:func:`pattern`) counted in
    ``degenerate`` (by (prompt key, max_tokens), then side: [samples, with the pattern], and
    under ``"runs"`` the (run ID, pattern) of each load sample with it); and, for a prompt with
    an expected pattern (``expect``), an ``expected_text`` check counted in ``matches[side]``
    ([matched, judged])."""
    def collect(side: str):
        def on_outcome(o: Outcome) -> None:
            c = o.completion
            if c.error is not None:
                return
            key = o.spec.prompt.key
            # the test compares the distribution prompts' own samples (a boundary request of
            # the same prompt, e.g. L = n*C + q, asks for another max_tokens)
            samples.setdefault((key, o.spec.max_tokens), {"solo": [], "load": []})[
                side].append(list(c.token_ids))
            prm = o.spec.checks.get(SAMPLED_DEGENERATION)
            if prm is not None:
                found = pattern(c.token_ids, c.text or "", eos, int(prm.get("max_run", 8)),
                                int(prm.get("max_punct_run", 8)))
                row = degenerate.setdefault((key, o.spec.max_tokens),
                                            {"solo": [0, 0], "load": [0, 0], "runs": []})
                row[side][0] += 1
                row[side][1] += bool(found)
                if found and side == "load":
                    row["runs"].append((o.record.id, "; ".join(found)))
            rx = expect.get(key)
            if rx is not None:
                ok = re.match(rx, c.text or "") is not None
                matches[side][0] += ok
                matches[side][1] += 1
                o.record.checks.append(CheckResult(
                    name="expected_text", status="pass" if ok else "note",
                    detail="" if ok else f"sample {c.text[:40]!r} does not match /{rx}/ "
                    "(a sample: judged by rate, phase check sampled_expected_text)"))
        return on_outcome
    return collect


def _strata(degenerate: dict) -> list[tuple[tuple, dict]]:
    return [(k, v) for k, v in degenerate.items() if v["solo"][0] and v["load"][0]]


def degeneration_row(degenerate: dict, thr: float) -> DistributionRow | None:
    """The degeneration rate's row (``degenerate`` as :func:`collector` keeps it; ``thr``: the
    per-test threshold): the load samples show a pattern more often than the solo samples of
    the same prompts, by :func:`pleharness.twosample.stratified_more` (one stratum per prompt
    and max_tokens with samples on both sides); the detail names the load runs with a pattern.
    None when no prompt has samples on both sides (nothing to judge by)."""
    strata = _strata(degenerate)
    if not strata:
        return None
    rows = [(v["solo"][1], v["solo"][0], v["load"][1], v["load"][0]) for _, v in strata]
    pv = stratified_more(rows)
    es, ns, el, nl = (sum(r[i] for r in rows) for i in range(4))
    runs = [x for _, v in strata for x in v["runs"]]
    worst = max(strata, key=lambda kv: kv[1]["load"][1] - kv[1]["solo"][1])
    detail = (f"{el}/{nl} samples under load show a run of one token or punctuation vs {es}/{ns} "
              f"alone, over {len(strata)} prompt(s): exact stratified p = {pv:.2g} (threshold "
              f"{thr:.2g})")
    if runs:
        w = worst[1]
        detail += (f"; most: prompt {worst[0][0]} ({w['load'][1]}/{w['load'][0]} under load, "
                   f"{w['solo'][1]}/{w['solo'][0]} alone); runs "
                   + ", ".join(f"{i} ({why})" for i, why in runs[:3])
                   + (f" and {len(runs) - 3} more" if len(runs) > 3 else ""))
    return DistributionRow(
        test="degeneration", prompt_key=f"{len(strata)} sampled prompt(s)", prompt_len=None,
        why="a run of one token or of one punctuation character", solo=ns, load=nl,
        statistic=float(el), p_value=pv, threshold=thr,
        verdict="fail" if pv <= thr else "pass", detail=detail)


def distribution_rows(p, dist: list[tuple[RequestSpec, str]], samples: dict,
                      matches: dict[str, list[int]],
                      degenerate: dict | None = None) -> list[DistributionRow]:
    """The rows of (b), of the expected-text rate and of the degeneration rate (``p``: the
    kind's SampledParams; ``dist``: the distribution prompts as (spec, why); ``samples``,
    ``matches`` and ``degenerate`` as :func:`collector` keeps them): one permutation test per
    distribution prompt, one one-sided Fisher test of the expected-text matches when both sides
    have some, and :func:`degeneration_row` when a prompt has samples on both sides, each at
    ``alpha`` over the number of tests (Bonferroni)."""
    degenerate = degenerate or {}
    tests = (len(dist) + (1 if matches["solo"][1] and matches["load"][1] else 0)
             + (1 if _strata(degenerate) else 0))
    thr = p.alpha / max(1, tests)
    rows = []
    for s, why in dist:
        sm = samples.get((s.prompt.key, s.max_tokens), {"solo": [], "load": []})
        if not sm["solo"] or not sm["load"]:
            rows.append(DistributionRow(
                test="first_tokens", prompt_key=s.prompt.key, prompt_len=len(s.prompt),
                why=why, solo=len(sm["solo"]), load=len(sm["load"]), statistic=None,
                p_value=1.0, threshold=thr, verdict="fail",
                detail="no samples on one side (requests failed)"))
            continue
        r = permutation_test(sm["solo"], sm["load"], p.positions, p.permutations,
                             rng_seed=p.seed)
        sh = r.shift or {}
        detail = (f"first {p.positions} tokens of {r.n_load} samples under load vs "
                  f"{r.n_solo} alone: largest standardised chi-square {r.statistic:.2f}, permutation p = "
                  f"{r.p_value:.2g} (threshold {thr:.2g})")
        if sh:
            detail += (f"; most shifted: token {sh['token']} at position {sh['position']} "
                       f"({sh['solo_count']} alone, {sh['load_count']} under load)")
        rows.append(DistributionRow(
            test="first_tokens", prompt_key=s.prompt.key, prompt_len=len(s.prompt), why=why,
            solo=r.n_solo, load=r.n_load, statistic=r.statistic, p_value=r.p_value,
            threshold=thr, verdict="fail" if r.p_value <= thr else "pass", detail=detail))
    if matches["solo"][1] and matches["load"][1]:
        (ps, ns), (pl, nl) = matches["solo"], matches["load"]
        pv = fisher_less(ps, ns, pl, nl)
        rows.append(DistributionRow(
            test="expected_text", prompt_key="chat-shaped boundary lengths", prompt_len=None,
            why=f"/{p.expected_regex}/", solo=ns, load=nl, statistic=None, p_value=pv,
            threshold=thr, verdict="fail" if pv <= thr else "pass",
            detail=f"{pl}/{nl} samples under load match vs {ps}/{ns} alone: one-sided "
                   f"Fisher p = {pv:.2g} (threshold {thr:.2g})"))
    row = degeneration_row(degenerate, thr)
    if row is not None:
        rows.append(row)
    return rows
