"""Boundary prompt lengths derived from engine facts (shared/DESIGN.md, "Boundary lengths").

q = 1 + k (k = num_speculative_tokens), B = block size, C = max_num_batched_tokens (chunked-prefill
budget), A = the hybrid cache-hit alignment unit (``cache_hit_alignment_tokens``, else
``effective_attention_block_size``) where it differs from B, W = sliding window(s), K = attention
chunk size (chunked local attention), M = max_model_len.

- L = q: a fresh prompt exactly one verify step long is shaped like a uniform decode batch.
- L = n*C + q: the last prefill chunk is q tokens long.
- L = n*B + q (prefix caching): the cached part covers n whole blocks, the uncached tail is q tokens.
- L = n*A + q: the same for a hybrid model whose prefix-cache hits align to A, not B.
- L = W - 1, W, W + 1: the prompt just fits, exactly fills, just overflows the window; and
  L = W - max_tokens // 2: the generation crosses W (the window starts to slide mid-decode).
- L = K - 1, K, K + 1 and L = K - max_tokens // 2: the same for an attention chunk.
Each with controls at L - 1 and L + 1 (window and chunk edges are their own controls). Lengths
outside [1, max_len] are dropped (and said so). Every length records the facts it came from.
"""
from __future__ import annotations

from ...engine.facts import as_facts

from dataclasses import dataclass, field


@dataclass
class BoundaryLength:
    """A prompt length to test, with the formulas that chose it (``reasons``), whether it is
    only a +-1 control, and the facts those formulas used."""

    length: int
    reasons: list[str] = field(default_factory=list)
    control: bool = False  # True when every reason is a +-1 control
    facts: list[str] = field(default_factory=list)  # fact names the formulas used

    @property
    def why(self) -> str:
        """The reasons, joined with '; '."""
        return "; ".join(self.reasons)


def _windows(facts: dict) -> list[int]:
    facts = as_facts(facts)
    w = facts.sliding_window
    if isinstance(w, (list, tuple)):
        return sorted({int(x) for x in w if x})
    return [int(w)] if w else []


def alignment_unit(facts: dict) -> tuple[int | None, str | None]:
    """(A, fact name) when a hybrid model's cache-hit alignment differs from B, else (None, None).

    Sources: ``cache_hit_alignment_tokens``, then ``effective_attention_block_size``, then
    ``mamba_block_size`` (vLLM 0.32 /metrics ``vllm:cache_config_info``)."""
    facts = as_facts(facts)
    b = facts.block_size
    for name in ("cache_hit_alignment_tokens", "effective_attention_block_size",
                 "mamba_block_size"):
        a = facts.get(name)
        if isinstance(a, int) and a > 0 and a != b:
            return a, name
    return None, None


def skipped_families(facts: dict) -> list[dict]:
    """The length families that cannot be derived, one dict each: ``formula``, ``needs`` (fact
    names) and ``reason``. The boundary scenario shows them as table rows."""
    facts = as_facts(facts)
    out = []
    if not facts.block_size:
        out.append({"formula": "n*B + q", "needs": ["block_size"],
                    "reason": "block size unknown (no /metrics cache_config_info, no "
                              "--block-size)"})
    if not facts.max_num_batched_tokens:
        out.append({"formula": "n*C + q", "needs": ["max_num_batched_tokens"],
                    "reason": "max_num_batched_tokens unknown (no engine log or /server_info, "
                              "no --chunk-size)"})
    return out


def boundary_lengths(facts: dict, depth: int, controls: bool = True, max_len: int | None = None,
                     extra: list[int] | None = None, max_tokens: int | None = None,
                     dropped: list[BoundaryLength] | None = None
                     ) -> tuple[list[BoundaryLength], list[str]]:
    """Sorted, de-duplicated boundary lengths and a list of notes on what was left out.

    Args:
        facts: engine facts (``num_speculative_tokens``, ``block_size``, ``max_num_batched_tokens``,
            ``cache_hit_alignment_tokens`` / ``effective_attention_block_size``,
            ``sliding_window``, ``attention_chunk_size``).
        depth: N, the largest multiple n used in n*B + q, n*C + q and n*A + q.
        controls: add L - 1 and L + 1 for every derived L.
        max_len: the longest prompt allowed (typically M - max_tokens).
        extra: user-given lengths, added as they are.
        max_tokens: the requests' max_tokens (for the lengths whose generation crosses W or K).
        dropped: when given, the lengths left out for being longer than ``max_len`` are appended
            to it (the boundary scenario shows them as rows).
    """
    facts = as_facts(facts)
    k = (facts.num_speculative_tokens or 0)
    q = 1 + k
    b = facts.block_size
    c = facts.max_num_batched_tokens
    notes: list[str] = []
    found: dict[int, BoundaryLength] = {}
    k_fact = ["num_speculative_tokens"]

    def add(length: int, why: str, control: bool, used: list[str]) -> None:
        if length < 1:
            return
        if max_len is not None and length > max_len:
            notes.append(f"L={length} ({why}) dropped: longer than {max_len}")
            if dropped is not None and not control:
                dropped.append(BoundaryLength(length, [why], control, list(used)))
            return
        bl = found.setdefault(length, BoundaryLength(length, control=True))
        bl.reasons.append(why)
        bl.control = bl.control and control
        bl.facts.extend(u for u in used if u not in bl.facts)

    def derived(length: int, formula: str, used: list[str]) -> None:
        add(length, formula, False, used)
        if controls:
            add(length - 1, f"{formula} - 1 (control)", True, used)
            add(length + 1, f"{formula} + 1 (control)", True, used)

    derived(q, f"q = 1 + k = {q}", k_fact)
    if b:
        for n in range(1, depth + 1):
            derived(n * b + q, f"n*B + q = {n}*{b} + {q}", ["block_size"] + k_fact)
    if c:
        for n in range(1, depth + 1):
            derived(n * c + q, f"n*C + q = {n}*{c} + {q}", ["max_num_batched_tokens"] + k_fact)
    for fam in skipped_families(facts):
        notes.append(f"{fam['formula']} lengths skipped: {fam['reason']}")
    a, a_name = alignment_unit(facts)
    if a:
        for n in range(1, depth + 1):
            derived(n * a + q, f"n*A + q = {n}*{a} + {q} (A = {a_name})", [a_name] + k_fact)
    for label, name, values in (("W", "sliding_window", _windows(facts)),
                                ("K", "attention_chunk_size",
                                 [int(facts.attention_chunk_size)]
                                 if facts.attention_chunk_size else [])):
        for w in values:
            add(w - 1, f"{label} - 1 = {w - 1} (fits the window)", False, [name])
            add(w, f"{label} = {w} (fills the window)", False, [name])
            add(w + 1, f"{label} + 1 = {w + 1} (overflows the window)", False, [name])
            if max_tokens and max_tokens >= 2:
                half = max_tokens // 2
                add(w - half, f"{label} - max_tokens/2 = {w} - {half} (the generation crosses "
                              f"{label})", False, [name])
            else:
                notes.append(f"generation crossing {label}={w} skipped: max_tokens < 2")
    for e in extra or []:
        add(e, "requested in the scenario file", False, [])
    return [found[k] for k in sorted(found)], notes


def fitted_range(facts, min_len: int, max_len: int, max_tokens: int) -> tuple[int, int] | None:
    """(min_len, max_len) of prompts (tokens) shortened so that each + ``max_tokens`` fits
    max_model_len (``facts``: EngineFacts or a dict of values; M unknown: as given); None when
    no prompt fits."""
    m = as_facts(facts).max_model_len
    if m is None:
        return min_len, max_len
    limit = int(m) - max_tokens
    return None if limit < 1 else (min(min_len, limit), min(max_len, limit))


def fit_prompts(ctx, phases: list, min_len: int, max_len: int, max_tokens: int, table: str,
                what: str = "prompts") -> tuple[int, int] | None:
    """:func:`fitted_range` on the run's facts for a kind: the range, said in ``table`` when
    it was shortened; None, with every phase of ``phases`` (names or (name, concurrency))
    left out with the reason, when no prompt fits (the kind then returns)."""
    m = ctx.facts.max_model_len
    lens = fitted_range(ctx.facts, min_len, max_len, max_tokens)
    if lens is None:
        for ph in phases:
            name, c = (ph, 1) if isinstance(ph, str) else ph
            ctx.leave_out(name, f"params.max_tokens {max_tokens} leaves no room for a prompt: "
                                f"max_model_len is {m}", c)
    elif lens != (min_len, max_len):
        ctx.note(table, f"{what} of {lens[0]}..{lens[1]} tokens (params {min_len}..{max_len} + "
                        f"max_tokens {max_tokens} exceed max_model_len {m})", echo=True)
    return lens
