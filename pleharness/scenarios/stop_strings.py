"""Scenario kind ``stop_strings``: requests with stop strings that the greedy continuation will
hit, at a position inside a multi-token speculative step and at one that is not, alone and under
load, streamed and not (issue 26 item 2).

The stop strings are taken at run time from the engine's own output, never hard-coded:

1. ``prompts`` chat prompts "Count from 1 to N. 1 2 ... N" (the sequence is in the prompt, so
   an ngram / draft model proposes the count and a verify step accepts several tokens at once),
   each run without a stop string: its single-request reference, then once alone with its
   streamed deltas kept (phase ``stop-plain-solo``): a delta of several IDs is one speculative
   step (k > 0).
2. For each prompt, two cut positions j: one inside a multi-token step (not its last token) and
   one at the end of a step; on an engine without speculative decoding (k = 0) or when no step
   carried several tokens, two positions at about a third and two thirds of the output. The
   stop string is the text of the last token(s) through j (extended back until its first
   occurrence in the output ends exactly at token j), so the engine must return exactly j + 1
   IDs (check ``stop_string`` with ``expect_len``).
3. Each stop request's own single-request reference (streamed), then phase ``stop-c<C>``: every
   stop request streamed and (``non_streamed``) once more as one JSON response, with the plain
   requests as neighbours, ``concurrency`` in flight. Each output equals its reference (the
   same request alone: stream is not part of the reference key, so streamed == non-streamed),
   and passes ``stop_string`` (text ends before the stop; IDs, logprobs, usage and
   finish_reason agree with the text; streamed deltas by their concatenations only).

With ``straddle`` (default, issue 52) a third cut per prompt: a position j whose token starts a
streamed delta, and a stop string of at least tokens j-1..j: its text begins in one delta and
ends in the next, which an engine that searches each delta's new text alone never matches.

Table ``stop_strings``: per stop request, the stop string, the cut position, the length of the
speculative step it fell in, whether it was inside it and whether the stop straddled deltas.
Phase check ``stop_inside_step`` on ``stop-c<C>``: pass when some stop fell inside a multi-token
step; a warning on a speculative engine where none did (the case was not exercised); skip on an
engine with k = 0. Phase check ``stop_straddles_deltas``: pass when some stop straddled deltas,
a warning when none did.
"""
from __future__ import annotations


from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..checks import DEFAULT_CHECKS
from ..evidence import mark_vacuous
from ..manifest import CheckResult
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register
from .shared.chat import text_prompt
from .shared.stops import stop_span

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class StopStringsParams(Params):
    """Parameters of ``stop_strings``: ``prompts`` count prompts (N = ``count_to``,
    ``count_to`` - 8, ...), ``max_tokens`` each, ``concurrency`` in the load phase, whether each
    stop request is also sent non-streamed, the earliest cut position ``min_position`` and the
    chat prompt's filler / tail (see :class:`pleharness.scenarios.shared.chat.ChatParams`)."""

    prompts: int = Field(2, ge=1, le=64)
    count_to: int = Field(40, ge=8, le=10_000)
    max_tokens: int = Field(32, ge=8, le=100_000)
    concurrency: int = Field(8, ge=1, le=1024)
    non_streamed: bool = True
    min_position: int = Field(3, ge=1, le=10_000, description="earliest cut (output position)")
    filler: str = Field(" ", min_length=1)
    tail: int = Field(4, ge=0, le=64)
    straddle: bool = Field(True, description="a third stop string per prompt, of two or more "
                           "tokens whose last starts a streamed delta (issue 52)")

    @model_validator(mode="after")
    def _cut_inside(self):
        if self.min_position >= self.max_tokens:
            raise ValueError(f"min_position ({self.min_position}) must be < max_tokens "
                             f"({self.max_tokens}): no cut would fall inside the output")
        if self.min_position > self.count_to:
            raise ValueError(f"min_position ({self.min_position}) must be <= count_to "
                             f"({self.count_to}): the counting prompts end before it")
        return self


class StopRow(TableRow):
    """One stop request: its prompt, stop string, the output position j of the token that
    completes it, the speculative step it fell in (length, and whether j is inside it, not its
    last token), the number of IDs expected (j + 1) and whether the stop string's tokens came in
    two or more streamed deltas of the solo run (``straddles``, issue 52)."""

    prompt_key: str
    stop: str
    position: int
    step_len: int  # IDs of the streamed delta (one engine step when <= 1 + k)
    inside_step: bool
    expected_ids: int
    straddles: bool = False  # the stop's tokens came in two or more streamed deltas


def phase_of(ctx: "ScenarioContext", outcomes):
    """The phase record of the phase that returned ``outcomes`` (the PhaseResult's
    ``.phase``)."""
    return outcomes.phase


def straddle_position(steps: list[tuple[int, int]], lo: int, hi: int,
                      taken: list[int]) -> int | None:
    """An output position j in [lo + 1, hi] whose token starts a streamed delta (so a stop
    string of tokens j-1..j straddles two deltas), at least 3 from the positions ``taken``,
    the one nearest the middle; None when there is none."""
    js = [j for j in range(max(lo, 1), hi + 1) if steps[j][1] == 0
          and all(abs(j - t) >= 3 for t in taken)]
    if not js:
        return None
    mid = (lo + hi) / 2
    return min(js, key=lambda j: (abs(j - mid), j))


def straddle_check(rows: list["StopRow"]) -> CheckResult:
    """Phase check ``stop_straddles_deltas`` (issue 52): pass when some stop string's tokens
    came in two or more streamed deltas of its solo run (a matcher that searches each delta's
    text alone misses it), a warning when none did (the case was not exercised)."""
    n = sum(r.straddles for r in rows)
    if n:
        return CheckResult(name="stop_straddles_deltas", status="pass",
                           detail=f"{n} of {len(rows)} stop string(s) straddled streamed deltas")
    return CheckResult(name="stop_straddles_deltas", status="warn",
                       detail=f"none of {len(rows)} stop string(s) straddled two streamed "
                              "deltas: a stop matched across deltas was not exercised")


def steps_of(chunks) -> list[tuple[int, int]]:
    """Per output position, (step length, index in the step) from streamed deltas
    ``[(ids, text), ...]`` (a delta without IDs is skipped)."""
    out = []
    for ids, _text in chunks or []:
        out += [(len(ids), i) for i in range(len(ids))]
    return out


def pick_positions(steps: list[tuple[int, int]], lo: int, hi: int, q: int) -> list[int]:
    """Two cut positions in [lo, hi]: one inside a multi-token step (not its last token; the
    longest such step's middle) and one at the end of a step; when no step has several tokens
    (k = 0, or no draft accepted), two positions at about 1/3 and 2/3 of [lo, hi]. Fewer when
    the range is too short.

    A step is a streamed delta of 2..q (= 1 + k) IDs: a delta ends where an engine step ends,
    but when the client reads slower than the engine steps, vLLM merges the outputs of several
    steps into one delta (seen: a delta of 20 IDs at k = 3 on a loaded machine); a delta longer
    than q is no evidence of one step and is not used as "inside". Which positions are labelled
    inside therefore depends on timing; the verdict does not (the rules hold at any position)."""
    inside = [j for j in range(lo, hi + 1)
              if 2 <= steps[j][0] <= q and steps[j][1] < steps[j][0] - 1]
    ends = [j for j in range(lo, hi + 1) if steps[j][1] == steps[j][0] - 1]
    if inside:
        best = max(inside, key=lambda j: (steps[j][0], -abs(steps[j][1] - steps[j][0] // 2)))
        out = [best]
        others = [j for j in ends if abs(j - best) >= 3] or ends
        if others:
            out.append(others[len(others) // 2])
        return out
    if hi < lo:
        return []
    a, b = lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3
    return sorted({a, b})


@register
class StopStrings(Scenario):
    """Kind ``stop_strings``: see the module docstring (phases ``stop-plain-solo`` and
    ``stop-c<C>``; table ``stop_strings``)."""

    kind = "stop_strings"
    summary = ("stop strings hit inside and outside a speculative step, alone and under load, "
               "streamed and not: text, IDs, logprobs, usage agree")
    Params = StopStringsParams
    phases = 2
    tables = {"stop_strings": StopRow}

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        names = ["stop-plain-solo", (f"stop-c{p.concurrency}", p.concurrency)]
        m = ctx.facts.max_model_len
        plain: list[RequestSpec] = []
        for i in range(p.prompts):
            prompt = self._prompt(ctx, max(8, p.count_to - 8 * i))
            if prompt is None:
                ctx.note("stop_strings_notes", f"prompt {i} left out: no counting prompt of 8 "
                         f"or more numbers + max_tokens {p.max_tokens} fits max_model_len {m}",
                         echo=True)
                continue
            if any(s.prompt.key == prompt.key for s in plain):
                continue  # lowered to a count another prompt has already
            plain.append(RequestSpec(prompt, p.max_tokens, keep_chunks=True,
                                     checks={name: {} for name in DEFAULT_CHECKS}))
        if not plain:
            self.leave_out_phases(ctx, names, f"no counting prompt + max_tokens {p.max_tokens} "
                                  f"fits max_model_len {m}")
            return
        k = (ctx.facts.num_speculative_tokens or 0)
        ctx.take_references(plain)
        solo = ctx.run_phase("stop-plain-solo", 1, plain, counts_for_throughput=False)
        if not solo:
            return  # reference pass only (collect-only): nothing to derive stops from
        rows: list[StopRow] = []
        stops: list[RequestSpec] = []
        for o in solo:
            c = o.completion
            if c.error is not None or not c.token_ids:
                continue
            steps = steps_of(c.chunks)
            ids = list(c.token_ids)
            if len(steps) != len(ids):
                continue
            hi = len(ids) - 4  # room after the cut: IDs there must not come back
            lo = min(p.min_position, hi)
            cuts = [(j, 1) for j in pick_positions(steps, lo, hi, k + 1)]
            if p.straddle:
                j = straddle_position(steps, lo, hi, [j for j, _b in cuts])
                if j is not None:
                    cuts.append((j, 2))
            for j, min_back in cuts:
                got = stop_span(ctx, ids, j, min_back)
                if got is None:
                    continue
                s, back = got
                checks = {name: {} for name in DEFAULT_CHECKS}
                checks["stop_string"] = {"expect_len": j + 1}
                spec = replace(o.spec, stop=(s,), checks=checks, compare=True,
                               note=f"stop {s!r} completes at output position {j}")
                stops.append(spec)
                rows.append(StopRow(prompt_key=o.spec.prompt.key, stop=s, position=j,
                                    step_len=steps[j][0],
                                    inside_step=2 <= steps[j][0] <= k + 1
                                    and steps[j][1] < steps[j][0] - 1,
                                    expected_ids=j + 1, straddles=steps[j][1] < back - 1))
        self.put_table(ctx, "stop_strings", rows)
        if not stops:
            # a model that does not count (random weights) gives no token text that completes
            # only at its own position: the kind tested nothing, and says so (not a usage error:
            # the rest of the suite still runs and is judged; found on the H200, issue 32)
            why = ("stop strings: none could be taken from the engine's solo outputs (no output "
                   "token's text completes only at its position: a model that does not count, "
                   "or outputs too short?): nothing was stopped")
            mark_vacuous(ctx, solo.phase, why)
            ctx.leave_out(f"stop-c{p.concurrency}", why, p.concurrency)
            return
        ctx.take_references(stops)
        load = list(stops)
        if p.non_streamed:
            load += [replace(s, stream=False) for s in stops]
        load += [replace(s, keep_chunks=False) for s in plain]
        outs = ctx.run_phase(f"stop-c{p.concurrency}", p.concurrency, load)
        if not outs:
            return
        ph = phase_of(ctx, outs)
        inside = sum(r.inside_step for r in rows)
        if k == 0:
            res = CheckResult(name="stop_inside_step", status="skip",
                              detail="no speculative decoding (k = 0): no multi-token step")
        elif inside:
            res = CheckResult(name="stop_inside_step", status="pass",
                              detail=f"{inside} of {len(rows)} stop(s) completed inside a "
                                     "multi-token speculative step")
        else:
            res = CheckResult(name="stop_inside_step", status="warn",
                              detail=f"k = {k} but no stop completed inside a multi-token step "
                                     "(no delta of the solo runs carried several tokens): the "
                                     "case was not exercised")
        ctx.add_phase_check(ph, res)
        if p.straddle:
            ctx.add_phase_check(ph, straddle_check(rows))

    def _prompt(self, ctx: "ScenarioContext", n: int):
        """The counting prompt "Count from 1 to n. 1 2 ... n" (chat-shaped where the engine has
        a chat template), n lowered (not below 8) until it + max_tokens fits max_model_len; None
        when even n = 8 does not fit."""
        p = self.params
        m = ctx.facts.max_model_len
        while True:
            text = f"Count from 1 to {n}. " + " ".join(str(k) for k in range(1, n + 1))
            prompt = text_prompt(ctx, p, text, f"count-to-{n}",
                                 why="the count in the prompt: drafts of several tokens are "
                                     "accepted")
            if m is None or len(prompt) + p.max_tokens <= int(m):
                return prompt
            if n <= 8:
                return None
            n = max(8, n * 3 // 4)

    @classmethod
    def markdown(cls, m) -> list[str]:
        """The "Stop strings" section of summary.md."""
        return cls.markdown_table(m, "stop_strings", "Stop strings", [
            ("prompt", "prompt_key"), ("stop", lambda r: f"`{r.stop!r}`"),
            ("position", "position"), ("step", "step_len"),
            ("inside step", lambda r: "yes" if r.inside_step else "no"),
            ("straddles deltas", lambda r: "yes" if r.straddles else "no"),
            ("IDs expected", "expected_ids")])
