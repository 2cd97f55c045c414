"""Differential evidence (issue 47 item 1): the configuration under test and its control answer
the same solo greedy request; do they give the same tokens?

Every other comparison of a run is a self-comparison: each output against the same engine's solo
reference, the cold run against the warm one, repeats against each other. A defect that corrupts
every run of a prompt alike (the same wrong output cold, warm and repeated) passes all of them.
On a GPU (H100, vLLM 0.26, bf16 mixture-of-experts, a real CUDA-graph defect) a 3-token prompt
gave one output on all three of its runs under test and another on all three control runs, which
is also what the fixed engine gives; of the 14 solo greedy requests both engines ran, it was the
only one that differed, and on the fixed engine 0 of 74 differed from its control
(shared/DESIGN.md, "The control's answers are evidence").

**Which requests** (:func:`solo_answers`): every run that ran alone (a C1 phase, reference
phases included), greedy, one choice, no sampling truncation, sent to /v1/completions, that
answered; grouped by (prompt, max_tokens, request parameters). A key both runs have is compared.

**The rule** (:func:`compare_answers`), for each answer under test that no control run gave:

1. its first divergent position from the control's answer (the control run's reference for that
   request, else the answer most control runs gave) is located, and classified by the one rule
   (:func:`pleharness.divergence.analyse` then :func:`~pleharness.divergence.settle`): the
   control answer's top-1/top-2 margin there against the run's near-tie threshold, which the
   measured numerics envelope has set (:mod:`pleharness.envelope`), raised to the
   configurations' own difference: ``CROSS_FACTOR`` x the cross-configuration envelope
   (how far the two configurations' top-1/top-2 margins differ at the positions of the
   requests they answered alike, :func:`margin_drifts`), taken at the positions whose control
   margin is at most ``CROSS_SPAN`` x the split's (:func:`envelope_at`; over all positions
   when fewer than ``CROSS_MIN_POSITIONS`` qualify: :func:`cross_envelope`), and twice the
   drift of this request's
   logprobs between the two configurations before that position (:func:`_drift`). The
   threshold is what the control's answers can decide: a control that computes another function
   (without CUDA graphs and torch.compile, a bf16 mixture-of-experts engine's answers split from
   the compiled engine's at control margins up to 5.6 nats: GPU runs u and v) vouches for its
   answer only beyond the margins its own difference moves. The margin is the control's, which the defect under test cannot touch, so
   no top-candidate membership is asked (with the default two logprobs per position a
   three-way near tie would fail it: GPU run u);
2. where the control's own solo runs of that request disagree at or before that position, the
   control cannot vouch for one answer there: the difference is the engine's numerics (a
   warning, ``decided_by`` says so), whatever the margin;
3. ``--strict`` makes every difference fail.

A hard one fails the run: check ``control_answer`` on the earliest run under test that gave the
answer ("the configuration under test answers X (runs ...), the control answers Y (control runs
...)"), the divergence kept on that record (``differential``), in the divergence tables, the
headline and the causes, and ``explain`` gets a case for it.

**With the attribution** (:mod:`pleharness.attribution`): ``also_in_control`` excuses a load
divergence because a control twin diverged too; it compares divergences, so it never excuses a
differential finding, which compares answers. Both are reported; a key can have both (a load
run that differs from a wrong solo answer and matches the control's).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from .divergence import Rule, analyse, first_divergence, settle_under
from .manifest import CheckResult, Manifest, ReferenceRecord, RequestRecord
from .request import params_key
from .run.judge import refinish

NAME = "control_answer"


@dataclass
class Answers:
    """The solo greedy runs of one request in one manifest: output hash -> run IDs (in run
    order), the records, and the manifest's reference for the request (None: none kept)."""

    runs: dict[str, list[str]] = field(default_factory=dict)
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    reference: ReferenceRecord | None = None

    def add(self, r: RequestRecord) -> None:
        self.runs.setdefault(r.output_hash, []).append(r.id)
        self.records.setdefault(r.output_hash, []).append(r)

    def main(self) -> str:
        """The answer this manifest stands for: its reference's, else the most runs'."""
        if self.reference is not None and self.reference.output_hash in self.runs:
            return self.reference.output_hash
        return max(self.runs, key=lambda h: len(self.runs[h]))


def _key(r: RequestRecord | ReferenceRecord) -> tuple:
    return (r.prompt_hash, r.max_tokens, params_key(r.params))


def solo_answers(m: Manifest) -> dict[tuple, Answers]:
    """Every solo greedy request of ``m`` (module docstring) by (prompt hash, max_tokens,
    params key), with its runs and the reference kept for it."""
    roles = {p.name: p.role for p in m.phases}
    out: dict[tuple, Answers] = {}
    for r in m.requests:
        if (r.concurrency != 1 or r.error is not None or not r.output_hash or r.temperature
                or (r.n or 1) > 1 or r.top_p is not None or r.top_k is not None
                or r.api == "chat"):
            continue
        if r.match is None and roles.get(r.phase) != "reference":
            continue  # not compared: an edge probe, an abandoned stream
        out.setdefault(_key(r), Answers()).add(r)
    for ref in m.references:
        if ref.source == "solo" and not ref.temperature and _key(ref) in out:
            out[_key(ref)].reference = ref
    return out


def _ids(m: Manifest) -> dict[str, list[int]]:
    """Output hash -> token IDs, from the references and the records that kept theirs."""
    ids = {r.output_hash: list(r.output_ids) for r in m.references if r.output_ids}
    for r in m.requests:
        if r.output_ids and r.output_hash and r.output_hash not in ids:
            ids[r.output_hash] = list(r.output_ids)
    return ids


def _at(rows: list[list[int]] | None, pos: int):
    return rows[pos] if rows is not None and pos < len(rows) else None


DRIFT_FACTOR = 2.0  # the margin is the difference of two logprobs, each drifted by up to this
# The cross-configuration envelope is measured on the requests the two configurations answered
# alike, which are the ones the difference did not flip: the largest move there understates the
# moves where answers split (a request with a large move at a small margin flipped and left the
# sample). Doubling it is that allowance, the same as for a logprob drift; what a flip needs is
# a margin move at least as large as the control's margin at the split.
CROSS_FACTOR = 2.0


def margin_drifts(mine: dict[tuple, Answers], theirs: dict[tuple, Answers]
                  ) -> tuple[list[tuple[float, float]], int]:
    """([(control margin, |margin under test - control margin|), ...] in nats, requests) at
    every output position of the requests both configurations answered alike (same output
    tokens; both solo references with margins: ``--logprobs`` >= 2). Evidence the defect under
    test cannot widen by changing an answer: a request whose answer it changed is not in it (a
    defect that moves margins without changing any token of a request would:
    docs/references.md, "Which control")."""
    out: list[tuple[float, float]] = []
    reqs = 0
    for key, under in mine.items():
        ctl = theirs.get(key)
        tr, cr = under.reference, ctl.reference if ctl is not None else None
        if tr is None or cr is None or tr.output_hash != cr.output_hash \
                or not tr.margins or not cr.margins:
            continue
        got = [(float(b), abs(float(a) - float(b))) for a, b in zip(tr.margins, cr.margins)
               if a is not None and b is not None]
        out += got
        reqs += bool(got)
    return out, reqs


def cross_envelope(mine: dict[tuple, Answers], theirs: dict[tuple, Answers]
                   ) -> tuple[float | None, int, int]:
    """(largest |difference| in nats, positions, requests) of the two configurations'
    top-1/top-2 margins over every position of :func:`margin_drifts`; None when no such
    position."""
    drifts, reqs = margin_drifts(mine, theirs)
    top = max((d for _, d in drifts), default=None)
    return (None if top is None else round(top, 6)), len(drifts), reqs


# A split at control margin m is judged by the margin differences at positions of comparable
# margin: at most CROSS_SPAN x m. GPU runs w (2026-12-07, bf16 MoE, PIECEWISE control, default
# suite): margins moved by up to 4.25 nats, but only at positions whose margin was 8-16 nats (a
# move that can flip no token there); below 8 nats by at most 0.875 over ~1,700 positions a run.
# With fewer than CROSS_MIN_POSITIONS such positions the largest difference overall decides.
CROSS_SPAN = 2.0
CROSS_MIN_POSITIONS = 20
BANDS = (1.0, 2.0, 4.0, 8.0, 16.0)  # the summary's margin bands (nats)


def envelope_at(drifts: list[tuple[float, float]], margin: float | None
                ) -> tuple[float, int] | None:
    """(largest margin difference, positions) among ``drifts`` (:func:`margin_drifts`) whose
    control margin is at most ``CROSS_SPAN`` x ``margin`` (nats); None when ``margin`` is None
    or fewer than ``CROSS_MIN_POSITIONS`` positions qualify (then the overall envelope
    decides)."""
    if margin is None:
        return None
    window = [d for m, d in drifts if m <= CROSS_SPAN * margin]
    if len(window) < CROSS_MIN_POSITIONS:
        return None
    return round(max(window), 6), len(window)


def envelope_bands(drifts: list[tuple[float, float]]) -> list[dict[str, float]]:
    """For each band bound b of ``BANDS``: the largest margin difference at positions whose
    control margin is at most b (``margin_up_to``, ``drift_nats``, ``positions``); bands
    without a position are left out."""
    out = []
    for b in BANDS:
        w = [d for m, d in drifts if m <= b]
        if w:
            out.append({"margin_up_to": b, "drift_nats": round(max(w), 6), "positions": len(w)})
    return out


def _drift(cref: ReferenceRecord | None, tref: ReferenceRecord | None, pos: int) -> float | None:
    """How far the two configurations' solo references of one request already disagree on the
    same tokens' logprobs before ``pos`` (the largest |difference| at the positions where both
    emitted the same tokens so far, nats), or None without both logprob lists. A control that
    computes a measurably different function there (GPU run u: without CUDA graphs and
    torch.compile, a bf16 mixture-of-experts engine's answers drifted by nats before they
    split) vouches for its answer only beyond that drift; a defect that flips a token without
    moving the logprobs before it gains nothing from it."""
    if cref is None or tref is None or not cref.token_logprobs or not tref.token_logprobs:
        return None
    out = 0.0
    for i, (a, b) in enumerate(zip(cref.output_ids, tref.output_ids)):
        if i >= pos or a != b or i >= min(len(cref.token_logprobs), len(tref.token_logprobs)):
            break
        x, y = cref.token_logprobs[i], tref.token_logprobs[i]
        if x is not None and y is not None:
            out = max(out, abs(float(x) - float(y)))
    return out


def _runs(ids: Iterable[str], prefix: str = "") -> str:
    ids = list(ids)
    shown = ", ".join(prefix + i for i in ids[:4]) + (f" and {len(ids) - 4} more"
                                                      if len(ids) > 4 else "")
    return f"run{'s' if len(ids) > 1 else ''} {shown}"


def compare_answers(main: Manifest, control: Manifest) -> dict[str, Any]:
    """Compare the solo greedy answers of ``main`` and its ``control`` run (module docstring);
    every difference is recorded on the earliest run under test that gave it (``differential``,
    check ``control_answer``: fail when hard, warn otherwise), the phases touched finished
    again, and the counts returned and kept in ``summary.differential``: requests
    ``compared``, ``differ`` (answers under test no control run gave), ``hard``,
    ``control_repeats_disagree`` (differences the control's own disagreement excused),
    ``without_tokens`` (a difference whose tokens neither run kept: not classified), and the
    cross-configuration envelope (:func:`cross_envelope`): ``envelope_nats`` (None: not
    measured), ``envelope_positions``, ``envelope_requests``, and ``threshold_nats``, the
    smallest control margin a difference must reach to be hard (before a request's drift)."""
    ro = main.run_options
    rule = Rule.of_run(ro)
    tie = rule.near_tie_nats
    mine, theirs = solo_answers(main), solo_answers(control)
    ids_main, ids_ctl = _ids(main), _ids(control)
    drifts, env_reqs = margin_drifts(mine, theirs)
    env = round(max(d for _, d in drifts), 6) if drifts else None
    explicit = ro.near_tie_source == "--near-tie-nats"
    run_tie = tie
    if env is not None and not explicit:
        tie = max(tie, round(CROSS_FACTOR * env, 6))
    counts = {"compared": 0, "differ": 0, "hard": 0, "control_repeats_disagree": 0,
              "without_tokens": 0, "envelope_nats": env, "envelope_positions": len(drifts),
              "envelope_requests": env_reqs, "threshold_nats": tie,
              "envelope_by_margin": envelope_bands(drifts) if not explicit else []}

    def threshold(margin: float | None) -> float:
        """The run's threshold for a split at control margin ``margin``: 2 x the envelope at
        the positions of comparable margin (:func:`envelope_at`), else 2 x the overall one."""
        near = None if explicit or env is None else envelope_at(drifts, margin)
        return tie if near is None else max(run_tie, round(CROSS_FACTOR * near[0], 6))

    changed: set[str] = set()
    for key, under in mine.items():
        ctl = theirs.get(key)
        if ctl is None:
            continue
        counts["compared"] += 1
        ans = ctl.main()
        for h in under.runs:
            if h in ctl.runs:
                continue
            counts["differ"] += 1
            rec = under.records[h][0]
            c_ids, t_ids = ids_ctl.get(ans), ids_main.get(h)
            if c_ids is None or t_ids is None:
                counts["without_tokens"] += 1
                continue
            cref = ctl.reference if ctl.reference is not None and \
                ctl.reference.output_hash == ans else None
            d = _classify(c_ids, t_ids, ctl, ans, cref, under, ids_ctl, threshold, rule)
            counts["hard"] += d.fails
            counts["control_repeats_disagree"] += d.control_split is not None
            rec.differential = d
            rec.control_answer = {"run": "control:" + ctl.runs[ans][0], "output_ids": c_ids,
                                  "margins": cref.margins if cref else None,
                                  "threshold_nats": d.threshold_nats}
            rec.checks = [c for c in rec.checks if c.name != NAME]
            rec.checks.append(CheckResult(
                name=NAME, status="fail" if d.fails else "warn",
                detail=(f"the configuration under test answers {h[:12]} "
                        f"({_runs(under.runs[h])}), the control answers {ans[:12]} "
                        f"({_runs(ctl.runs[ans], 'control:')}): {d.cls} at token position "
                        f"{d.position} (expected {d.reference_token}, got {d.observed_token}; "
                        f"control margin "
                        + ("n/a" if d.margin_nats is None else f"{d.margin_nats:.4f} nats")
                        + f", threshold {d.threshold_nats:g} nats; by {d.decided_by})")))
            changed.add(rec.phase)
    main.summary.differential = counts
    refinish(main, changed)
    return counts


def _classify(c_ids: list[int], t_ids: list[int], ctl: Answers, ans: str,
              cref: ReferenceRecord | None, under: Answers, ids_ctl: dict[str, list[int]],
              tie_at: Callable[[float | None], float], rule: Rule):
    """The divergence of an answer under test (``t_ids``) from the control's answer ``ans``
    (``cref``: the control's reference when it gave ``ans``), at the threshold ``tie_at`` gives
    for the control's margin at the split (rule of the module docstring), with the control's
    own disagreement as evidence (``control_split``), settled under the run's ``rule`` at that
    threshold (:func:`~pleharness.divergence.settle_under`)."""
    pos = first_divergence(c_ids, t_ids)
    tie = tie_at(_at(cref.margins if cref else None, pos))
    drift = _drift(cref, under.reference, pos)
    threshold = max(tie, round(DRIFT_FACTOR * drift, 6)) if drift is not None else tie
    d = analyse(c_ids, t_ids, pos, cref.margins if cref else None, threshold)
    own = [first_divergence(c_ids, ids_ctl[o]) for o in ctl.runs
           if o != ans and o in ids_ctl]
    own = [q for q in own if q is not None]
    if own and min(own) <= pos:
        d.control_split = (f"the control's own solo runs disagree at position {min(own)} "
                           f"({len(ctl.runs)} answers): the engine's numerics")
    settle_under(d, replace(rule, near_tie_nats=threshold))
    if not d.control_split:
        d.decided_by = f"differential: {d.decided_by}"
    return d


def threshold_text(diff: dict[str, Any]) -> str:
    """`` (hard above 1.5 nats of control margin; the configurations' margins differ by up to
    0.75 nats on 5120 positions of 60 request(s) answered alike, x 2)`` for
    ``summary.differential``, with, where the margin bands were measured
    (``envelope_by_margin``), how far they differ at small margins (each split is judged by the
    positions of up to twice its control margin: :func:`envelope_at`); "" when the envelope was
    not measured."""
    env = diff.get("envelope_nats")
    if env is None:
        return ""
    bands = [b for b in diff.get("envelope_by_margin") or []
             if b["positions"] >= CROSS_MIN_POSITIONS and b["drift_nats"] < env]
    if bands:
        b = bands[-1]
        return (f" (a split is hard above {CROSS_FACTOR:g} x how far the configurations' "
                f"margins differ at positions of up to {CROSS_SPAN:g} x its control margin, "
                f"among {diff['envelope_positions']} positions of "
                f"{diff['envelope_requests']} request(s) answered alike: at margins up to "
                f"{b['margin_up_to']:g} nats by up to {b['drift_nats']:g} nats "
                f"({b['positions']} positions), overall by up to {env:g} nats; with fewer than "
                f"{CROSS_MIN_POSITIONS} comparable positions above {diff['threshold_nats']:g} "
                "nats)")
    return (f" (hard above {diff['threshold_nats']:g} nats of control margin; the "
            f"configurations' margins differ by up to {env:g} nats on "
            f"{diff['envelope_positions']} positions of {diff['envelope_requests']} request(s) "
            f"answered alike, x {CROSS_FACTOR:g})")
