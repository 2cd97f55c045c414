"""Divergence analysis: is a token mismatch a numerical near tie or corruption?

When an output differs from its reference, the first divergent position p is located. Two
classifiers, the second preferred whenever it is available:

1. **Engine margin** (no golden model): the reference's top-1 minus top-2 logprob margin at p
   (nats; needs ``logprobs >= 2`` on the reference request). Below the threshold the reference was
   almost undecided there, so a batch-size dependent reduction order (different kernels, split-K,
   padding) can flip the argmax without any bug: ``near_tie``; otherwise ``hard``.
2. **Golden** (transformers in float32 on the same weights, :mod:`pleharness.golden`): teacher-force
   the common prefix (prompt + output[:p]) and read the golden logprobs of the reference's token and
   of the observed token at p. ``near_tie`` only when both tokens are in the golden top-k, each side's
   token is in the other side's top-k where the engine returned them, and the golden gap
   |lp(ref) - lp(obs)| is below the threshold. A token the golden model finds implausible is
   corruption (``hard``) whatever the engine's own margin said (a corrupted engine can also corrupt
   its logprobs).

Threshold (``--near-tie-nats`` overrides): derived from the serving dtype, because two correct
kernels can only disagree by the rounding of the logits they compute. With unit roundoff u (2^-8
for bfloat16's 8 significant bits, 2^-11 for float16, 2^-24 for float32; IEEE 754 / the bfloat16
format) and top logits of magnitude |z| <= 32 (typical of LLM heads), the logit gap between the top
two candidates can move by about 2u|z| from the final rounding alone, and by a few times that once
the rounding of the hidden states of every layer is added. The default allows four such steps:

- bfloat16: 0.5 nats (one bfloat16 step is 0.125 for logits in [16, 32); seen on an H200 with a
  random-weight bf16 model: batch-dependent flips at margins of 0.125 and 0.25 nats,
  docs/gpu-runs/README.md);
- float16: 0.0625 nats;
- float32: 0.01 nats (the rounding bound is ~1e-5; the floor leaves room for different reduction
  orders over long dot products, and for TF32 matmuls, whose 10-bit mantissa gives ~0.06 at most).
- unknown dtype: as bfloat16 (the most lenient common serving dtype), and the report says so.

Use ``--strict`` on batch-invariant engines (VLLM_BATCH_INVARIANT=1), where any divergence is a bug.
A near tie is still a failure when a reference-free check failed on that output (a near tie
followed by garbage is corruption that happened to start at a close call).
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .checks.logprob_sanity import ranked
from .manifest import Divergence

WINDOW = 4  # tokens shown on each side of the divergence
NEAR_TIE_BY_DTYPE = {"bfloat16": 0.5, "float16": 0.0625, "float32": 0.01}
DEFAULT_NEAR_TIE_NATS = NEAR_TIE_BY_DTYPE["bfloat16"]
_DTYPE_ALIASES = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32",
                  "fp32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
                  "torch.float32": "float32"}


def normalize_dtype(dtype: Any) -> str | None:
    """'bfloat16' | 'float16' | 'float32' for the usual spellings (torch.bfloat16, bf16, half ...),
    None for anything else (including vLLM's ``auto``)."""
    if dtype is None:
        return None
    d = str(dtype).strip().lower()
    d = _DTYPE_ALIASES.get(d, d)
    return d if d in NEAR_TIE_BY_DTYPE else None


def near_tie_threshold(dtype: Any, override: float | None = None) -> tuple[float, str]:
    """(threshold in nats, why) for a serving ``dtype``; ``override`` (``--near-tie-nats``) wins."""
    if override is not None:
        return float(override), "--near-tie-nats"
    d = normalize_dtype(dtype)
    if d is None:
        return DEFAULT_NEAR_TIE_NATS, (f"serving dtype {dtype!r} unknown: bfloat16 default"
                                       if dtype is not None else
                                       "serving dtype unknown: bfloat16 default")
    return NEAR_TIE_BY_DTYPE[d], f"serving dtype {d}"


def margins(top_logprobs: Sequence[dict] | None) -> list[float | None] | None:
    """Per position, top-1 minus top-2 logprob (nats); None where fewer than two real candidates.

    Sentinel entries (-9999.0, vLLM's rendering of -inf) and non-finite ones are no candidates: a
    margin taken from them would be huge and call any divergence "hard" (or, between two
    sentinels, 0 and call it a near tie). Candidates are ranked by value, never by their key
    order in the response (:func:`pleharness.checks.logprob_sanity.ranked`: JSON objects are
    unordered)."""

    if top_logprobs is None:
        return None
    out: list[float | None] = []
    for top in top_logprobs:
        vals = [v for _, v in ranked(top)]
        out.append(round(vals[0] - vals[1], 6) if len(vals) >= 2 else None)
    return out


def first_divergence(reference: Sequence[int], observed: Sequence[int]) -> int | None:
    """Index of the first position where the two ID lists differ, or None when equal.

    When one list is a strict prefix of the other, the index is the shorter length.
    """
    for i, (a, b) in enumerate(zip(reference, observed)):
        if a != b:
            return i
    if len(reference) != len(observed):
        return min(len(reference), len(observed))
    return None


def reconverges(reference: Sequence[int], observed: Sequence[int], pos: int, tail: int = 8) -> bool:
    """True when, after diverging at ``pos``, the last ``tail`` tokens of both outputs agree again
    (the same length and the same final tokens)."""
    if len(reference) != len(observed) or pos >= len(reference) - 1:
        return False
    n = min(tail, len(reference) - pos - 1)
    return list(reference[-n:]) == list(observed[-n:])


def top_ids(top: Mapping | Sequence | None) -> set[int] | None:
    """Token IDs of one position's top-k: from a {id: logprob} dict, an [(id, logprob)] list or
    a plain list of IDs."""
    if top is None:
        return None
    if isinstance(top, Mapping):
        return {int(k) for k in top}
    return {int(t[0]) if isinstance(t, (list, tuple)) else int(t) for t in top}


def analyse(reference: Sequence[int], observed: Sequence[int], pos: int,
            ref_margins: Sequence[float | None] | None, threshold: float,
            checks_failed: Sequence[str] = (), *, golden: Mapping[str, Any] | None = None,
            reference_top: Mapping | Sequence | None = None,
            observed_top: Mapping | Sequence | None = None,
            tolerance: float | None = None) -> Divergence:
    """Evidence and class of one divergence.

    Args:
        reference / observed: the two output ID lists; ``pos`` their first divergent position.
        ref_margins: the reference's per-position top-1 minus top-2 margins (nats) or None.
        threshold: near-tie threshold, nats (:func:`near_tie_threshold`).
        checks_failed: names of reference-free checks that failed on the observed output.
        golden: teacher-forced golden evidence at ``pos``: ``{"logprobs": {id: lp}, "top":
            [(id, lp), ...]}`` (:meth:`pleharness.golden.GoldenModel.score`), or None.
        reference_top / observed_top: each side's engine top-k at ``pos`` (IDs), when returned.
        tolerance: on a half-precision engine, the measured golden tolerance (nats,
            :func:`noise_floor`); with golden evidence, a gap below it is a near tie without the
            top-k membership tests (the engine's own solo flips, which it was measured on, need
            not be in the golden top-k). None: the float32 rule above.

    Returns a :class:`~pleharness.manifest.Divergence`: position, reference/observed windows
    (token IDs around ``pos``), the reference's margin at ``pos`` (nats or None), the golden
    evidence (gap in nats, top-k, membership; only with a golden model), reconverged,
    checks_failed, settled under ``Rule(threshold)`` alone (:func:`settle_under`: ``cls``,
    ``fails``, ``classified_by``); a run's passes settle it again under the run's rule."""
    lo = max(0, pos - WINDOW)
    ref_tok = reference[pos] if pos < len(reference) else None
    obs_tok = observed[pos] if pos < len(observed) else None
    margin = None
    if ref_margins is not None and pos < len(ref_margins):
        margin = ref_margins[pos]
    out: dict[str, Any] = {
        "position": pos,
        "reference_window": list(reference[lo: pos + WINDOW + 1]),
        "observed_window": list(observed[lo: pos + WINDOW + 1]),
        "window_start": lo,
        "reference_token": ref_tok,
        "observed_token": obs_tok,
        "margin_nats": margin,
        "threshold_nats": threshold,
    }
    ref_set, obs_set = top_ids(reference_top), top_ids(observed_top)
    # each side's token within the other side's engine top-k, where returned (settle reads them)
    if ref_set is not None and obs_tok is not None:
        out["observed_in_reference_top"] = obs_tok in ref_set
    if obs_set is not None and ref_tok is not None:
        out["reference_in_observed_top"] = ref_tok in obs_set
    if golden is not None and ref_tok is not None and obs_tok is not None:
        lps = {int(k): float(v) for k, v in golden["logprobs"].items()}
        gtop = top_ids(golden["top"]) or set()
        gap = abs(lps[ref_tok] - lps[obs_tok]) if ref_tok in lps and obs_tok in lps else None
        out.update({"classified_by": "golden",
                    "golden_gap_nats": None if gap is None else round(gap, 6),
                    "golden_top": [[int(a), round(float(b), 6)] for a, b in golden["top"]],
                    "reference_in_golden_top": ref_tok in gtop,
                    "observed_in_golden_top": obs_tok in gtop})
        if tolerance is not None:
            out["golden_tolerance_nats"] = tolerance
    out.update({"class": "unknown", "reconverged": reconverges(reference, observed, pos),
                "checks_failed": list(checks_failed), "fails": True})
    return settle_under(Divergence.model_validate(out), Rule(near_tie_nats=threshold))


# -- which side of a divergence is wrong (issue 23) -------------------------------------------------

HALF_PRECISION = ("bfloat16", "float16")
NOISE_QUANTILE = 0.95  # of the engine's own solo golden gaps: the half-precision tolerance
NOISE_MIN_SAMPLES = 5  # fewer differing positions than this: the dtype threshold stays
# The golden model is informative on an engine only while its noise floor (the quantile above)
# stays within this many near-tie thresholds (bfloat16: 4 x 0.5 = 2 nats). Why four: at a
# position where the engine's greedy token t differs from the golden top-1 g, the engine ranked
# t first, so the golden gap lp(g) - lp(t) is at most |err(g)| + |err(t)|, the two logits' errors.
# An engine that computes the golden model's function up to its dtype's rounding has errors of
# the order of the near-tie threshold (four rounding steps of the final logits); allowing each
# of the two errors twice that (the rounding of the hidden states accumulated through the
# layers) gives 4 x threshold. A floor above it means the engine computes a measurably different
# function (an expert-routing flip of a mixture-of-experts layer, another kernel's accumulation
# order compounding over a long generation: 10-15 nats measured on a bf16 MoE engine, issue 32),
# and then a golden gap cannot tell numerics from corruption.
GOLDEN_INFORMATIVE_FACTOR = 4.0


def golden_bound(threshold: float) -> float:
    """The largest golden noise floor (nats) at which the golden model still decides anything:
    :data:`GOLDEN_INFORMATIVE_FACTOR` x the near-tie ``threshold`` (nats; bfloat16 2.0, float16
    0.25, float32 0.04)."""
    return round(GOLDEN_INFORMATIVE_FACTOR * float(threshold), 6)


def golden_side(ref_tok: int | None, obs_tok: int | None, golden: Mapping[str, Any] | None,
                tolerance: float) -> tuple[str, str]:
    """(corrupt side, why) from the golden model's teacher-forced logprobs at the first divergent
    position: ``"reference"`` | ``"load"`` (the compared run) | ``"undecided"``.

    ``golden``: ``{"logprobs": {id: lp}, "top": [(id, lp), ...]}`` (nats) as for :func:`analyse`;
    ``tolerance``: nats (the near-tie threshold, or the measured half-precision tolerance). The
    side whose token the golden model finds implausible is corrupt: its logprob is below the
    other token's by at least ``tolerance``, and the other token is in the golden top-k (if
    neither is, the golden model vouches for neither side: undecided). Within ``tolerance`` both
    are plausible (a near tie): undecided. Source: shared/DESIGN.md, "A divergence has two sides"
    (an H200 run where the prompt's first run, the reference, was the corrupt one)."""
    if golden is None or ref_tok is None or obs_tok is None:
        return "undecided", "no golden logprobs for both tokens"
    lps = {int(k): float(v) for k, v in golden["logprobs"].items()}
    if ref_tok not in lps or obs_tok not in lps:
        return "undecided", "the golden model scored only one of the two tokens"
    lr, lo = lps[ref_tok], lps[obs_tok]
    gtop = top_ids(golden.get("top")) or set()
    why = (f"golden logprob of the reference's token {ref_tok} is {lr:.2f}, of the compared "
           f"run's token {obs_tok} is {lo:.2f}")
    in_top = {t: t in gtop for t in (ref_tok, obs_tok)}
    if abs(lr - lo) < tolerance:
        if in_top[ref_tok] != in_top[obs_tok]:  # the golden model vouches for one side only
            return ("reference" if in_top[obs_tok] else "load"), why + (
                f" (within {tolerance:g} nats, but only the "
                f"{'compared run' if in_top[obs_tok] else 'reference'}'s token is in the golden "
                "top-k)")
        return "undecided", why + f" (within {tolerance:g} nats: both plausible)"
    better = obs_tok if lo > lr else ref_tok
    if better not in gtop:
        return "undecided", why + " (neither token is in the golden top-k)"
    return ("reference" if lo > lr else "load"), why


def majority_side(ref_hash: str | None, obs_hash: str | None,
                  votes: Mapping[str, Sequence[str]],
                  crowded: Collection[str] = frozenset()) -> tuple[str, str]:
    """(corrupt side, why) by majority over every run of the same prompt, sampling and
    max_tokens: ``votes`` maps an output hash to the runs (IDs) that produced it. The side with
    fewer runs behind its output is the outlier when the other side has strictly more runs and
    at least two (two runs agreeing); otherwise undecided (one against one, or a tie).

    ``crowded``: the IDs of the runs under test that had other requests in flight (concurrency
    above 1). Crowded runs never outvote the single-request reference alone: where every run
    behind the compared output was crowded and every run behind the reference's output ran
    alone, the outputs split by load, which is what a defect of batched decoding looks like
    (each crowded run corrupted alike), so the vote is undecided (the golden model or a control
    run decides such a split; a control twin or a run alone behind the compared output makes
    it a vote again). Source: docs/references.md ("which side is wrong")."""
    nr, no = len(votes.get(ref_hash or "", ())), len(votes.get(obs_hash or "", ()))
    total = sum(len(v) for v in votes.values())
    why = (f"{nr} of {total} runs of this prompt gave the reference's output, {no} the compared "
           "run's")
    if no > nr and no >= 2:
        if (all(x in crowded for x in votes[obs_hash or ""])
                and not any(x in crowded for x in votes.get(ref_hash or "", ()))):
            return "undecided", why + (
                " (split by load: every run alone gave the reference's output, every run behind "
                "the other output had requests beside it; crowded runs corrupted alike would "
                "look the same: the golden model or a control run decides)")
        return "reference", why
    if nr > no and nr >= 2:
        return "load", why
    return "undecided", why + " (no majority)"


def is_half_precision(dtype: Any) -> bool:
    """Whether ``dtype`` (any spelling :func:`normalize_dtype` knows) is bfloat16 or float16."""
    return normalize_dtype(dtype) in HALF_PRECISION


def noise_floor(gaps: Sequence[float], dtype: Any, threshold: float,
                quantile: float = NOISE_QUANTILE,
                min_samples: int = NOISE_MIN_SAMPLES) -> tuple[float, dict[str, Any]]:
    """(tolerance in nats, how it was derived) for golden divergences on a half-precision engine.

    ``gaps``: the engine's noise floor, measured per run: every solo reference teacher-forced
    through the golden model, and at each position where the golden top-1 differs from the
    engine's token, lp_golden(top-1) - lp_golden(engine token) (nats, > 0). These are flips the
    engine makes with one request in flight and no load, i.e. what its dtype gives; a load run
    flipping a token by no more than them is the same numerics, not corruption. The tolerance is
    the ``quantile`` (nearest rank) of the gaps (a high quantile, not the maximum: one corrupted
    solo position must not open the gate for everything), never below ``threshold`` (the
    dtype-derived near-tie threshold). With fewer than ``min_samples`` gaps, or on a float32
    engine (where the rounding bound, not a measurement, applies), the tolerance is
    ``threshold``. Source: vLLM's own accuracy tests bound half-precision differences by a
    tolerance calibrated on measurements (tests/models/utils.py ``check_logprobs_close``: the
    other side's token must be in the top-k rather than equal), issue 24 item 3.
    """
    gaps = sorted(float(g) for g in gaps if g is not None and g > 0)
    bound = golden_bound(threshold)
    info: dict[str, Any] = {"dtype": normalize_dtype(dtype), "threshold_nats": threshold,
                            "samples": len(gaps), "quantile": quantile,
                            "max_gap_nats": round(gaps[-1], 6) if gaps else None,
                            "informative_bound_nats": bound, "informative": True}
    if not is_half_precision(dtype):
        info["source"] = "serving dtype is not half precision: the near-tie threshold applies"
        return threshold, {**info, "tolerance_nats": threshold}
    if len(gaps) < min_samples:
        info["source"] = (f"{len(gaps)} golden gap(s) in the solo references (fewer than "
                          f"{min_samples}): the dtype threshold applies")
        return threshold, {**info, "tolerance_nats": threshold}
    rank = max(0, min(len(gaps) - 1, int(-(-quantile * len(gaps) // 1)) - 1))
    q = gaps[rank]
    tol = max(threshold, round(q, 6))
    info["source"] = (f"{quantile:g} quantile of {len(gaps)} golden gaps where the engine's solo "
                      f"references differ from the golden top-1 ({q:.4f} nats)"
                      + ("" if q > threshold else "; below the dtype threshold, which applies"))
    if q > bound:
        info["informative"] = False
        info["source"] += (f"; above the bound {bound:g} nats ({GOLDEN_INFORMATIVE_FACTOR:g} x "
                           "the near-tie threshold): the golden model is uninformative on this "
                           "engine and decides nothing")
    return tol, {**info, "quantile_gap_nats": round(q, 6), "tolerance_nats": tol}


def solo_gaps(forced: Sequence[Sequence[Any]], tokens: Sequence[int]) -> list[float]:
    """The golden gaps of one teacher-forced output: ``forced[i] = (lp of tokens[i], golden top-1
    id, lp of top-1)`` (:meth:`pleharness.golden.GoldenModel.force`); a gap where the top-1 is not
    the engine's token."""
    return [float(f[2]) - float(f[0]) for f, t in zip(forced, tokens) if int(f[1]) != int(t)]


# -- the one rule: evidence in its order (issue 32, docs/references.md) ---------------------------

def _cross_ok(d: Divergence) -> bool:
    """Each side's token is in the other side's engine top-k, wherever the engine returned one."""
    return all(x for x in (d.observed_in_reference_top, d.reference_in_observed_top)
               if x is not None)


def _margin_class(d: Divergence, threshold: float) -> str:
    if d.margin_nats is None:
        return "unknown"
    return "near_tie" if d.margin_nats < threshold and _cross_ok(d) else "hard"


def _golden_class(d: Divergence, threshold: float) -> str:
    gap = d.golden_gap_nats
    both_in_top = bool(d.reference_in_golden_top and d.observed_in_golden_top)
    if d.golden_tolerance_nats is not None:  # half precision, measured and informative
        # an informative golden model tracks the engine within its floor: a numerical flip is
        # between tokens it ranks near the top; a token outside its top-k is not such a flip
        # (on a flat, random-weight model every gap is tiny and only membership tells)
        return ("near_tie" if gap is not None and gap < d.golden_tolerance_nats and both_in_top
                else "hard")
    return ("near_tie" if gap is not None and gap < threshold and both_in_top and _cross_ok(d)
            else "hard")


@dataclass(frozen=True)
class Rule:
    """How divergences are judged. ``near_tie_nats``: a divergence whose reference top-1/top-2
    gap (nats) is below this is a near tie (a warning), not a failure; ``strict``: every
    divergence fails; ``serving_dtype`` (bfloat16 | float16 | float32 | None): on half precision
    golden divergences are judged again against a tolerance measured in the run
    (:meth:`Judge.finish_judgement`); a golden "hard" the control reproduces is a near tie."""

    near_tie_nats: float = DEFAULT_NEAR_TIE_NATS
    strict: bool = False
    serving_dtype: str | None = None

    @classmethod
    def of_run(cls, run_options: Any) -> "Rule":
        """The rule a run judged by, from what its manifest recorded (``run_options``:
        ``near_tie_nats``, None for the bfloat16 default; ``strict``; ``serving_dtype``): the
        one builder for the passes after the suite and every replay of a run. Raises nothing."""
        nats = run_options.near_tie_nats
        return cls(DEFAULT_NEAR_TIE_NATS if nats is None else float(nats),
                   bool(run_options.strict), run_options.serving_dtype)


def settle(d: Divergence, *, strict: bool = False, seeded: bool = False,
           half_precision: bool = False) -> Divergence:
    """Decide ``d``'s class (``cls``), whether it fails (``fails``) and which evidence decided
    (``decided_by``) from the evidence recorded on it, in one stated order (docs/references.md);
    each later step may only amend what the earlier ones said, as written here:

    1. **engine margin**: the reference's top-1/top-2 margin at the position (nats) below
       ``threshold_nats`` (and each side's token in the other side's engine top-k where returned)
       is a near tie, else hard; no logprobs: ``unknown`` (fails).
    2. **golden model**, where it has evidence and is not measured uninformative
       (``golden_informative`` False: its noise floor on clean solo runs is above
       :func:`golden_bound`): a gap below the measured tolerance (``golden_tolerance_nats``, half
       precision) or, on float32, below the threshold with both tokens in the golden top-k, is
       a near tie; else hard. An uninformative golden model decides nothing: step 1 stands.
    3. **control**: a divergence the control run reproduces (``attribution`` also_in_control)
       is the engine's own numerics: a warning, never a failure by itself (on half precision a
       golden "hard" becomes a near tie, ``reclassified`` says why); so is a difference from
       the control's answer where the control's own solo runs disagree at or before the
       position (``control_split``, :mod:`pleharness.differential`): a near tie.
    4. **solo repeatability** (``solo_repeat``): both runs ran alone with the same parameters
       and the same cache state on an engine whose probe measured that it repeats solo greedy
       runs; they still differ: hard, whatever steps 1-3 said.
    5. ``strict`` (every divergence fails), ``seeded`` (a seeded sample has no near-tie
       excuse), and a failed reference-free check on the output (``checks_failed``) make it fail.

    The majority of three or more runs and the golden logprobs decide which *side* is wrong
    (:func:`golden_side`, :func:`majority_side`), never whether a divergence fails. Returns ``d``
    (changed in place)."""
    threshold = d.threshold_nats if d.threshold_nats is not None else DEFAULT_NEAR_TIE_NATS
    cls, by = _margin_class(d, threshold), "engine margin"
    if cls == "unknown":
        by = "none (no reference logprobs, no golden model)"
    has_golden = d.golden_top is not None or d.golden_gap_nats is not None
    if has_golden and d.golden_informative is not False:
        cls, by = _golden_class(d, threshold), "golden"
    d.classified_by = by if by != "engine margin" or not has_golden else \
        "engine margin (golden model uninformative)"
    fails = cls != "near_tie"
    if d.attribution == "also_in_control":
        if cls == "hard" and by == "golden" and half_precision:
            cls = "near_tie"
            d.reclassified = ("hard by the golden gap, but also in the control run on a "
                              "half-precision engine: the engine's own numerics")
        fails, by = False, "control"
    if d.control_split:
        cls, fails, by = "near_tie", False, d.control_split
    if d.solo_repeat:
        cls, fails, by = "hard", True, "solo repeatability"
    if strict or seeded or d.checks_failed:
        fails = True
        by += "; " + ", ".join(x for x, on in (("strict", strict), ("seeded sample", seeded),
                                              ("checks " + ", ".join(d.checks_failed),
                                               bool(d.checks_failed))) if on)
    d.cls, d.fails, d.decided_by = cls, fails, by
    return d


def settle_under(d: Divergence, rule: Rule, temperature: float = 0.0) -> Divergence:
    """:func:`settle`'s one caller (a test counts): ``d`` under the run's ``rule`` for a request
    at ``temperature`` (> 0: seeded). Returns ``d``, changed in place; raises nothing."""
    return settle(d, strict=rule.strict, seeded=temperature > 0,
                  half_precision=is_half_precision(rule.serving_dtype))


# -- one comparison under a run's rule (explain's replays, the judge) ------------------------------

def compare_outputs(reference: Sequence[int], observed: Sequence[int], rule: Rule,
                    reference_margins: Sequence[float | None] | None = None, *,
                    temperature: float = 0.0, checks_failed: Sequence[str] = (),
                    golden_at: Callable[[int], Mapping[str, Any] | None] | None = None,
                    golden_floor: Mapping[str, Any] | None = None) -> Divergence | None:
    """The verdict on one output against its reference, without a manifest: None when the two
    ID lists are equal, else the analysed and settled :class:`~pleharness.manifest.Divergence`
    (:func:`settle`: a hard divergence fails, any one under ``rule.strict``, any one of a
    seeded sample (``temperature`` > 0), which has no near-tie excuse). The same rule and the
    same evidence as a run's phases (:meth:`pleharness.run.judge.Judge._judge` and, on half
    precision, :meth:`~pleharness.run.judge.Judge.finish_judgement`), used by ``explain``:

    Args:
        reference_margins: the reference's per-position top-1 minus top-2 logprob margins
            (nats; :func:`margins`), None when it was run without logprobs (then, without
            golden evidence, a divergence is of class ``unknown``, failing).
        golden_at: ``f(position)`` -> the golden model's teacher-forced evidence at the first
            divergent position (``{"logprobs": {id: lp}, "top": [(id, lp), ...]}``, as
            :meth:`pleharness.golden.GoldenModel.score` gives it for the prompt plus
            ``observed[:position]``), or None where it has none; None: no golden model.
        golden_floor: the run's measured half-precision golden floor
            (``run_options.golden_tolerance``: ``informative``, ``tolerance_nats``); on a
            half-precision ``rule.serving_dtype`` the golden evidence is judged against it as
            the run judged its own (uninformative: the golden model decides nothing)."""
    pos = first_divergence(reference, observed)
    if pos is None:
        return None
    golden = golden_at(pos) if golden_at is not None else None
    d = analyse(reference, observed, pos, reference_margins, rule.near_tie_nats,
                checks_failed, golden=golden)
    if (golden is not None and golden_floor and "informative" in golden_floor
            and is_half_precision(rule.serving_dtype)):
        d.golden_informative = informative = bool(golden_floor["informative"])
        d.golden_tolerance_nats = float(golden_floor.get("tolerance_nats") or
                                        rule.near_tie_nats) if informative else None
    return settle_under(d, rule, temperature)
