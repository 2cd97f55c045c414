"""Scenario kind ``fuzz``: property-based schedules (hypothesis), shrunk to a one-file reproducer.

Hypothesis draws *schedules* from the engine facts and runs each one on the engine (one engine,
references cached across examples). A schedule is 1..``max_phases`` phases; a phase is a
concurrency c (1..min(max_num_seqs, ``max_concurrency``), weighted towards the edges: 1, 2,
capture sizes s and s + 1, the c where c * q crosses a capture size, max_num_seqs) and exactly c
requests issued together. Each request is

- ``new``: a prompt of a drawn length, mostly from the boundary set
  (:func:`~pleharness.scenarios.lengths.boundary_lengths`: q, n*B + q, n*C + q, +-1, window edges,
  and the M edge ``M - max_tokens``), sometimes uniform in [1, M - max_tokens]; chat-shaped
  (``Reply with OK.`` padded with filler) where the length allows and the draw asks for it, else
  seeded random token IDs (:func:`~pleharness.prompts.seeded_prompts`, one of 4 seeds per length);
- ``warm``: a repeat of a prompt of an earlier phase (prefix-cached);
- ``copy``: an identical copy of an earlier request of the same phase, in flight with it;

with a ``max_tokens`` in 1..``max_tokens`` (every residue mod q when ``max_tokens`` >= q),
streamed or not (one JSON response; references are always streamed, and a non-streamed output
must equal its streamed reference). Not drawn yet: seeded sampling, inserts into a running
streamed decode at a drawn token position.

Property: every request of the example (its single-request references, warm by default, and its
phases) passes under the same verdict policy as ``stress``: a hard divergence from the reference,
a failed check (``health_after_phase`` included: the engine stays healthy) or a request error
fails; a near tie is a warning. An example fails when any phase it recorded has status ``fail``.

Budget: ``max_examples`` (hypothesis' valid examples), ``time_budget_s`` (no new example starts
after it; shrinking gets ``shrink_budget_s`` more). Hypothesis' example database is
``db`` (default ``<run>/hypothesis-db``), so a rerun with the same ``db`` replays stored failing
examples first. ``seed`` makes the search reproducible.

On failure hypothesis shrinks; the smallest failing schedule is written as ``<run>/repro.toml`` (a
``replay`` scenario: ``ple-harness stress --scenario repro.toml`` replays it) and replayed once
more (``confirm``). After hypothesis' shrinker a greedy pass deletes phases, then requests, while
the schedule still fails (stages ``delete``, ``delete-retry``). Manifest tables:
``fuzz_examples`` (every example run: stage search / shrink / delete / delete-retry / confirm,
schedule summary, verdict, seconds),
``fuzz_shrink_steps`` (each failing example, in the order seen: the first found, then every
smaller one), ``fuzz_failing`` (the minimal schedule, request by request) and ``fuzz_summary`` (one
row: counts, seconds per example, repro path).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..prompts import Prompt, seeded_prompts
from .base import Params, Scenario, ScenarioError, register
from .shared.lengths import boundary_lengths

if TYPE_CHECKING:  # pragma: no cover
    from ..request import RequestSpec
    from ..runner import RunContext

INSTRUCTION = "Reply with OK."
PROMPT_SEEDS = 4  # distinct random prompts per length (small: prompts recur, references are reused)


class FuzzParams(Params):
    max_examples: int = Field(100, ge=1, le=1_000_000, description="hypothesis examples")
    time_budget_s: float | None = Field(None, gt=0, description="no new example after this")
    shrink_budget_s: float = Field(600.0, gt=0, description="shrinking time after the budget")
    seed: int = Field(0, ge=0, description="hypothesis seed (reproducible search)")
    db: str | None = Field(None, description="example database folder "
                                             "(default <run>/hypothesis-db)")
    max_phases: int = Field(8, ge=1, le=8)
    max_concurrency: int = Field(8, ge=1, le=1024, description="cap on drawn concurrency")
    max_tokens: int = Field(12, ge=1, le=4096, description="largest drawn max_tokens")
    depth: int = Field(2, ge=1, le=16, description="N in n*B + q and n*C + q")
    uniform_weight: float = Field(0.2, ge=0, le=1, description="share of uniform lengths")
    chat: bool = Field(True, description="draw chat-shaped prompts where the length allows")
    confirm: bool = Field(True, description="replay the minimal failing schedule once more")
    shrink: bool = Field(True, description="shrink a failure (off: stop at the first failing "
                                           "example, e.g. to measure examples to failure)")


# -- schedules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class FuzzRequest:
    """One drawn request. ``source``: new | warm | copy; ``length`` in tokens; ``shape``:
    random | chat; ``seed`` picks one of PROMPT_SEEDS random prompts of that length."""

    source: str
    length: int
    shape: str
    seed: int
    max_tokens: int
    stream: bool
    why: str = ""


@dataclass(frozen=True)
class FuzzPhase:
    concurrency: int
    requests: tuple[FuzzRequest, ...]


@dataclass(frozen=True)
class Schedule:
    phases: tuple[FuzzPhase, ...]

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def summary(self) -> str:
        """One line: ``C3[260+4,4n+1,4w+2] | C1[...]`` (length, ``+N`` max_tokens, ``w`` warm,
        ``c`` copy, ``h`` chat-shaped, ``n`` non-streamed)."""
        def req(r: FuzzRequest) -> str:
            tag = {"warm": "w", "copy": "c"}.get(r.source, "") + ("h" if r.shape == "chat" else "")
            tag += "" if r.stream else "n"
            return f"{r.length}{tag}+{r.max_tokens}"
        return " | ".join(f"C{p.concurrency}[{','.join(req(r) for r in p.requests)}]"
                          for p in self.phases)


@dataclass
class Space:
    """What schedules are drawn from (derived from the engine facts)."""

    q: int
    lengths: list[tuple[int, str]]  # (length, why), ascending
    max_len: int
    concurrency_edges: list[int]
    max_concurrency: int
    max_phases: int
    max_tokens: int
    uniform_weight: float
    chat_min: int | None  # shortest chat-shaped prompt (None: no chat prompts)
    notes: list[str] = field(default_factory=list)


def concurrency_edges(facts: dict, cap: int) -> list[int]:
    """Ascending concurrency edges in [1, cap]: 1, 2, each capture size s and s + 1, the c around
    s / q (c * q crosses s with speculative decoding), max_num_seqs and cap."""
    q = 1 + int(facts.get("num_speculative_tokens") or 0)
    out = {1, 2, cap}
    mns = facts.get("max_num_seqs")
    if mns:
        out.add(int(mns))
    for s in facts.get("cudagraph_capture_sizes") or []:
        s = int(s)
        out.update({s, s + 1})
        if q > 1:
            out.update({s // q, s // q + 1})
    return sorted(c for c in out if 1 <= c <= cap)


def build_space(facts: dict, p: FuzzParams) -> Space:
    """The schedule space for ``facts`` (engine facts dict). Raises ScenarioError when
    max_model_len leaves no room for a prompt."""
    q = 1 + int(facts.get("num_speculative_tokens") or 0)
    m = facts.get("max_model_len")
    max_len = int(m) - p.max_tokens if m else 4096
    if max_len < 1:
        raise ScenarioError(f"fuzz: max_tokens {p.max_tokens} leaves no room for a prompt "
                            f"(max_model_len {m})")
    bl, notes = boundary_lengths(facts, p.depth, controls=True, max_len=max_len)
    lengths = [(b.length, b.why) for b in bl]
    if m and max_len not in {x for x, _ in lengths}:
        lengths.append((max_len, f"M - max_tokens = {m} - {p.max_tokens} (M edge)"))
    lengths.sort()
    cap = min(p.max_concurrency, int(facts.get("max_num_seqs") or p.max_concurrency))
    return Space(q=q, lengths=lengths, max_len=max_len,
                 concurrency_edges=concurrency_edges(facts, cap), max_concurrency=cap,
                 max_phases=p.max_phases, max_tokens=p.max_tokens,
                 uniform_weight=p.uniform_weight, chat_min=None, notes=notes)


def schedules(space: Space):
    """A hypothesis strategy of :class:`Schedule` over ``space``. Shrinking goes towards fewer
    phases, lower concurrency, the shortest boundary length, new (not warm / copy) random prompts,
    seed 0, max_tokens 1 and streamed requests."""
    from hypothesis import strategies as st

    @st.composite
    def request(draw) -> tuple[str, int, FuzzRequest]:
        """(kind, index, new request): kind new | warm | copy; a warm or copy request takes the
        index-th earlier prompt (resolved in :func:`resolve`), and is this new request when
        there is none."""
        kind = ("new",) * 4 + ("warm", "copy")
        k = kind[draw(st.integers(0, 5))]
        mt = draw(st.integers(1, space.max_tokens))
        stream = draw(st.sampled_from([True, False]))
        idx = draw(st.integers(0, 15)) if k != "new" else 0
        if draw(st.integers(0, 99)) >= round(100 * (1 - space.uniform_weight)):
            length, why = draw(st.integers(1, space.max_len)), "uniform"
        else:
            length, why = draw(st.sampled_from(space.lengths))
        shape = draw(st.sampled_from(["random", "chat"])) \
            if space.chat_min is not None and length >= space.chat_min else "random"
        seed = draw(st.integers(0, PROMPT_SEEDS - 1))
        return k, idx, FuzzRequest("new", length, shape, seed, mt, stream, why)

    @st.composite
    def phase(draw):
        # selector 0 (the shrink target): uniform; otherwise an edge
        if draw(st.integers(0, 3)) == 0:
            c = draw(st.integers(1, space.max_concurrency))
        else:
            c = draw(st.sampled_from(space.concurrency_edges))
        return c, tuple(draw(request()) for _ in range(c))

    def resolve(raw) -> Schedule:
        phases, earlier = [], []
        for c, reqs in raw:
            out: list[FuzzRequest] = []
            for k, idx, r in reqs:
                src = earlier if k == "warm" else out if k == "copy" else []
                if src:
                    e = src[idx % len(src)]
                    if k == "warm":
                        r = FuzzRequest("warm", e.length, e.shape, e.seed, r.max_tokens,
                                        r.stream, e.why)
                    else:
                        r = FuzzRequest("copy", e.length, e.shape, e.seed, e.max_tokens,
                                        e.stream, e.why)
                out.append(r)
            phases.append(FuzzPhase(c, tuple(out)))
            earlier.extend(r for r in out if r.source == "new")
        return Schedule(tuple(phases))

    # phases as a list (the shrinker deletes any of them); warm repeats and copies refer to
    # earlier prompts by index, resolved after drawing
    # (min_size 0 and a filter: with min_size 1 the first element cannot be deleted)
    return st.lists(phase(), min_size=0, max_size=space.max_phases).filter(bool).map(resolve)


def relabel(sched: Schedule) -> Schedule:
    """``warm`` / ``copy`` labels made true again after deletions: a request whose prompt no
    earlier phase (warm) or earlier request of its phase (copy) has becomes ``new``."""
    phases, earlier = [], set()
    for ph in sched.phases:
        out, here = [], set()
        for r in ph.requests:
            ident = (r.length, r.shape, r.seed)
            if (r.source == "warm" and ident not in earlier) or \
                    (r.source == "copy" and ident not in here):
                r = FuzzRequest("new", r.length, r.shape, r.seed, r.max_tokens, r.stream, r.why)
            out.append(r)
            here.add(ident)
        phases.append(FuzzPhase(ph.concurrency, tuple(out)))
        earlier |= here
    return Schedule(tuple(phases))


# -- running ----------------------------------------------------------------------------------
class _Abort(BaseException):
    """Carries an engine error / interrupt through hypothesis (which would shrink an Exception)."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class _PropertyFailed(AssertionError):
    pass


@register
class Fuzz(Scenario):
    kind = "fuzz"
    summary = "property-based schedules (hypothesis) from the engine facts, shrunk to repro.toml"
    Params = FuzzParams

    def planned_phases(self) -> int:
        return 0  # unknown in advance

    def validate_against(self, facts) -> None:
        build_space(facts, self.params)

    # prompts ---------------------------------------------------------------------------------
    def _prompt(self, ctx: "RunContext", r: FuzzRequest) -> Prompt:
        key = (r.length, r.shape, r.seed)
        p = self._prompts.get(key)
        if p is None:
            if r.shape == "chat":
                p = self._builder.build(INSTRUCTION, r.length, key=f"fuzz-chat-len{r.length}",
                                        why=r.why)
            else:
                vocab = int(ctx.facts.get("vocab_size") or 256)
                h = int(hashlib.sha256(f"{r.length}/{r.seed}".encode()).hexdigest()[:8], 16)
                (raw,) = seeded_prompts(h, 1, r.length, r.length, min(16, vocab - 1), vocab)
                p = Prompt(key=f"fuzz-len{r.length}-s{r.seed}", ids=raw.ids, why=r.why)
            self._prompts[key] = p
        return p

    def specs(self, ctx: "RunContext", sched: Schedule) -> list[list["RequestSpec"]]:
        """The schedule's requests, phase by phase (default checks on each)."""
        from ..request import RequestSpec
        out = []
        for ph in sched.phases:
            out.append([RequestSpec(self._prompt(ctx, r), r.max_tokens, stream=r.stream,
                                    note=f"fuzz {r.source} {r.why}"
                                         + ("" if r.stream else " (non-streamed)"))
                        for r in ph.requests])
        return out

    def run_example(self, ctx: "RunContext", sched: Schedule, label: str) -> dict[str, Any]:
        """Run one schedule (references first, then each phase); returns its table row.
        Raises :class:`_Abort` on an engine error or interrupt."""
        start_ph, start_rq = len(ctx.manifest.phases), len(ctx.manifest.requests)
        t0 = time.monotonic()
        try:
            phases = self.specs(ctx, sched)
            ctx.take_references([s for ph in phases for s in ph], phase_name=f"{label}/references")
            for i, (ph, specs) in enumerate(zip(sched.phases, phases), 1):
                ctx.run_phase(f"{label}/p{i}", ph.concurrency, specs)
        except BaseException as exc:  # engine died, timeout abort, interrupt: not a property
            raise _Abort(exc) from exc  # failure, never shrunk
        new_phases = ctx.manifest.phases[start_ph:]
        reqs = ctx.manifest.requests[start_rq:]
        bad = [r for r in reqs if r.divergence and r.divergence.get("fails")
               or (r.error and not r.error_expected)
               or any(c.status == "fail" and c.name != "parity" for c in r.checks)
               or (r.match is False and not r.divergence)]
        failed = any(p.status == "fail" for p in new_phases)
        return {"example": label, "key": sched.key(), "phases": len(sched.phases),
                "requests": sum(len(p.requests) for p in sched.phases),
                "schedule": sched.summary(), "status": "fail" if failed else "pass",
                "failing_requests": [f"{r.id} ({r.phase}, C{r.concurrency}, len "
                                     f"{r.prompt_len}, max_tokens {r.max_tokens})" for r in bad],
                "wall_s": round(time.monotonic() - t0, 3)}

    def _delete_pass(self, ctx, sched: Schedule, memo: dict, state: dict, examples: list,
                     steps: list, live, t_start: float) -> Schedule:
        """After hypothesis: delete whole phases, then single requests (the phase's concurrency
        one lower), greedily, keeping each deletion that still fails in one of two runs (stages
        ``delete`` / ``delete-retry``; within
        ``shrink_budget_s`` of the first failure). Hypothesis' shrinker can leave a harmless
        leading phase that it cannot delete without reshaping later draws."""
        def fails(cand: Schedule) -> bool:
            k = cand.key()
            tries = 0
            # a candidate that passes is run once more: a timing-dependent fault (e.g. "while
            # >= 3 in flight") can miss one run of a schedule that does trigger it
            while tries < 2 and (k not in memo or (memo[k]["status"] == "pass" and tries)):
                if time.monotonic() - state["first_fail_t"] > self.params.shrink_budget_s:
                    return False
                tries += 1
                state["n"] += 1
                row = self.run_example(ctx, cand, f"ex{state['n']}")
                row.update(stage="delete" if tries == 1 else "delete-retry",
                           elapsed_s=round(time.monotonic() - t_start, 3))
                memo[k] = row
                examples.append(row)
                if row["status"] == "fail":
                    state["failures"] += 1
                    steps.append({"step": len(steps), "example": row["example"],
                                  "phases": row["phases"], "requests": row["requests"],
                                  "schedule": row["schedule"]})
                live()
                ctx.save()
                if row["status"] == "fail":
                    break
            return memo[k]["status"] == "fail"

        i = 0
        while i < len(sched.phases) and len(sched.phases) > 1:
            cand = relabel(Schedule(sched.phases[:i] + sched.phases[i + 1:]))
            if fails(cand):
                sched = cand
            else:
                i += 1
        for i in range(len(sched.phases)):
            j = 0
            while j < len(sched.phases[i].requests) and len(sched.phases[i].requests) > 1:
                ph = sched.phases[i]
                reqs = ph.requests[:j] + ph.requests[j + 1:]
                cand = relabel(Schedule(sched.phases[:i] + (FuzzPhase(len(reqs), reqs),)
                                        + sched.phases[i + 1:]))
                if fails(cand):
                    sched = cand
                else:
                    j += 1
        return sched

    def run(self, ctx: "RunContext") -> None:
        from hypothesis import HealthCheck, Phase, given, seed, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
        from hypothesis.errors import HypothesisException

        from .shared.chat import ChatParams, builder
        p = self.params
        run_dir = Path(ctx.manifest_path).parent
        space = build_space(ctx.facts.values if hasattr(ctx.facts, "values") else ctx.facts, p)
        self._prompts: dict[tuple, Prompt] = {}
        if p.chat:
            try:
                self._builder = builder(ctx, ChatParams())
                space.chat_min = len(self._builder.template(INSTRUCTION))
            except Exception as exc:  # noqa: BLE001 - no /tokenize: random prompts only
                ctx.console.print(f"fuzz: chat-shaped prompts off ({exc})")
        db_path = Path(p.db) if p.db else run_dir / "hypothesis-db"
        tables = ctx.manifest.tables
        examples = tables.setdefault("fuzz_examples", [])
        steps = tables.setdefault("fuzz_shrink_steps", [])
        memo: dict[str, dict] = {}
        state = {"n": 0, "failures": 0, "skipped": 0, "first_fail_t": None, "minimal": None}
        t_start = time.monotonic()
        task = None
        if ctx.progress is not None:
            task = ctx.progress.add_task("fuzz", total=p.max_examples)

        def live() -> None:
            if task is not None:
                ctx.progress.update(task, completed=min(state["n"], p.max_examples),
                                    description=f"fuzz: {state['n']} examples, "
                                    f"{state['failures']} failing, "
                                    f"{time.monotonic() - t_start:.0f} s")

        def prop(sched: Schedule) -> None:
            k = sched.key()
            if k in memo:  # hypothesis replays: the engine result is kept, not re-run
                row = memo[k]
            else:
                now = time.monotonic()
                shrinking = state["first_fail_t"] is not None
                over = (p.time_budget_s is not None and not shrinking
                        and now - t_start > p.time_budget_s) or \
                       (shrinking and now - state["first_fail_t"] > p.shrink_budget_s)
                if over:
                    state["skipped"] += 1
                    return  # not run: out of time (counted, never a pass in the tables)
                state["n"] += 1
                row = self.run_example(ctx, sched, f"ex{state['n']}")
                row["stage"] = "shrink" if shrinking else "search"
                row["elapsed_s"] = round(time.monotonic() - t_start, 3)
                memo[k] = row
                examples.append(row)
                if row["status"] == "fail":
                    state["failures"] += 1
                    if state["first_fail_t"] is None:
                        state["first_fail_t"] = time.monotonic()
                        state["examples_to_failure"] = state["n"]
                    steps.append({"step": len(steps), "example": row["example"],
                                  "phases": row["phases"], "requests": row["requests"],
                                  "schedule": row["schedule"]})
                    state["minimal"] = sched  # hypothesis only tries smaller ones from here
                live()
                ctx.save()
            if row["status"] == "fail":
                state["last_fail"] = sched
                raise _PropertyFailed(f"{row['example']}: {row['schedule']}")

        test = given(schedules(space))(prop)
        test = seed(p.seed)(test)
        test = settings(max_examples=p.max_examples, deadline=None, derandomize=False,
                        database=DirectoryBasedExampleDatabase(str(db_path)),
                        phases=[Phase.explicit, Phase.reuse, Phase.generate]
                        + ([Phase.shrink] if p.shrink else []),
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                        print_blob=False)(test)
        minimal: Schedule | None = None
        first_phase = len(ctx.manifest.phases)
        live()
        try:
            test()
        except _Abort as a:
            if task is not None:
                ctx.progress.remove_task(task)
            raise a.exc from None
        except _PropertyFailed:
            minimal = state.get("last_fail") or state["minimal"]
        except HypothesisException as exc:  # e.g. Flaky: keep the smallest failure seen
            ctx.console.print(f"fuzz: hypothesis: {exc.__class__.__name__}: {exc}")
            minimal = state["minimal"]
        if minimal is not None and p.shrink:
            try:
                minimal = self._delete_pass(ctx, minimal, memo, state, examples, steps, live,
                                            t_start)
            except _Abort as a:
                if task is not None:
                    ctx.progress.remove_task(task)
                raise a.exc from None
        if task is not None:
            ctx.progress.remove_task(task)
        elapsed = time.monotonic() - t_start
        run_walls = [r["wall_s"] for r in examples]
        summary = {"examples_run": state["n"], "failing_examples": state["failures"],
                   "examples_to_failure": state.get("examples_to_failure"),
                   "skipped_out_of_time": state["skipped"], "seed": p.seed,
                   "max_examples": p.max_examples, "time_budget_s": p.time_budget_s,
                   "database": str(db_path), "elapsed_s": round(elapsed, 3),
                   "s_per_example": round(sum(run_walls) / len(run_walls), 3) if run_walls
                   else None, "repro": None, "minimal_schedule": None, "confirmed": None,
                   "space": {"q": space.q, "lengths": [x for x, _ in space.lengths],
                             "uniform_max_len": space.max_len,
                             "concurrency_edges": space.concurrency_edges,
                             "max_concurrency": space.max_concurrency,
                             "chat_min_len": space.chat_min}}
        if minimal is not None:
            repro = run_dir / "repro.toml"
            write_repro(self.specs(ctx, minimal), minimal, repro, ctx.manifest.run_id)
            summary.update(repro=str(repro), minimal_schedule=minimal.summary())
            tables["fuzz_failing"] = [
                {"phase": i, "concurrency": ph.concurrency, "source": r.source,
                 "prompt_len": r.length, "why": r.why, "shape": r.shape, "seed": r.seed,
                 "max_tokens": r.max_tokens, "stream": r.stream}
                for i, ph in enumerate(minimal.phases, 1) for r in ph.requests]
            ctx.console.print(f"fuzz: minimal failing schedule {minimal.summary()} "
                              f"(after {len(steps)} failing example(s)); reproducer: {repro}")
            if p.confirm:
                row = self.run_example(ctx, minimal, "confirm")
                row["stage"] = "confirm"
                examples.append(row)
                summary["confirmed"] = row["status"] == "fail"
        else:
            ctx.console.print(f"fuzz: {state['n']} examples passed in {elapsed:.0f} s")
        tables["fuzz_summary"] = [summary]
        ctx.manifest.summary["phases_planned"] = ctx.manifest.summary.get("phases_planned", 0) + \
            sum(1 for ph in ctx.manifest.phases[first_phase:] if ph.role == "load")
        ctx.save()


def write_repro(phases: list[list["RequestSpec"]], sched: Schedule, path: Path,
                run_id: str) -> None:
    """The schedule as a ``replay`` scenario file at ``path`` (token-ID prompts, max_tokens, one
    ``[[params.phases]]`` per phase with its concurrency)."""
    from ..manifest import write_atomic
    lines = [f"# ple-harness fuzz {run_id}: minimal failing schedule {sched.summary()}",
             f"# Replay: ple-harness stress --scenario {path.name} (with the run's engine "
             "arguments, or --url and its facts)",
             'kind = "replay"', f'description = "fuzz {run_id}: {sched.summary()}"']
    for i, (ph, specs) in enumerate(zip(sched.phases, phases), 1):
        lines += ["", "[[params.phases]]", f'name = "fuzz-p{i}-C{ph.concurrency}"',
                  f"concurrency = {ph.concurrency}"]
        for r, s in zip(ph.requests, specs):
            note = (f"{r.source} len {r.length} ({r.why}); max_tokens "
                    f"{r.max_tokens}").replace('"', "'")
            lines += ["", "[[params.phases.requests]]",
                      f"prompt = {json.dumps(list(s.prompt.ids))}",
                      f"max_tokens = {s.max_tokens}", f"stream = {str(r.stream).lower()}",
                      f'note = "{note}"']
    write_atomic(path, "\n".join(lines) + "\n")
