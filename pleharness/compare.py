"""``ple-harness compare BASE HEAD``: token parity across two runs, throughput ratios, gates.

Parity: for every (prompt hash, max_tokens) that both runs issued, the set of output token hashes
each run produced (references and load requests) must be the same single hash. Throughput: per
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

from .errors import UsageError
from .manifest import Manifest, load_manifest
from .summary import throughput_by_concurrency

OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
THRESHOLD = re.compile(r"^\s*C(\d+)\s*(>=|<=|>|<)\s*(\d+(?:\.\d*)?|\.\d+)\s*$")


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

    @property
    def passed(self) -> bool:
        return not self.gate_failures

    @property
    def diagnosis(self) -> str:
        """One line for a pre-merge job: whose fault a failure is.

        "HEAD passed", "broken by this change" (HEAD failed, BASE passed), "broken before this
        change" (both failed) or "fixed by this change" (BASE failed, HEAD passed)."""
        head_ok = self.head_verdict == "pass"
        base_ok = self.base_verdict == "pass"
        if head_ok:
            return ("HEAD passed; BASE failed: fixed by this change" if not base_ok
                    else "HEAD and BASE passed their own runs")
        if base_ok:
            return "HEAD failed its own run, BASE passed: broken by this change"
        return (f"HEAD failed its own run and BASE failed too ({self.base_verdict}): broken "
                "before this change")


def parse_threshold(text: str) -> tuple[str, str, float]:
    """'C4>=62.985' -> ('C4', '>=', 62.985). Raises UsageError on other forms."""
    m = THRESHOLD.match(text)
    if not m:
        raise UsageError(f"--threshold {text!r}: expected e.g. 'C4>=62.985' (C<concurrency>, one of "
                         ">= > <= <, decode tok/s)")
    return f"C{m.group(1)}", m.group(2), float(m.group(3))


def _outputs(m: Manifest) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = defaultdict(lambda: {"hashes": set(), "prompt": None})
    for r in m.references:
        e = out[(r.prompt_hash, r.max_tokens)]
        e["hashes"].add(r.output_hash)
        e["prompt"] = r.prompt_key
    for q in m.requests:
        if q.output_hash and not q.error:
            e = out[(q.prompt_hash, q.max_tokens)]
            e["hashes"].add(q.output_hash)
            e["prompt"] = e["prompt"] or q.prompt_key
    return out


def compare(base: Manifest, head: Manifest, min_throughput_ratio: float | None = None,
            min_phase_ratio: float | None = None, thresholds: list[str] | None = None) -> Comparison:
    """Compare HEAD with BASE: both runs' own verdicts, token parity, throughput gates."""
    from .render import causes
    res = Comparison()
    for label, m in (("BASE", base), ("HEAD", head)):
        if m.status != "complete":
            res.gate_failures.append(f"run status: {label} ({m.run_id}) is {m.status!r}, not "
                                     "complete: it cannot pass a comparison")
    res.base_verdict, res.head_verdict = base.verdict or "none", head.verdict or "none"
    res.base_causes, res.head_causes = causes(base), causes(head)
    if res.head_verdict != "pass":
        why = "; ".join(res.head_causes[:3]) or "no cause recorded"
        res.gate_failures.insert(0, f"HEAD verdict: HEAD ({head.run_id}) is "
                                    f"{res.head_verdict!r} on its own: {why}")
    else:
        res.gates_passed.insert(0, f"HEAD verdict: HEAD ({head.run_id}) passed on its own")
    bo, ho = _outputs(base), _outputs(head)
    for key in sorted(set(bo) | set(ho)):
        if key not in bo or key not in ho:
            res.only_in_one += 1
            continue
        res.parity_compared += 1
        if bo[key]["hashes"] != ho[key]["hashes"] or len(ho[key]["hashes"]) != 1:
            res.parity_mismatches.append({
                "prompt": ho[key]["prompt"], "prompt_hash": key[0][:12], "max_tokens": key[1],
                "base": sorted(h[:12] for h in bo[key]["hashes"]),
                "head": sorted(h[:12] for h in ho[key]["hashes"])})
    if res.parity_compared == 0:
        res.gate_failures.append("token parity: no prompt was issued by both runs (nothing "
                                 "compared)")
    elif res.parity_mismatches:
        res.gate_failures.append(f"token parity: {len(res.parity_mismatches)} of "
                                 f"{res.parity_compared} prompts differ between BASE and HEAD")
    else:
        res.gates_passed.append(f"token parity: {res.parity_compared} prompts identical")
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
    from . import compare_spec
    for t in thresholds or []:
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
    return res


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


def check_thresholds(thresholds: list[str] | None) -> None:
    """Parse every ``--threshold`` now (usage error, exit 2) so nothing is loaded with a bad one."""
    from . import compare_spec
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
