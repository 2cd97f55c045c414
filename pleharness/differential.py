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
   (:func:`cross_envelope`: how far the two configurations' top-1/top-2 margins differ at the
   positions of the requests they answered alike), and twice the drift of this request's
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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .divergence import DEFAULT_NEAR_TIE_NATS, analyse, first_divergence
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


def cross_envelope(mine: dict[tuple, Answers], theirs: dict[tuple, Answers]
                   ) -> tuple[float | None, int, int]:
    """(largest |difference| in nats, positions, requests) of the top-1/top-2 margins of the
    two configurations' solo references at every output position of the requests both answered
    alike (same output tokens; both references with margins: ``--logprobs`` >= 2). None when
    no such position. Evidence the defect under test cannot widen by changing an answer: a
    request whose answer it changed is not in it (a defect that moves margins without
    changing any token of a request would: docs/references.md, "Which control")."""
    top, n, reqs = None, 0, 0
    for key, under in mine.items():
        ctl = theirs.get(key)
        tr, cr = under.reference, ctl.reference if ctl is not None else None
        if tr is None or cr is None or tr.output_hash != cr.output_hash \
                or not tr.margins or not cr.margins:
            continue
        got = False
        for a, b in zip(tr.margins, cr.margins):
            if a is not None and b is not None:
                d = abs(float(a) - float(b))
                top = d if top is None else max(top, d)
                n += 1
                got = True
        reqs += got
    return (None if top is None else round(top, 6)), n, reqs


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
    tie = float(ro.near_tie_nats if ro.near_tie_nats is not None else DEFAULT_NEAR_TIE_NATS)
    mine, theirs = solo_answers(main), solo_answers(control)
    ids_main, ids_ctl = _ids(main), _ids(control)
    env, env_n, env_reqs = cross_envelope(mine, theirs)
    if env is not None and ro.near_tie_source != "--near-tie-nats":
        tie = max(tie, round(CROSS_FACTOR * env, 6))
    counts = {"compared": 0, "differ": 0, "hard": 0, "control_repeats_disagree": 0,
              "without_tokens": 0, "envelope_nats": env, "envelope_positions": env_n,
              "envelope_requests": env_reqs, "threshold_nats": tie}
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
            d = _classify(c_ids, t_ids, ctl, ans, under, ids_ctl, tie, bool(ro.strict))
            counts["hard"] += d.fails
            counts["control_repeats_disagree"] += (d.decided_by or "").startswith(
                "the control's own")
            rec.differential = d
            cref = ctl.reference if ctl.reference is not None and \
                ctl.reference.output_hash == ans else None
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


def _classify(c_ids: list[int], t_ids: list[int], ctl: Answers, ans: str, under: Answers,
              ids_ctl: dict[str, list[int]], tie: float, strict: bool):
    """The divergence of an answer under test (``t_ids``) from the control's answer ``ans``
    (rule of the module docstring)."""
    pos = first_divergence(c_ids, t_ids)
    cref = ctl.reference if ctl.reference is not None and \
        ctl.reference.output_hash == ans else None
    drift = _drift(cref, under.reference, pos)
    d = analyse(c_ids, t_ids, pos, cref.margins if cref else None,
                max(tie, round(DRIFT_FACTOR * drift, 6)) if drift is not None else tie)
    own = [first_divergence(c_ids, ids_ctl[o]) for o in ctl.runs
           if o != ans and o in ids_ctl]
    own = [q for q in own if q is not None]
    if own and min(own) <= pos:
        d.cls, d.fails = "near_tie", False
        d.decided_by = (f"the control's own solo runs disagree at position {min(own)} "
                        f"({len(ctl.runs)} answers): the engine's numerics")
    else:
        d.decided_by = f"differential: {d.decided_by}"
    if strict and not d.fails:
        d.fails, d.decided_by = True, d.decided_by + "; strict"
    return d


def threshold_text(diff: dict[str, Any]) -> str:
    """`` (hard above 1.5 nats: 2 x the configurations' largest margin difference 0.75 nats on
    5120 positions of 60 requests answered alike)`` for ``summary.differential``; "" when the
    envelope was not measured."""
    env = diff.get("envelope_nats")
    if env is None:
        return ""
    return (f" (hard above {diff['threshold_nats']:g} nats of control margin; the "
            f"configurations' margins differ by up to {env:g} nats on "
            f"{diff['envelope_positions']} positions of {diff['envelope_requests']} request(s) "
            f"answered alike, x {CROSS_FACTOR:g})")
