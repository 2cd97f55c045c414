"""The statistics of the ``sampled`` kind (:mod:`.sampled`): the samples kept per side, solo and
under load (:func:`collector`, an on_outcome hook that also judges expected text by rate), and the
two-sample tests on them (:func:`distribution_rows`: a permutation test of the first tokens per
distribution prompt, a one-sided Fisher test of the expected-text matches), as rows of
``tables.sampled_distribution`` (:class:`DistributionRow`)."""
from __future__ import annotations

import re

from ..checks.degeneration import longest_run
from ..checks.sampled_degeneration import longest_punct_run
from ..manifest import CheckResult
from ..request import Outcome, RequestSpec
from ..twosample import fisher_less, permutation_test
from .base import TableRow


class DistributionRow(TableRow):
    """One two-sample test (``tables.sampled_distribution``)."""

    test: str  # first_tokens | expected_text
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
              solo_longest: dict[str, list[int]]):
    """``collect(side)``: an on_outcome hook for the ``solo`` or ``load`` side that keeps each
    answered sample's token IDs in ``samples`` (by (prompt key, max_tokens), then side), on the
    solo side the longest token and punctuation runs in ``solo_longest`` (by prompt key:
    [longest token run, longest punctuation run, samples]), and, for a prompt with an expected
    pattern (``expect``), an ``expected_text`` check counted in ``matches[side]`` ([matched,
    judged])."""
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
            if side == "solo":
                lr = solo_longest.setdefault(key, [0, 0, 0])
                lr[0] = max(lr[0], longest_run(list(c.token_ids), eos)[0])
                lr[1] = max(lr[1], longest_punct_run(c.text or "")[0])
                lr[2] += 1
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


def distribution_rows(p, dist: list[tuple[RequestSpec, str]], samples: dict,
                      matches: dict[str, list[int]]) -> list[DistributionRow]:
    """The rows of (b) and of the expected-text rate (``p``: the kind's SampledParams;
    ``dist``: the distribution prompts as (spec, why); ``samples`` and ``matches`` as
    :func:`collector` keeps them): one permutation test per distribution prompt and one
    one-sided Fisher test of the expected-text matches when both sides have some, each at
    ``alpha`` over the number of tests (Bonferroni)."""
    tests = len(dist) + (1 if matches["solo"][1] and matches["load"][1] else 0)
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
    if tests > len(dist):
        (ps, ns), (pl, nl) = matches["solo"], matches["load"]
        pv = fisher_less(ps, ns, pl, nl)
        rows.append(DistributionRow(
            test="expected_text", prompt_key="chat-shaped boundary lengths", prompt_len=None,
            why=f"/{p.expected_regex}/", solo=ns, load=nl, statistic=None, p_value=pv,
            threshold=thr, verdict="fail" if pv <= thr else "pass",
            detail=f"{pl}/{nl} samples under load match vs {ps}/{ns} alone: one-sided "
                   f"Fisher p = {pv:.2g} (threshold {thr:.2g})"))
    return rows
