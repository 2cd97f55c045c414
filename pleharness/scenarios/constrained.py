"""Scenario kind ``constrained``: constrained output (vLLM's ``structured_outputs``: a JSON
Schema, a regex, a choice) alone and in flight beside unconstrained greedy requests, with the
engine's speculative decoding if it has it (issue 35 item 3).

Public reports show structured output broken under batching or speculative decoding: a
grammar's token mask applied to the wrong batch row (a constrained output that does not parse,
or an unconstrained neighbour cut or changed), or draft tokens accepted past what the grammar
allows. What vLLM 0.32 accepts and was measured to do is in docs/constrained-output.md.

1. Probe (not recorded as a request): one request constrained to a single choice must answer
   exactly that text. An engine that refuses ``structured_outputs`` (HTTP 4xx) or ignores it
   (older vLLM versions read ``guided_json`` / ``guided_regex`` / ``guided_choice`` instead;
   0.32 ignores those) leaves the kind out with the reason in ``constrained_notes``.
2. One prompt per constraint of ``constraints`` and ``neighbours`` neighbour prompts: seeded
   English-like text (``/tokenize`` makes the IDs). Text, not random IDs: vLLM's incremental
   detokenizer puts leftover bytes of a prompt that ends inside a UTF-8 sequence in front of
   the first output text, which no constraint sees (measured on the embedded model). A
   constrained request is greedy, ``ignore_eos`` off (with it on, the engine runs past the
   grammar's end: EOS IDs, text appended), ``max_tokens`` tokens at most; a neighbour is a plain
   greedy request of ``neighbour_tokens`` tokens (``ignore_eos`` on).
3. References: each request alone (streamed). A constraint whose solo request failed is left
   out of the load phases, with the engine's answer in table ``constrained``.
4. Phases ``constrained-c<C>`` (constrained requests streamed, each before a neighbour) and
   ``constrained-c<C>-swapped`` (non-streamed, each after a neighbour): ``concurrency`` in
   flight. Every constrained output is checked by ``constrained`` (it conforms; where its solo
   request finished within ``max_tokens``, it must finish too: ``must_finish``) and compared
   with its solo reference (parity), as every neighbour is with its own.

Table ``constrained``: per constrained request of the load phases, the constraint, prompt,
phase, delivery, output text, finish_reason, the ``constrained`` check's status and parity; a
constraint left out has one row saying why. Neither phase counts for throughput (short outputs
that end at EOS).
"""
from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from ..checks import DEFAULT_CHECKS
from ..checks.constrained import KINDS, NAME, constraint_problem, describe
from ..errors import EngineError
from ..prompts import Prompt
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext

PROBE = "ple harness probe"  # the one choice of the probe request
WORDS = ("the a of box red cat item answer colour number say pick one two three is was with "
         "for and question reply short list name").split()
DEFAULT_CONSTRAINTS = [
    {"regex": "(cat|dog|bird) [0-9]{1,2}"}, {"regex": "[0-9]{3}"},
    {"choice": ["red", "green", "blue"]},
    {"json": {"type": "string", "enum": ["x", "yy", "zzz"]}},
    {"json": {"type": "integer", "minimum": 0, "maximum": 999}},
    {"json": {"type": "string", "pattern": "^[a-c]{2,4}$"}}]


class ConstrainedParams(Params):
    """Parameters of ``constrained``: ``constraints`` (each a table of one key, ``json`` (a
    JSON Schema), ``regex`` or ``choice`` (a list of strings)), ``max_tokens`` of a constrained
    request, ``neighbours`` (unconstrained requests beside) of ``neighbour_tokens`` tokens,
    ``concurrency`` of the load phases, ``seed`` of the prompts' text."""

    constraints: list[dict[str, Any]] = Field(default_factory=lambda: [
        dict(c) for c in DEFAULT_CONSTRAINTS])
    max_tokens: int = Field(24, ge=1, le=100_000)
    neighbours: int = Field(4, ge=0, le=256)
    neighbour_tokens: int = Field(24, ge=1, le=100_000)
    concurrency: int = Field(4, ge=1, le=1024)
    seed: int = 353

    @field_validator("constraints")
    @classmethod
    def _constraints(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not v:
            raise ValueError("no constraint: give at least one {json | regex | choice = ...}")
        for i, c in enumerate(v):
            if len(c) != 1:
                raise ValueError(f"constraint {i}: one key of {', '.join(KINDS)}, not "
                                 f"{sorted(c) or 'none'}")
            (kind, spec), = c.items()
            why = constraint_problem(kind, spec)
            if why:
                raise ValueError(f"constraint {i}: {why}")
        return v


class ConstrainedRow(TableRow):
    """One constrained request of a load phase (or one constraint left out): the constraint
    (``kind``, ``constraint`` label), prompt key, phase, ``stream``, the output ``text`` and
    ``finish_reason``, the ``constrained`` check's status (``rule``), ``match`` (parity with
    the solo request; None: not compared), ``sent`` and why not."""

    kind: str
    constraint: str
    prompt_key: str
    phase: str | None = None
    stream: bool | None = None
    text: str | None = None
    finish_reason: str | None = None
    rule: str | None = None
    match: bool | None = None
    sent: bool = True
    why_not: str | None = None


def text_prompt(ctx: "ScenarioContext", key: str, rng: random.Random, words: int) -> Prompt:
    """A prompt of ``words`` seeded words and a colon, as the IDs the engine's ``/tokenize``
    makes of it (module docstring: text, not random IDs). Raises EngineError."""
    text = " ".join(rng.choice(WORDS) for _ in range(words)) + ":"
    return Prompt(key=key, ids=tuple(ctx.client.tokenize(prompt=text)), text=text)


def probe(ctx: "ScenarioContext") -> str | None:
    """Why this engine does not serve ``structured_outputs``, or None when one request
    constrained to the single choice :data:`PROBE` answered exactly that."""
    try:
        ids = list(ctx.client.tokenize(prompt="Say it:"))
    except EngineError as exc:
        return f"/tokenize failed, so no text prompt: {exc}"
    c = ctx.client.complete(ids, 16, ignore_eos=False, stream=False,
                            extra={"structured_outputs": {"choice": [PROBE]}})
    if c.error is not None:
        return (f"the engine refused structured_outputs ({c.error}"
                f"{f' {c.http_status}' if c.http_status else ''}: "
                f"{(c.error_detail or '')[:160]})")
    if c.text != PROBE:
        return (f"the engine ignores structured_outputs: a request constrained to the one "
                f"choice {PROBE!r} answered {c.text[:60]!r} (finish_reason "
                f"{c.finish_reason!r}; vLLM before structured_outputs read guided_choice, "
                "guided_regex, guided_json)")
    return None


@register
class Constrained(Scenario):
    """Kind ``constrained``: see the module docstring (two load phases; check ``constrained``;
    table ``constrained``)."""

    kind = "constrained"
    summary = ("constrained output (JSON schema, regex, choice) alone and beside unconstrained "
               "requests: every output conforms and equals the solo request's")
    Params = ConstrainedParams
    phases = 2
    tables = {"constrained": ConstrainedRow}

    def probe(self, ctx: "ScenarioContext") -> str | None:
        """Why this engine does not serve ``structured_outputs`` (:func:`probe`), or None."""
        return probe(ctx)

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        names = [(f"constrained-c{p.concurrency}", p.concurrency),
                 (f"constrained-c{p.concurrency}-swapped", p.concurrency)]
        m = ctx.facts.max_model_len
        why = self.probe(ctx)
        if why is None and m is not None and max(p.max_tokens, p.neighbour_tokens) + 8 > int(m):
            why = (f"max_tokens {max(p.max_tokens, p.neighbour_tokens)} leaves no room for a "
                   f"prompt: max_model_len is {m}")
        if why is not None:
            self.leave_out_phases(ctx, names, "constrained output not exercised: " + why)
            return
        rng = random.Random(p.seed)
        checks = {**{c: {} for c in DEFAULT_CHECKS}, NAME: {}}
        cons: list[RequestSpec] = []
        for i, c in enumerate(p.constraints):
            (kind, spec), = c.items()
            spec = tuple(spec) if kind == "choice" else spec
            pr = text_prompt(ctx, f"constrained-{i}-{kind}", rng, rng.randrange(6, 30))
            cons.append(RequestSpec(pr, p.max_tokens, ignore_eos=False, structured=(kind, spec),
                                    checks=checks, note=f"constrained: {describe(kind, spec)}"))
        nbs = [RequestSpec(text_prompt(ctx, f"constrained-nb{j}", rng, rng.randrange(8, 60)),
                           p.neighbour_tokens, note="unconstrained neighbour")
               for j in range(p.neighbours)]
        if m is not None:  # a prompt too long for this engine's max_model_len: left out
            long = [s for s in cons + nbs if len(s.prompt) + s.max_tokens > int(m)]
            if long:
                ctx.note("constrained_notes", f"{len(long)} prompt(s) left out: prompt + "
                         f"max_tokens exceeds max_model_len {m} ("
                         + ", ".join(s.prompt.key for s in long[:4]) + ")", echo=True)
            cons = [s for s in cons if s not in long]
            nbs = [s for s in nbs if s not in long]
            if not cons:
                self.leave_out_phases(ctx, names, "constrained output not exercised: no "
                                      f"constrained prompt fits max_model_len {m}")
                return
        refs = ctx.take_references(cons + nbs)
        solo = self.__dict__.setdefault("_solo_errors", {})  # kept across the suite's repeats
        solo.update({o.spec.ref_key: o.completion.error_detail or o.completion.error
                     for o in refs or () if o.completion.error is not None})
        rows: list[ConstrainedRow] = []
        sent: list[RequestSpec] = []
        for s in cons:
            kind, spec = s.structured
            if s.ref_key in solo:
                rows.append(ConstrainedRow(
                    kind=kind, constraint=describe(kind, spec), prompt_key=s.prompt.key,
                    sent=False, why_not=f"its solo request failed: {str(solo[s.ref_key])[:160]}"))
                continue
            ref = ctx.reference(s)
            finished = ref is not None and len(ref.output_ids) < s.max_tokens
            sent.append(replace(s, checks={**s.checks, NAME: {"must_finish": finished}}))
        if not sent:
            self.put_table(ctx, "constrained", rows)
            self.leave_out_phases(ctx, names, "constrained output not exercised: every "
                                  "constrained request's solo run failed")
            return
        first = [x for c, n in zip(sent, _pad(nbs, len(sent))) for x in (c, n) if x]
        swapped = [x for c, n in zip(sent, _pad(nbs, len(sent))) for x in (n, c) if x]
        swapped = [replace(x, stream=False) if x.structured else x for x in swapped]
        swapped += nbs[len(sent):]
        first += nbs[len(sent):]
        outs = []
        for name, specs in ((f"constrained-c{p.concurrency}", first),
                            (f"constrained-c{p.concurrency}-swapped", swapped)):
            res = ctx.run_phase(name, p.concurrency, specs, counts_for_throughput=False)
            if not res:
                return  # reference pass only (collect-only)
            outs += [(res.phase.name, o) for o in res if o.spec.structured]
        for phase, o in outs:
            kind, spec = o.spec.structured
            rule = next((c.status for c in o.record.checks if c.name == NAME), "not run")
            rows.append(ConstrainedRow(
                kind=kind, constraint=describe(kind, spec), prompt_key=o.spec.prompt.key,
                phase=phase, stream=o.spec.stream, text=o.completion.text,
                finish_reason=o.completion.finish_reason, rule=rule, match=o.record.match))
        self.put_table(ctx, "constrained", rows)

    @classmethod
    def markdown(cls, m) -> list[str]:
        """The "Constrained output" section of summary.md."""
        return cls.markdown_table(m, "constrained", "Constrained output", [
            ("constraint", lambda r: _cell(r.constraint)), ("prompt", "prompt_key"),
            ("phase", lambda r: r.phase or ""),
            ("delivery", lambda r: "" if r.stream is None else
             "streamed" if r.stream else "non-streamed"),
            ("text", lambda r: "" if r.text is None else _cell(repr(r.text))),
            ("finish", lambda r: r.finish_reason or ""), ("rule", lambda r: r.rule or ""),
            ("parity", lambda r: {True: "equal", False: "differs", None: ""}[r.match]),
            ("why not", lambda r: _cell(r.why_not or ""))])


def _cell(text: str) -> str:
    """``text`` for a Markdown table cell (``|`` escaped, one line)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _pad(items: list, k: int) -> list:
    """``items`` then None up to ``k`` entries (for pairing)."""
    return list(items) + [None] * max(0, k - len(items))
