"""Check ``degeneration``: no run of >= R identical tokens and no repeated n-gram loop, unless the
model itself does it.

Params: ``max_run`` R (default 16), ``ngram`` n (default 4), ``max_repeats`` (default 8: an n-gram
repeated back to back more than this many times is a loop), ``max_zero_run`` (default 4: token 0
repeated this often is the NaN signature below; byte-level BPE merges a real "!!!!" into fewer,
longer tokens, so four single token-0 IDs in a row are no text a model writes).

Who judges a pattern (the verdict depends on the engine under test, never on the model alone):

- **A run of >= ``max_zero_run`` token ID 0 always fails**, whatever any reference shows: token 0 is what a NaN logit row
  argmaxes to (and decodes to "!" in byte-level vocabularies), so it is the signature of a corrupted
  step, and a reference corrupted the same way (a fault that hits every run of a prompt) must not
  excuse it (shared/DESIGN.md, "Checks and what they catch").
- **A load request** is excused when its reference shows the same pattern (as long a run, as many
  loop repeats): the model repeats itself there too.
- **A reference or warm-up request** is never excused by itself. With a golden reference
  (``--reference golden``: transformers in float32 on the same weights) it is excused only when the
  golden output shows the pattern too, and fails otherwise. Without one, the pattern is recorded as
  a ``note`` (model behaviour, shown in the report, not a failure): a small model may answer "OK OK
  OK ..." to a random prompt on one machine and not on another, and that is no engine fault.

Runs and loops made only of EOS (``eos_token_id`` fact, from config.json) are not reported: with
``ignore_eos`` a model often repeats EOS itself.

Kind: **relative** with its own rules (below; not :mod:`pleharness.checks.relative`'s generic
judge), except the token-0 rule, which is absolute.
"""
from ..manifest import CheckResult
from ..parity import token_hash
from . import register


def longest_run(ids: list[int], ignore: frozenset = frozenset()) -> tuple[int, int, int]:
    """(length, token, start) of the longest run of one repeated token not in ``ignore``;
    (0, -1, 0) when there is none."""
    best = (0, -1, 0)
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        if j - i > best[0] and ids[i] not in ignore:
            best = (j - i, ids[i], i)
        i = j
    return best


def longest_zero_run(ids: list[int]) -> tuple[int, int]:
    """(length, start) of the longest run of token ID 0; (0, 0) when there is none."""
    best, i = (0, 0), 0
    while i < len(ids):
        if ids[i] == 0:
            j = i
            while j < len(ids) and ids[j] == 0:
                j += 1
            if j - i > best[0]:
                best = (j - i, i)
            i = j
        else:
            i += 1
    return best


def longest_loop(ids: list[int], n: int, ignore: frozenset = frozenset()) -> tuple[int, int]:
    """(back-to-back repeats, start) of the most repeated n-gram loop (period n), skipping
    n-grams made only of tokens in ``ignore``."""
    best = (0, 0)
    for start in range(0, max(0, len(ids) - n + 1)):
        if all(t in ignore for t in ids[start: start + n]):
            continue
        reps = 1
        while ids[start + reps * n: start + (reps + 1) * n] == ids[start: start + n]:
            reps += 1
        if reps > best[0]:
            best = (reps, start)
    return best


@register("degeneration", kind="relative", own_rules=True)
def check(ctx, spec, c, params) -> CheckResult:
    """Pass, note (model behaviour) or fail for one output; see the module docstring.

    Reads ``ctx.phase_role`` (load | reference | warmup), ``ctx.references`` and the
    ``eos_token_id`` fact. Returns a CheckResult whose detail gives the pattern and its position.
    """
    if c.error is not None:
        return CheckResult(name="degeneration", status="skip", detail="request failed")
    max_run = int(params.get("max_run", 16))
    n = int(params.get("ngram", 4))
    max_rep = int(params.get("max_repeats", 8))
    max_zero = int(params.get("max_zero_run", 4))
    role = getattr(ctx, "phase_role", "load") if ctx is not None else "load"
    ref = ctx.references.get(spec.ref_key) if ctx is not None else None
    if ref is None and float(getattr(spec, "temperature", 0) or 0) > 0 \
            and getattr(spec, "seed", None) is None and "sampled_degeneration" in spec.checks:
        # an unseeded sample has no reference to show the model's own runs: the solo samples
        # of its prompt judge it (sampled_degeneration); ID-0 runs are still this check's
        zrun, zstart = longest_zero_run(c.token_ids)
        if zrun >= max_zero:
            return CheckResult(name="degeneration", status="fail", detail=(
                f"run of {zrun} x token ID 0 at position {zstart} (NaN logit rows argmax to 0; "
                "never excused by a reference)"))
        return CheckResult(name="degeneration", status="skip", detail=(
            "an unseeded sample: its runs are judged against the solo samples of its prompt "
            "(sampled_degeneration)"))
    golden_ref = ref is not None and ref.source == "golden"
    # a reference or warm-up run is judged only by an independent (golden) reference
    judge = ref if (role == "load" or golden_ref) else None
    eos = ctx.facts.eos_token_id if ctx is not None else None
    eos = frozenset(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids = c.token_ids
    problems, notes = [], []
    # the engine's own first solo run of this prompt gave this very output (it differs from the
    # kept warm reference at a numerical flip): what the model does on that branch, alone
    own_solo = (role == "load" and ref is not None and ref.cold_output_hash is not None
                and ref.cold_output_hash != ref.output_hash
                and ref.cold_output_hash == token_hash(list(ids)))

    def verdict(pattern: str, shown_by_judge: bool, never_excused: bool = False) -> None:
        if never_excused:
            problems.append(pattern)
        elif own_solo:
            notes.append(f"{pattern} (model behaviour: the engine's own first solo run of this "
                         "prompt gave this very output)")
        elif shown_by_judge:
            if role != "load":
                notes.append(f"{pattern} (model behaviour: the golden reference shows it too)")
        elif judge is not None or role == "load":
            by = "golden reference" if golden_ref else "single-request reference"
            problems.append(pattern + ("" if judge is None else f", not shown by the {by}"))
        else:
            notes.append(f"{pattern} (model behaviour in a {role} run; no golden reference "
                         "to judge it, so not a failure)")

    zrun, zstart = longest_zero_run(ids) if 0 not in eos else (0, 0)
    if zrun >= max_zero:
        verdict(f"run of {zrun} x token ID 0 at position {zstart} (NaN logit rows argmax to 0; "
                "never excused by a reference)", False, never_excused=True)
    run, tok, start = longest_run(ids, eos | {0})
    if run >= max_run:
        verdict(f"run of {run} x token {tok} at position {start}",
                judge is not None and longest_run(judge.output_ids, eos | {0})[0] >= run)
    reps, at = longest_loop(ids, n, eos | {0})
    if reps > max_rep:
        verdict(f"{n}-gram repeated {reps} times back to back at position {at}",
                judge is not None and longest_loop(judge.output_ids, n, eos)[0] >= reps)
    if problems:
        return CheckResult(name="degeneration", status="fail", detail="; ".join(problems + notes))
    if notes:
        return CheckResult(name="degeneration", status="note", detail="; ".join(notes))
    return CheckResult(name="degeneration", status="pass")
