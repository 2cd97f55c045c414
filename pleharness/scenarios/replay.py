"""Scenario kind ``replay``: an explicit schedule, request by request (what ``ple-harness explain``
writes as a one-file reproducer, and what a maintainer can edit by hand).

Schedule: every distinct (prompt, max_tokens) alone first (single-request references, warm by
default like every scenario), then the phases in order, each at its concurrency with exactly its
requests. Every output is compared with its reference. File shape::

    kind = "replay"
    [[params.phases]]
    name = "C4-with-companions"
    concurrency = 4
    [[params.phases.requests]]
    prompt = [16, 402, ...]      # token IDs
    max_tokens = 32

Params: ``phases`` (list of {name, concurrency, requests: [{prompt, max_tokens, note, stream,
temperature, seed, insert_into, insert_after_tokens, checks, <per-request parameters>}]};
``stream`` defaults to true, temperature to 0 (greedy; a sampled request needs a ``seed``);
``checks``: reference-free checks run on the output beside the default ones, as a table {check
name = {params}}, e.g. ``checks = { expected_text = { regex = '^\\s*OK' } }``). The per-request
parameters (issue 35; what ``fuzz`` draws, :mod:`.fuzz_features`), each as
:class:`~pleharness.request.RequestSpec` sends it and part of the reference key where it is
there: ``logprobs`` (top-k, 0..20), ``ignore_eos`` (default true), ``stop`` (strings),
``repetition_penalty`` (> 0), ``frequency_penalty`` / ``presence_penalty`` (-2..2),
``logit_bias`` (a table {"token ID" = bias in -100..100}), ``stop_token_ids``, ``min_tokens``
(<= max_tokens), ``prompt_logprobs`` (0..20, non-streamed requests only), ``echo`` (with
``logprobs``), ``skip_special_tokens`` (false: the text keeps special tokens; check
``special_tokens``), ``messages`` (``[{ role = "user", content = "..." }]``: sent to
/v1/chat/completions, streamed, and compared with the /v1/completions reference of ``prompt``,
the IDs the chat template made of them; no ``stop``, ``prompt_logprobs`` or ``echo``),
``structured_outputs`` (one of ``{ json = {...} }``, ``{ regex = "..." }``, ``{ choice =
["...", ...] }``; needs ``ignore_eos = false``), ``expected`` (``{ ids = [...], margins = [...],
source = "..." }``: the answer another configuration gave to this request alone, greedy; the
output is judged against it by the run's rule, check ``control_answer``: what ``explain``
writes for a run whose control answered differently, issue 47). The
stop check ``stop_token`` runs on a request with stop_token_ids, min_tokens or ignore_eos off,
the ``prompt_logprobs`` rules on one with prompt_logprobs, ``stop_string`` on one with stop,
``constrained`` on one with structured_outputs, ``special_tokens`` on one with
skip_special_tokens false. A request with ``insert_into = j`` and
``insert_after_tokens = N`` is an *insert*: it is sent once request j of its phase (the carrier,
streamed) has streamed N tokens (:mod:`pleharness.scenarios.shared.inserting`); ``concurrency`` then
counts the other requests, and the inserts come on top (what ``ple-harness fuzz`` writes). Phase
check ``inserts_landed``: each insert's first token came before the carrier's last (it reached
the engine while the carrier ran); a warning, and the phase vacuous, when not (a passing replay
is then inconclusive, never "not reproduced").

Every run of a prompt is judged, cold ones included: each distinct (prompt, max_tokens,
sampling) runs alone first (cold; with the default warm references a second, warm run is
compared with it), and every later run in the phases is compared with that reference, all within
this run on this engine (no reference cached from anything that ran before it); with a golden
model every divergence is also judged by it (and ``--reference golden`` makes the golden
continuation the reference). Order of runs: the references (cold, then warm), then the phases
in file order.

``failed`` (optional, written by ``fuzz`` and ``explain``): the comparisons that failed where
the reproducer came from, each ``{phase, request, run, compared_with, first_divergence,
expected_token, observed_token, detail}`` (``phase`` a phase name of this file or
``references``; ``request`` the index in it; ``run`` e.g. ``load`` or ``warm reference (2nd solo
run)``). The replay says for each whether it failed again (table ``replay_failed_comparisons``).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from ..checks import REGISTRY
from ..checks.constrained import KINDS, constraint_problem
from ..checks.constrained import NAME as CON
from ..checks.prompt_logprobs import NAME
from ..differential import NAME as CONTROL_ANSWER
from ..divergence import Rule, compare_outputs
from ..engine.facts import as_facts
from ..manifest import CheckResult
from ..prompts import Prompt
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register
from .shared.inserting import landing_check, run_phase_with_inserts

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext


class ChatMessage(Params):
    """One message of a chat request: ``role`` (system | user | assistant) and ``content``."""

    role: Literal["system", "user", "assistant"]
    content: str


class ExpectedAnswer(Params):
    """The answer another configuration (the run's control, or another build) gave to this
    request alone, greedy (issue 47: a defect that corrupts every run alike is seen only
    against it): its token IDs, its top-1/top-2 margins (nats, per position; None where
    unknown) and where it came from. The replay judges the output against it by the run's
    rule (:func:`pleharness.divergence.compare_outputs`), its near-tie threshold raised to
    ``threshold_nats`` (the control margin a difference had to reach to be hard in the run it
    came from: that run's envelope between the two configurations): check ``control_answer``."""

    ids: list[int] = Field(min_length=1)
    margins: list[float | None] | None = None
    source: str = ""
    threshold_nats: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _unknown(self):
        """A margin written as ``nan`` (TOML has no null) is unknown."""
        if self.margins:
            self.margins = [None if m is None or m != m else m for m in self.margins]
        return self


class ReplayRequest(Params):
    """One request of a replayed phase: prompt token IDs, max_tokens, note, streamed or not."""

    prompt: list[int] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=1_000_000)
    note: str = ""
    stream: bool = True  # False: one JSON response (fuzz reproducers draw both)
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    insert_into: int | None = Field(None, ge=0, description="index of this phase's carrier")
    insert_after_tokens: int | None = Field(None, ge=1)
    checks: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "checks beside the default ones: {check name: params}"))
    logprobs: int | None = Field(None, ge=0, le=20)
    ignore_eos: bool = True
    stop: list[str] | None = Field(None, min_length=1)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(None, description='{"token ID" = bias}')
    stop_token_ids: list[int] | None = Field(None, min_length=1)
    min_tokens: int | None = Field(None, ge=1, le=1_000_000)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    skip_special_tokens: bool = True
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    structured_outputs: dict[str, Any] | None = Field(None, description=(
        "the output's constraint, one key: { json = {schema} }, { regex = \"...\" } or "
        "{ choice = [\"...\", ...] }"))
    expected: ExpectedAnswer | None = None

    @model_validator(mode="after")
    def _params(self):
        """The per-request parameters' own rules (module docstring), each error naming its key."""
        for t, b in (self.logit_bias or {}).items():
            if not t.strip().isdigit():
                raise ValueError(f"logit_bias: key {t!r} is not a token ID (a string of digits, "
                                 'e.g. { "17" = -100.0 })')
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias: bias {b} of token {t} is outside -100..100")
        if any(not x for x in self.stop or ()):
            raise ValueError("stop: an empty string (it would stop before the first token, or "
                             "be ignored: nothing to check)")
        if any(t < 0 for t in self.stop_token_ids or ()):
            raise ValueError("stop_token_ids: token IDs are >= 0")
        if self.min_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} exceeds max_tokens {self.max_tokens}")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs needs stream = false (vLLM refuses prompt "
                             "logprobs on a streamed request)")
        if self.echo and self.logprobs is None:
            raise ValueError("echo needs logprobs (the prompt's scores come with them)")
        if self.structured_outputs is not None:
            if len(self.structured_outputs) != 1:
                raise ValueError(f"structured_outputs: one key of {', '.join(KINDS)}, not "
                                 f"{sorted(self.structured_outputs) or 'none'}")
            ((kind, con),) = self.structured_outputs.items()
            why = constraint_problem(kind, con)
            if why:
                raise ValueError(f"structured_outputs: {why}")
            if self.ignore_eos:
                raise ValueError("structured_outputs needs ignore_eos = false (with EOS "
                                 "ignored the engine decodes past the constraint's end)")
        if self.messages:
            bad = [k for k, v in (("stream = false", not self.stream), ("stop", self.stop),
                                  ("prompt_logprobs", self.prompt_logprobs is not None),
                                  ("echo", self.echo)) if v]
            if bad:
                raise ValueError(f"messages (the chat path, always streamed) cannot take "
                                 f"{', '.join(bad)}")
        return self

    @model_validator(mode="after")
    def _pairs(self):
        unknown = sorted(set(self.checks) - set(REGISTRY))
        if unknown:
            raise ValueError(f"checks: unknown check {unknown[0]!r} (known: "
                             f"{', '.join(sorted(REGISTRY))})")
        if (self.insert_into is None) != (self.insert_after_tokens is None):
            raise ValueError("insert_into and insert_after_tokens go together")
        if self.temperature > 0 and self.seed is None:
            raise ValueError("a sampled request (temperature > 0) needs a seed: an unseeded "
                             "sample has no reference to equal")
        return self


class ReplayPhase(Params):
    """One replayed phase: its name, concurrency and requests, in order."""

    name: str = Field(min_length=1)
    concurrency: int = Field(ge=1, le=1024)
    requests: list[ReplayRequest] = Field(min_length=1)

    @model_validator(mode="after")
    def _inserts(self):
        ins = [r for r in self.requests if r.insert_into is not None]
        if not ins:
            if self.concurrency > len(self.requests):
                raise ValueError(f"concurrency {self.concurrency} with {len(self.requests)} "
                                 f"request(s): at most {len(self.requests)} can be in flight")
            return self
        carriers = {r.insert_into for r in ins}
        if len(carriers) > 1:
            raise ValueError("the inserts of a phase must name one carrier (insert_into)")
        (c,) = carriers
        if c >= len(self.requests) or self.requests[c].insert_into is not None:
            raise ValueError(f"insert_into {c}: not a request of this phase that is not itself "
                             "an insert")
        car = self.requests[c]
        if not car.stream:
            raise ValueError(f"insert_into {c}: the carrier must be streamed (stream = true)")
        for r in ins:
            if r.insert_after_tokens >= car.max_tokens:
                raise ValueError(f"insert_after_tokens {r.insert_after_tokens} must be below "
                                 f"the carrier's max_tokens {car.max_tokens}")
        if self.concurrency != len(self.requests) - len(ins):
            raise ValueError(f"concurrency {self.concurrency}: with inserts it must equal the "
                             f"number of requests that are not inserts "
                             f"({len(self.requests) - len(ins)}); the inserts come on top")
        return self


class FailedComparison(Params):
    """A comparison that failed where the reproducer came from (see the module docstring)."""

    phase: str = Field(min_length=1)
    request: int | None = Field(None, ge=0)
    run: str = "load"
    compared_with: str = ""
    prompt_len: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    first_divergence: int | None = Field(None, ge=0)
    expected_token: int | None = None
    observed_token: int | None = None
    detail: str = ""


class FailedComparisonRow(TableRow):
    """One row of ``replay_failed_comparisons``: a failed comparison of the file (the fields of
    :class:`FailedComparison`), ``reproduced`` (True / False / None when the request is not in
    this replay) and ``here`` (what this replay saw)."""

    phase: str
    request: int | None
    run: str
    compared_with: str
    prompt_len: int | None
    max_tokens: int | None
    first_divergence: int | None
    expected_token: int | None
    observed_token: int | None
    detail: str
    reproduced: bool | None
    here: str


class ReplayParams(Params):
    """Parameters of ``replay``: the phases to replay (names unique) and, optionally, the
    comparisons that failed where the file came from (``failed``)."""

    phases: list[ReplayPhase] = Field(min_length=1)
    failed: list[FailedComparison] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self):
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError("phase names must be distinct")
        bad = sorted({f.phase for f in self.failed if f.phase not in names})
        if bad:
            raise ValueError(f"failed: phase {', '.join(bad)} is not one of the phases "
                             f"({', '.join(names)})")
        for ph in self.phases:
            for i, r in enumerate(ph.requests):
                rx = (r.checks.get("expected_text") or {}).get("regex")
                if isinstance(rx, str):
                    try:
                        re.compile(rx)
                    except re.error as exc:
                        raise ValueError(f"phase {ph.name} request {i}: checks.expected_text."
                                         f"regex {rx!r}: not a regular expression ({exc})")
        return self


def _structured(so: dict[str, Any] | None) -> tuple[str, Any] | None:
    """``RequestSpec.structured`` of a request's ``structured_outputs`` table (validated:
    one key), a choice's list as a tuple; None without one."""
    if not so:
        return None
    ((kind, con),) = so.items()
    return kind, tuple(con) if kind == "choice" else con


def prompt_of(ids: list[int]) -> Prompt:
    """A :class:`~pleharness.prompts.Prompt` keyed by its length and hash prefix."""
    p = Prompt(key="", ids=tuple(ids))
    return Prompt(key=f"replay-len{len(ids)}-{p.hash[:8]}", ids=tuple(ids))


@register
class Replay(Scenario):
    """Kind ``replay``: see the module docstring (one phase per ``params.phases`` item)."""

    kind = "replay"
    summary = "an explicit schedule of phases and token-ID prompts (explain's reproducers)"
    Params = ReplayParams
    tables = {"replay_failed_comparisons": FailedComparisonRow}

    def planned_phases(self) -> int:
        return len(self.params.phases)

    def unfit(self, facts) -> dict[int, str]:
        """{phase index: why it cannot run on an engine with ``facts`` (EngineFacts or a dict
        of values)}: a request of it does not fit max_model_len, or holds a token ID outside
        [0, V) (prompt, stop_token_ids, logit_bias). Such a phase is left out (vacuous, with
        the reason naming ``params.phases[i].requests[j]``): this reproducer was written on
        another engine configuration."""
        facts = as_facts(facts)
        m, v = facts.max_model_len, facts.vocab_size
        out: dict[int, str] = {}
        for i, ph in enumerate(self.params.phases):
            for j, r in enumerate(ph.requests):
                where = f"params.phases[{i}].requests[{j}]"
                why = None
                if m is not None and len(r.prompt) + r.max_tokens > int(m):
                    why = (f"{where}: prompt + max_tokens = {len(r.prompt) + r.max_tokens} "
                           f"exceeds max_model_len {m}")
                elif v is not None and any(not 0 <= t < int(v) for t in r.prompt):
                    why = f"{where}.prompt: token IDs outside [0, {v})"
                for key, ids in (("stop_token_ids", r.stop_token_ids or ()),
                                 ("logit_bias", [int(t) for t in r.logit_bias or {}])):
                    if why is None and v is not None and any(not 0 <= t < int(v) for t in ids):
                        why = f"{where}.{key}: token IDs outside [0, {v})"
                if why is not None:
                    out[i] = why
                    break
        return out

    @staticmethod
    def _spec(r: ReplayRequest) -> RequestSpec:
        """The request of ``r``: its prompt, sampling and delivery, the default checks plus
        ``r.checks``."""
        spec = RequestSpec(
            prompt_of(r.prompt), r.max_tokens, note=r.note or None, stream=r.stream,
            temperature=r.temperature, seed=r.seed if r.temperature > 0 else None,
            logprobs=r.logprobs, ignore_eos=r.ignore_eos,
            stop=tuple(r.stop) if r.stop else None,
            repetition_penalty=r.repetition_penalty, frequency_penalty=r.frequency_penalty,
            presence_penalty=r.presence_penalty,
            logit_bias=tuple((int(t), float(b)) for t, b in r.logit_bias.items())
            if r.logit_bias else None,
            stop_token_ids=tuple(r.stop_token_ids) if r.stop_token_ids else None,
            min_tokens=r.min_tokens, prompt_logprobs=r.prompt_logprobs, echo=r.echo,
            skip_special_tokens=r.skip_special_tokens,
            messages=tuple((m.role, m.content) for m in r.messages) if r.messages else None,
            structured=_structured(r.structured_outputs))
        if (spec.stop_token_ids or spec.min_tokens or not spec.ignore_eos) and not spec.stop:
            spec.checks["stop_token"] = {}  # a stop string ends with "stop" on no stop ID
        if not spec.skip_special_tokens:
            spec.checks["special_tokens"] = {}
        if spec.stop:
            spec.checks["stop_string"] = {}
        if spec.prompt_logprobs is not None or spec.echo:
            spec.checks[NAME] = {}
        if spec.structured is not None:
            spec.checks[CON] = {}
        spec.checks.update({name: dict(params) for name, params in r.checks.items()})
        return spec

    def run(self, ctx: "ScenarioContext") -> None:

        phases = [[self._spec(r) for r in ph.requests] for ph in self.params.phases]
        unfit = self.unfit(ctx.facts)
        start = ctx.mark()
        ctx.take_references([s for i, specs in enumerate(phases) if i not in unfit
                             for s in specs], phase_name="replay-references")
        records: dict[str, list] = {"references": list(ctx.since(start)[1])}
        for i, (ph, specs) in enumerate(zip(self.params.phases, phases)):
            if i in unfit:
                ctx.leave_out(ph.name, f"this engine cannot run it: {unfit[i]}", ph.concurrency)
                continue
            ins = [(s, r.insert_after_tokens) for r, s in zip(ph.requests, specs)
                   if r.insert_into is not None]
            expect = {id(s): r.expected for r, s in zip(ph.requests, specs) if r.expected}
            if not ins:
                outs = ctx.run_phase(ph.name, ph.concurrency, specs,
                                     on_outcome=lambda o, e=expect: _against_expected(ctx, o, e))
            else:
                carrier = specs[next(r.insert_into for r in ph.requests
                                     if r.insert_into is not None)]
                plain = [s for r, s in zip(ph.requests, specs) if r.insert_into is None]
                outs, trig = run_phase_with_inserts(ctx, ph.name, ph.concurrency, plain,
                                                    carrier, ins)
                landing_check(ctx, trig, outs)
            by_spec = {id(o.spec): o.record for o in outs or []}
            records[ph.name] = [by_spec.get(id(s)) for s in specs]
        if self.params.failed:
            self.put_table(ctx, "replay_failed_comparisons",
                           [judge_failed(f, records) for f in self.params.failed])

    @classmethod
    def markdown(cls, m) -> list[str]:
        rows = cls.table(m, "replay_failed_comparisons")
        if not rows:
            return []
        out = ["", "### The comparisons that failed where this reproducer came from", "",
               "| phase | request | run | compared with | there: first divergence | "
               "here |", "|---|---:|---|---|---:|---|"]
        for r in rows:
            out.append(f"| {r.phase} | {r.request if r.request is not None else '-'} "
                       f"| {r.run} | {r.compared_with} | "
                       f"{r.first_divergence if r.first_divergence is not None else '-'} "
                       f"| {r.here} |")
        return out


def _against_expected(ctx: "ScenarioContext", o, expected: dict) -> None:
    """Judge outcome ``o`` against its request's expected answer (:class:`ExpectedAnswer`), if
    it has one, by the run's rule: check ``control_answer`` (fail when hard), the divergence
    kept as the record's ``differential``."""
    e = expected.get(id(o.spec))
    if e is None or o.completion.error is not None or o.spec.temperature:
        return
    tie = max(ctx.near_tie_nats, e.threshold_nats or 0.0)
    d = compare_outputs(e.ids, o.completion.token_ids, Rule(tie, ctx.strict), e.margins)
    if d is None:
        o.record.checks.append(CheckResult(name=CONTROL_ANSWER, status="pass",
                                           detail=f"equals the answer of {e.source or 'the file'}"))
        return
    o.record.differential = d
    o.record.checks.append(CheckResult(
        name=CONTROL_ANSWER, status="fail" if d.fails else "warn",
        detail=f"differs from the answer of {e.source or 'the file'} at token position "
               f"{d.position} ({d.cls}: expected {d.reference_token}, got {d.observed_token})"))


def judge_failed(f: FailedComparison, records: dict[str, list]) -> FailedComparisonRow:
    """Whether the failed comparison ``f`` failed again in this replay: ``records`` maps a
    phase name (and ``references``: the reference phases' records, in order) to its records, a
    phase's in file order. Returns ``f``'s row with ``reproduced`` (True / False / None when
    the request is not in this replay) and ``here`` (what this replay saw)."""
    def row(reproduced: bool | None, here: str) -> FailedComparisonRow:
        return FailedComparisonRow(**f.model_dump(), reproduced=reproduced, here=here)
    recs = records.get(f.phase)
    if recs is None:
        return row(None, "phase not in this replay")
    if f.phase == "references" or f.request is None:
        cands = [r for r in recs if r is not None and (f.prompt_len is None or
                                                      r.prompt_len == f.prompt_len)
                 and (f.max_tokens is None or r.max_tokens == f.max_tokens)]
    else:
        cands = [recs[f.request]] if f.request < len(recs) and recs[f.request] else []
    if not cands:
        return row(None, "request not in this replay")
    bad = [r for r in cands if r.is_problem]
    if bad:
        r = bad[0]
        pos = r.first_divergence
        return row(True, f"failed again ({r.id}"
                   + (f", first divergence {pos}" if pos is not None else "") + ")")
    return row(False, f"passed ({', '.join(r.id for r in cands[:3])})")
