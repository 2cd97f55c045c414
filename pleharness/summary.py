"""Figures computed from a run's manifest that more than one command uses (``stress`` stores
them in the summary, ``compare`` gates on them, ``summary.md`` shows them)."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from .manifest import Manifest


def throughput_by_concurrency(m: Manifest) -> dict[str, dict[str, Any]]:
    """Decode throughput per concurrency level: for each repeat, completion tokens / wall time
    summed over that repeat's load phases at C (phases that count for throughput); then median,
    min and max over the repeats (tok/s)."""
    per: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for p in m.phases:
        if p.counts_for_throughput and p.role == "load" and p.wall_s and p.status not in ("not_run", "interrupted"):
            acc = per[p.concurrency][p.repeat]
            acc[0] += p.completion_tokens
            acc[1] += p.wall_s
    out = {}
    for c in sorted(per):
        vals = [tok / wall for tok, wall in per[c].values() if wall > 0]
        if vals:
            out[f"C{c}"] = {"median_tok_per_s": statistics.median(vals), "min_tok_per_s": min(vals),
                            "max_tok_per_s": max(vals), "repeats": len(vals)}
    return out
