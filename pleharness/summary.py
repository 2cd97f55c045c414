"""Figures computed from a run's manifest that more than one command uses (``stress`` stores
them in the summary, ``compare`` gates on them, ``summary.md`` shows them)."""
from __future__ import annotations

import contextlib
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .manifest import Manifest
from .timeline import COMMAND_STARTED, EngineStart, seconds_at


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


def stamp_timeline(m: Manifest, run_dir: Path, starts: Sequence[EngineStart]) -> None:
    """A finished run's time stamps in ``m.timeline`` (:class:`pleharness.timeline.Timeline`,
    seconds from the command's start): ``starts``, the engine starts of its session;
    ``failing_run`` when the verdict is fail (the end of its first failing phase or the first
    failing fuzz example, whichever came first, else now: a verdict reached after the suite,
    e.g. by the control's answers; none when the verdict is not fail); ``reproducer`` (the first
    reproducer file of its reproducers table, under ``run_dir``, written: its modification
    time); ``ended``. ``confirmed`` is stamped as it happens
    (:func:`pleharness.pipeline.confirm_reproducers`)."""
    t = m.timeline
    t.engine_starts = list(starts)
    if m.verdict == "fail":
        failed = [x for p in m.phases if p.status == "fail"
                  for x in [seconds_at(p.ended_at)] if x is not None]
        t.mark("failing_run", min(failed) if failed else None)
    else:  # a failure found on the way (a fuzz example) that the verdict did not keep
        t.failing_run_s = None
    for row in m.tables.get("reproducers") or []:
        with contextlib.suppress(OSError, KeyError, TypeError):
            t.mark("reproducer", round((run_dir / row["path"]).stat().st_mtime
                                       - COMMAND_STARTED, 1))
    t.mark("ended")
