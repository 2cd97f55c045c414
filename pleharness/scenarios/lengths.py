"""Boundary prompt lengths derived from engine facts (shared/DESIGN.md, "Boundary lengths").

q = 1 + k (k = num_speculative_tokens), B = block size, C = max_num_batched_tokens (chunked-prefill
budget), M = max_model_len.

- L = q: a fresh prompt exactly one verify step long is shaped like a uniform decode batch.
- L = n*C + q: the last prefill chunk is q tokens long.
- L = n*B + q (prefix caching): the cached part covers n whole blocks, the uncached tail is q tokens.
Each with controls at L - 1 and L + 1. Lengths outside [1, max_len] are dropped (and said so).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BoundaryLength:
    length: int
    reasons: list[str] = field(default_factory=list)
    control: bool = False  # True when every reason is a +-1 control

    @property
    def why(self) -> str:
        return "; ".join(self.reasons)


def boundary_lengths(facts: dict, depth: int, controls: bool = True, max_len: int | None = None,
                     extra: list[int] | None = None) -> tuple[list[BoundaryLength], list[str]]:
    """Sorted, de-duplicated boundary lengths and a list of notes on what was left out.

    Args:
        facts: engine facts (``num_speculative_tokens``, ``block_size``, ``max_num_batched_tokens``).
        depth: N, the largest multiple n used in n*B + q and n*C + q.
        controls: add L - 1 and L + 1 for every derived L.
        max_len: the longest prompt allowed (typically M - max_tokens).
        extra: user-given lengths, added as they are.
    """
    k = int(facts.get("num_speculative_tokens") or 0)
    q = 1 + k
    b = facts.get("block_size")
    c = facts.get("max_num_batched_tokens")
    notes: list[str] = []
    found: dict[int, BoundaryLength] = {}

    def add(length: int, why: str, control: bool) -> None:
        if length < 1:
            return
        if max_len is not None and length > max_len:
            notes.append(f"L={length} ({why}) dropped: longer than {max_len}")
            return
        bl = found.setdefault(length, BoundaryLength(length, control=True))
        bl.reasons.append(why)
        bl.control = bl.control and control

    def derived(length: int, formula: str) -> None:
        add(length, formula, False)
        if controls:
            add(length - 1, f"{formula} - 1 (control)", True)
            add(length + 1, f"{formula} + 1 (control)", True)

    derived(q, f"q = 1 + k = {q}")
    if b:
        for n in range(1, depth + 1):
            derived(n * b + q, f"n*B + q = {n}*{b} + {q}")
    else:
        notes.append("n*B + q lengths skipped: block size unknown (pass --block-size)")
    if c:
        for n in range(1, depth + 1):
            derived(n * c + q, f"n*C + q = {n}*{c} + {q}")
    else:
        notes.append("n*C + q lengths skipped: max_num_batched_tokens unknown (pass --chunk-size)")
    for e in extra or []:
        add(e, "requested in the scenario file", False)
    return [found[k] for k in sorted(found)], notes
