"""``ple-harness compare BASE HEAD``: token parity across two runs, throughput ratios, gates.

Parity: for every (prompt hash, max_tokens) that both runs issued, the output token hashes each
run stands behind (references and judged requests, less the outputs its own run tolerated as near
ties or ``also_in_control``) must be the same; a hash in only one run is classified against the
other run's reference by that reference's margin, as a run classifies its own divergences
(:func:`compare`). Throughput: per
phase (by name) and per concurrency (median over repeats, see
:func:`pleharness.summary.throughput_by_concurrency`), as HEAD / BASE ratios.

Gates (each failure says which gate and by how much):
- HEAD's own verdict: always. A HEAD run that failed (its own parity, checks, request errors) or did
  not complete fails the comparison, whatever BASE did; BASE's verdict is reported beside it, so a
  pre-merge job can tell "broken before" (BASE failed too) from "broken by this change" (BASE
  passed). BASE's verdict alone does not fail the gate (a fix may land on a broken BASE), but a BASE
  that did not complete does (nothing trustworthy to compare with);
- token parity: always;
- ``--min-throughput-ratio R``: every per-concurrency median ratio >= R;
- ``--min-phase-ratio R``: every per-phase ratio >= R (phases are short: noisy on small machines);
- ``--threshold "C4>=62.985"``: HEAD's median decode tok/s at that concurrency against a
  preregistered number (operators >=, >, <=, <);
- ``--threshold "acceptance>=0.95*base"`` (or ``accepted_length``, ``@C4``, an absolute number):
  speculative-decoding health against BASE (:mod:`pleharness.compare_spec`).
"""
from __future__ import annotations

import operator
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from . import compare_spec
from .causes import causes
from .divergence import Rule, analyse, first_divergence, settle_under
from .errors import UsageError
from .manifest import Manifest, load_manifest
from .request import params_key
from .summary import throughput_by_concurrency

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
THRESHOLD = re.compile(r"^\s*C([1-9]\d*)\s*(>=|<=|>|<)\s*(\d+(?:\.\d*)?|\.\d+)\s*$")


@dataclass
class Comparison:
    parity_compared: int = 0
    parity_mismatches: list[dict] = field(default_factory=list)
    only_in_one: int = 0
    phase_ratios: dict[str, float] = field(default_factory=dict)
    concurrency_ratios: dict[str, float] = field(default_factory=dict)
    head_throughput: dict[str, dict] = field(default_factory=dict)
    base_throughput: dict[str, dict] = field(default_factory=dict)
    gate_failures: list[str] = field(default_factory=list)
    gates_passed: list[str] = field(default_factory=list)
    base_verdict: str | None = None
    head_verdict: str | None = None
    base_causes: list[str] = field(default_factory=list)
    head_causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # do not fail (near ties, same run)
    models_differ: str | None = None  # "BASE ..., HEAD ...": the runs served different models
    incomplete: list[str] = field(default_factory=list)  # runs that did not complete: no verdict

    @property
    def passed(self) -> bool:
        return not self.gate_failures

    @property
    def diagnosis(self) -> str:
        """One line for a pre-merge job, consistent with the exit code (the CLI prints it after
        "verdict: pass" or "verdict: fail"): whose fault a failure is.

        pass: "HEAD passed and matches BASE" (BASE failed: "fixed by this change"). fail: "HEAD
        failed its own run, BASE passed: broken by this change", "... BASE failed too: broken
        before this change", or, when HEAD passed its own run, the gates it missed against BASE
        (and whether BASE passed its own). A run that did not complete gives no verdict: "no
        verdict: HEAD (...) did not complete (status 'interrupted' after 3 of 32 phases)"."""
        head_ok = self.head_verdict == "pass"
        base_ok = self.base_verdict == "pass"
        if self.incomplete:
            return "no verdict: " + "; ".join(self.incomplete)
        if self.models_differ and not self.passed:
            return (f"BASE and HEAD serve different models ({self.models_differ}): compare runs "
                    "of the same model")
        if self.passed:
            return ("HEAD passed and matches BASE; BASE failed its own run: fixed by this "
                    "change" if not base_ok else "HEAD passed and matches BASE")
        if not head_ok:
            if base_ok:
                return "HEAD failed its own run, BASE passed: broken by this change"
            return (f"HEAD failed its own run and BASE failed too ({self.base_verdict}): "
                    "broken before this change")
        gates = sorted({g.split(":", 1)[0].split(" ", 1)[0] if g.startswith("--")
                        else g.split(":", 1)[0] for g in self.gate_failures})
        base = "BASE passed its own run" if base_ok else \
            f"BASE failed its own run ({self.base_verdict}), so BASE may be the one that is wrong"
        return f"HEAD passed its own run but missed {', '.join(gates)} against BASE; {base}"


def parse_threshold(text: str) -> tuple[str, str, float]:
    """'C4>=62.985' -> ('C4', '>=', 62.985). Raises UsageError on other forms (C0 included: a
    concurrency is at least 1)."""
    m = THRESHOLD.match(text)
    if not m:
        raise UsageError(f"--threshold {text!r}: expected e.g. 'C4>=62.985' (C<concurrency "
                         ">= 1>, one of >= > <= <, decode tok/s)")
    return f"C{m.group(1)}", m.group(2), float(m.group(3))


MISMATCHES_SHOWN = 20  # parity lines printed; the rest are counted ("... and N more")


def _key(r) -> tuple:
    """(prompt hash, max_tokens), plus the canonical JSON of the request's parameters beyond the
    defaults when it had any (a stop string or a penalty gives another output of the same
    prompt: :attr:`pleharness.request.RequestSpec.params`)."""
    p = params_key(getattr(r, "params", None))
    return (r.prompt_hash, r.max_tokens) if p is None else (r.prompt_hash, r.max_tokens, p)


def _outputs(m: Manifest) -> dict[tuple, dict]:
    """Per (prompt hash, max_tokens[, parameters]): every output hash the run produced (``hashes``), the ones
    that appear only as outputs its own run tolerated (``tolerated``: a near tie or
    ``also_in_control``, with that divergence), the token IDs known per hash (``ids``) and the
    run's references (``refs``). Warmup outputs are left out: the run does not judge them
    (no reference, no token IDs kept)."""
    warm = {p.name for p in m.phases if p.role == "warmup"}
    out: dict[tuple[str, int], dict] = defaultdict(
        lambda: {"hashes": set(), "strict": set(), "tolerated": {}, "ids": {}, "refs": [],
                 "prompt": None})
    for r in m.references:
        e = out[_key(r)]
        e["hashes"].add(r.output_hash)
        e["strict"].add(r.output_hash)
        e["refs"].append(r)
        if r.output_ids:
            e["ids"].setdefault(r.output_hash, r.output_ids)
        e["prompt"] = r.prompt_key
    for q in m.requests:
        if not q.output_hash or q.error or q.phase in warm or q.phase == "warmup":
            continue
        e = out[_key(q)]
        e["hashes"].add(q.output_hash)
        if q.tolerated:
            e["tolerated"].setdefault(q.output_hash, q.divergence)
        else:
            e["strict"].add(q.output_hash)
        if q.output_ids:
            e["ids"].setdefault(q.output_hash, q.output_ids)
        e["prompt"] = e["prompt"] or q.prompt_key
    return out


def _core(e: dict) -> set[str]:
    """The hashes a run stands behind for one prompt: all of them except those seen only as
    outputs its own run tolerated (near ties, ``also_in_control``)."""
    return e["hashes"] - (set(e["tolerated"]) - e["strict"])


def _cross_run(ref_side: dict, other: dict, other_hash: str, rule: Rule):
    """Classify one output hash of one run against the other run's reference as the run would
    (:func:`pleharness.divergence.analyse`, engine margin of that reference at the first
    divergent position, settled under ``rule``: :func:`pleharness.divergence.settle_under`).
    Returns (Divergence or None when token IDs are missing, tolerated)."""
    ids = other["ids"].get(other_hash)
    refs = [r for r in ref_side["refs"] if r.output_ids] or []
    if ids is None or not refs:
        return None, False
    ref = next((r for r in refs if r.cache_state == "cold"), refs[0])
    pos = first_divergence(ref.output_ids, ids)
    if pos is None:
        return None, False
    other_ref = next((r for r in other["refs"] if r.output_hash == other_hash), None)
    rtop = ref.top_ids[pos] if ref.top_ids and pos < len(ref.top_ids) else None
    otop = (other_ref.top_ids[pos] if other_ref is not None and other_ref.top_ids
            and pos < len(other_ref.top_ids) else None)
    d = settle_under(analyse(ref.output_ids, ids, pos, ref.margins, rule.near_tie_nats,
                             reference_top=rtop, observed_top=otop), rule)
    return d, not d.fails


def comparison_rule(base: Manifest, head: Manifest) -> Rule:
    """The rule a comparison judges a hash seen in only one run by: HEAD's
    (:meth:`pleharness.divergence.Rule.of_run`), at BASE's threshold where HEAD recorded none,
    strict when either run was. Raises nothing."""
    h, b = Rule.of_run(head.run_options), Rule.of_run(base.run_options)
    nats = h.near_tie_nats if head.run_options.near_tie_nats is not None else b.near_tie_nats
    return Rule(nats, h.strict or b.strict, h.serving_dtype)


def _describe(d) -> str:
    if d is None:
        return "first divergent position unknown (the runs kept no token IDs for it)"
    m = "no margin" if d.margin_nats is None else f"margin {d.margin_nats:.3f} nats"
    return (f"first divergent position {d.position} (BASE token {d.reference_token}, HEAD token "
            f"{d.observed_token}; {d.cls}: {m}, threshold {d.threshold_nats:g})")


def _model_id(m: Manifest) -> str | None:
    dig = (m.engine.model_digest or {}).get("weights_sha256")
    if dig:
        return f"weights SHA256 {dig[:16]}"
    name = m.engine.model_root or m.engine.model
    return f"model {name}" if name else None


def compare(base: Manifest, head: Manifest, min_throughput_ratio: float | None = None,
            min_phase_ratio: float | None = None, thresholds: list[str] | None = None,
            same_run: bool = False) -> Comparison:
    """Compare HEAD with BASE: both runs' own verdicts, token parity, throughput gates.

    Parity is judged as each run judged itself: per (prompt, max_tokens), the hashes a run stands
    behind (:func:`_core`: outputs its own run tolerated as near ties or ``also_in_control`` are
    left out, and listed in ``warnings``) must be the same in both runs. A hash present in only
    one run is classified against the other run's reference with that reference's engine margin
    (:func:`pleharness.divergence.analyse`, threshold: HEAD's ``run_options.near_tie_nats``, or
    the dtype default); a near tie is a warning unless either run used ``--strict``. Each
    mismatch gives the first divergent token position where token IDs were kept. Two runs that
    serve different models fail the parity gate (nothing to compare). ``same_run``: BASE and
    HEAD are the same folder (a warning; it passes when HEAD passed).
    """
    res = Comparison()
    _own_verdicts(res, base, head, same_run)
    bm, hm = _model_id(base), _model_id(head)
    rule = comparison_rule(base, head)
    bo, ho = _outputs(base), _outputs(head)
    for key in sorted(set(bo) | set(ho)):
        if key not in bo or key not in ho:
            res.only_in_one += 1
            continue
        res.parity_compared += 1
        _compare_prompt(res, key, bo[key], ho[key], rule)
    _parity_gate(res, bm, hm)
    _scenario_gate(res, base, head)
    _throughput_gates(res, base, head, min_throughput_ratio, min_phase_ratio)
    _threshold_gates(res, base, head, thresholds or [])
    return res


def _own_verdicts(res: Comparison, base: Manifest, head: Manifest, same_run: bool) -> None:
    """Gates on each run's status and HEAD's own verdict; both runs' causes."""
    if same_run:
        res.warnings.append("BASE and HEAD are the same run: the comparison only re-checks HEAD's "
                            "own verdict and completeness")
    for label, m in (("BASE", base), ("HEAD", head)):
        if m.status != "complete":
            res.gate_failures.append(f"run status: {label} ({m.run_id}) is {m.status!r}, not "
                                     "complete: it cannot pass a comparison")
            s = m.summary
            done = (f" after {s.phases_completed} of {s.phases_planned} phases"
                    if s.phases_planned else "")
            res.incomplete.append(f"{label} ({m.run_id}) did not complete (status "
                                  f"{m.status!r}{done})")
        elif not m.verdict:
            res.gate_failures.append(f"run verdict: {label} ({m.run_id}) recorded no verdict")
            res.incomplete.append(f"{label} ({m.run_id}) recorded no verdict of its own (a "
                                  "control or reference engine's manifest?)")
    res.base_verdict, res.head_verdict = base.verdict or "none", head.verdict or "none"
    res.base_causes, res.head_causes = causes(base), causes(head)
    if res.head_verdict != "pass":
        why = "; ".join(res.head_causes[:3]) or "no cause recorded"
        res.gate_failures.insert(0, f"HEAD verdict: HEAD ({head.run_id}) is "
                                    f"{res.head_verdict!r} on its own: {why}")
    else:
        res.gates_passed.insert(0, f"HEAD verdict: HEAD ({head.run_id}) passed on its own")


def _compare_prompt(res: Comparison, key: tuple, b: dict, h: dict, rule: Rule) -> None:
    """One (prompt, max_tokens[, sampling]) issued by both runs: identical, a near tie (a warning)
    or a mismatch (appended to ``res.parity_mismatches``)."""
    name = f"{h['prompt'] or b['prompt']} (max_tokens {key[1]}" + \
        (f", {key[2]})" if len(key) > 2 else ")")
    bc, hc = _core(b), _core(h)
    if bc == hc:
        extra = set(b["tolerated"]) | set(h["tolerated"])
        if extra:
            kinds = sorted({d.attribution if d.attribution == "also_in_control" else d.cls
                            for e in (b, h) for d in e["tolerated"].values()})
            res.warnings.append(f"parity: {name}: identical, with {len(extra)} output(s) "
                                "that differ from their reference only by divergences their "
                                f"own run tolerated ({', '.join(kinds)})")
        return
    found, bad = [], []
    for label, ref_side, other, hashes in (("HEAD", b, h, hc - bc), ("BASE", h, b, bc - hc)):
        for x in sorted(hashes):
            d, ok = _cross_run(ref_side, other, x, rule)
            if d is not None and label == "BASE":  # say it from BASE to HEAD
                d = d.model_copy(update={"reference_token": d.observed_token,
                                         "observed_token": d.reference_token})
            (found if ok else bad).append((label, x, d))
    if not bad:
        res.warnings.append(f"parity: {name}: BASE and HEAD differ by a near tie, "
                            f"{_describe(found[0][2])}")
        return
    label, x, d = bad[0]
    res.parity_mismatches.append({
        "prompt": h["prompt"] or b["prompt"], "prompt_hash": key[0][:12],
        "max_tokens": key[1], "base": sorted(v[:12] for v in bc),
        "head": sorted(v[:12] for v in hc),
        "first_divergence": None if d is None else d.position,
        "detail": _describe(d)})


def _parity_gate(res: Comparison, bm: str | None, hm: str | None) -> None:
    """The token-parity gate from the compared prompts and the two runs' model ids."""
    if bm is not None and hm is not None and bm != hm:
        res.models_differ = f"BASE {bm}, HEAD {hm}"
        res.gate_failures.append(f"token parity: BASE and HEAD serve different models (BASE {bm}, "
                                 f"HEAD {hm}): their tokens cannot be compared")
    elif res.parity_compared == 0:
        res.gate_failures.append("token parity: no prompt was issued by both runs (nothing "
                                 "compared)")
    elif res.parity_mismatches:
        res.gate_failures.append(f"token parity: {len(res.parity_mismatches)} of "
                                 f"{res.parity_compared} prompts differ between BASE and HEAD")
    else:
        warned = sum(1 for w in res.warnings if w.startswith("parity:"))
        res.gates_passed.append(f"token parity: {res.parity_compared} prompts identical"
                                + (f" ({warned} with near-tie warnings)" if warned else ""))


def _scenario_gate(res: Comparison, base: Manifest, head: Manifest) -> None:
    """HEAD must run every scenario BASE ran (by name): a change that drops one from the suite
    would otherwise pass on the prompts left (only those issued by both runs are compared).
    A scenario only HEAD ran is a warning."""
    def names(m: Manifest) -> list[str]:
        return list(dict.fromkeys(str(s.get("name") or s.get("kind")) for s in m.scenarios))
    b, h = names(base), names(head)
    dropped = [n for n in b if n not in h]
    if dropped:
        res.gate_failures.append(f"scenarios: HEAD did not run {', '.join(dropped)}, which BASE "
                                 "ran: compare runs of the same suite")
    elif b:
        res.gates_passed.append(f"scenarios: HEAD ran every scenario BASE ran ({len(b)})")
    added = [n for n in h if n not in b]
    if added:
        res.warnings.append(f"scenarios: only HEAD ran {', '.join(added)} (not compared)")


def _throughput_gates(res: Comparison, base: Manifest, head: Manifest,
                      min_throughput_ratio: float | None, min_phase_ratio: float | None) -> None:
    """HEAD/BASE decode-throughput ratios per phase and per concurrency level, and their gates."""
    bp = {p.name: p for p in base.phases if p.counts_for_throughput and p.decode_tok_per_s}
    for p in head.phases:
        if p.counts_for_throughput and p.decode_tok_per_s and p.name in bp:
            res.phase_ratios[p.name] = p.decode_tok_per_s / bp[p.name].decode_tok_per_s
    res.base_throughput = throughput_by_concurrency(base)
    res.head_throughput = throughput_by_concurrency(head)
    for c, h in res.head_throughput.items():
        b = res.base_throughput.get(c)
        if b and b["median_tok_per_s"] > 0:
            res.concurrency_ratios[c] = h["median_tok_per_s"] / b["median_tok_per_s"]
    _ratio_gate(res, "--min-throughput-ratio", min_throughput_ratio, res.concurrency_ratios,
                "{} median ratio", "concurrency level", "concurrency levels")
    _ratio_gate(res, "--min-phase-ratio", min_phase_ratio, res.phase_ratios, "phase {} ratio",
                "phase", "phases")


def _threshold_gates(res: Comparison, base: Manifest, head: Manifest,
                     thresholds: list[str]) -> None:
    """Each ``--threshold``: a compare spec, or an absolute HEAD median tok/s at a level."""
    for t in thresholds:
        if compare_spec.looks_like_spec(t):
            compare_spec.gate(res, base, head, t)
            continue
        c, op, val = parse_threshold(t)
        got = res.head_throughput.get(c, {}).get("median_tok_per_s")
        if got is None:
            res.gate_failures.append(f"--threshold {t}: HEAD has no throughput at {c}")
        elif not OPS[op](got, val):
            res.gate_failures.append(f"--threshold {t}: HEAD median {got:.3f} tok/s at {c} misses "
                                     f"it by {abs(got - val):.3f}")
        else:
            res.gates_passed.append(f"--threshold {t}: HEAD median {got:.3f} tok/s")


def _ratio_gate(res: Comparison, flag: str, floor: float | None, ratios: dict[str, float],
                item: str, unit: str, units: str) -> None:
    """Every ratio must be >= ``floor``; nothing to compare fails too."""
    if floor is None:
        return
    if not ratios:
        res.gate_failures.append(f"{flag} {floor:g}: no {unit} has throughput in both runs")
        return
    bad = {k: r for k, r in ratios.items() if r < floor}
    if bad:
        res.gate_failures += [f"{flag} {floor:g}: {item.format(k)} {r:.3f} is {floor - r:.3f} below"
                              for k, r in bad.items()]
    else:
        res.gates_passed.append(f"{flag} {floor:g}: all {len(ratios)} {units}")


def check_thresholds_against(base: Manifest, head: Manifest, thresholds: list[str] | None) -> None:
    """Raise UsageError for a ``--threshold`` that names a concurrency neither run has (checked
    once both runs are loaded, before anything is judged)."""
    for t in thresholds or []:
        if compare_spec.looks_like_spec(t):
            compare_spec.check_places(base, head, t)
            continue
        c, _, _ = parse_threshold(t)
        levels = {p.concurrency for m in (base, head) for p in m.phases if p.role == "load"}
        if levels and int(c[1:]) not in levels:
            raise UsageError(f"--threshold {t!r}: neither run has a load phase at {c} (levels: "
                             + ", ".join(f"C{x}" for x in sorted(levels)) + ")")


def check_thresholds(thresholds: list[str] | None) -> None:
    """Parse every ``--threshold`` now (usage error, exit 2) so nothing is loaded with a bad one."""
    for t in thresholds or []:
        if compare_spec.looks_like_spec(t):
            compare_spec.check(t)
        else:
            parse_threshold(t)


def load(path: str | Path) -> Manifest:
    """Load a run (folder or manifest.json); a missing or invalid file is a usage error."""
    try:
        return load_manifest(Path(path))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
