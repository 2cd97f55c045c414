"""Per-request features the ``fuzz`` kind draws beside its schedules (issue 35 item 8): the
request parameters of issue 35, each drawn with a modest probability (1 in :data:`ODDS`) and
shrunk towards "absent".

A drawn :class:`Features` is abstract where a concrete value would need the engine's output: a
stop ID (``stop_at``) or a biased token (``bias_at``) is named by an output position, and
resolved when the example runs to the ID that *the same prompt's request without per-request
parameters* (same max_tokens and sampling; its solo reference, taken first) emits there
(:func:`resolve`; the stop ID is :func:`pleharness.scenarios.shared.stops.stop_id`'s, so it
fires there unless a penalty or bias changed the output first). The reproducer carries the
concrete IDs (:func:`toml_lines`), which the ``replay`` kind reads and sends.

Every drawn parameter but ``logprobs`` and the chat shape is a field of
:attr:`pleharness.request.RequestSpec.params`, hence part of the request's reference key: the
reference is the solo request with the same parameters. ``logprobs`` (top-k, 1..5) does not
change the output IDs and is not in the key (by design, RequestSpec); check ``logprob_parity``
compares the emitted tokens' logprobs with the solo reference's (present whenever the run asks
logprobs, ``--logprobs``, default 2, or the reference's request did). A chat-shaped request
(shape ``messages``, :func:`messages_prompt`) goes to ``/v1/chat/completions`` and is compared
with the ``/v1/completions`` reference of the prompt IDs its template makes (as ``chat_api``).

Which features an engine configuration gets (:func:`allowed`): ``logit_bias`` only where
speculative decoding is known to be off (vLLM refuses it with speculative decoding: "The min_p
and logit_bias sampling parameters are not yet supported with speculative decoding",
docs/stop-and-mixed.md); ``prompt_logprobs`` only on non-streamed requests (vLLM refuses it
streamed); chat-shaped requests only where the model has a chat template (``/tokenize`` of
messages answers) and always streamed (the chat path streams); ``echo`` only on non-streamed
requests, sent with ``logprobs`` (its prompt scores come in them; :data:`ECHO_LOGPROBS` when
none is drawn) and judged by the absolute ``prompt_logprobs`` rules; a stop string (``stop``)
only on chat-shaped prompts to /v1/completions (shape ``chat``: text, which check
``stop_string``'s text rule needs; the chat path sends no ``stop``), taken when the example
runs from the output of the request without parameters as the ``stop_strings`` kind takes one
(:func:`stop_string`), and dropped for that request, its note saying why, where none exists;
constrained output (``structured_outputs``, one of :data:`CONSTRAINTS`, with ``ignore_eos``
off, check ``constrained``) only on text prompts (shapes ``chat`` / ``messages``) and only where
the ``constrained`` kind's probe passes when the run starts (:func:`gate`); with chat-shaped
prompts off, neither; ``skip_special_tokens`` off (issue 52, check ``special_tokens``) on any
request but one with a stop string or a constraint. :func:`fit` resolves the conflicts (a
constraint drops stop IDs, a stop string and min_tokens; a stop string or a constraint drops
stop IDs, min_tokens and ``skip_special_tokens`` off). JSON-Schema constraints,
``top_p`` / ``top_k`` and ``n`` > 1 are not drawn (docs/fuzz.md says why).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

from ..checks.constrained import NAME as CON
from ..checks.prompt_logprobs import NAME as PLP
from ..checks.special_tokens import NAME as SPECIAL
from ..checks.stop_string import eos_ids
from ..errors import EngineError
from ..prompts import Prompt
from ..request import RequestSpec
from .constrained import probe
from .shared.stops import stop_for, stop_id

ODDS = 8  # each feature is drawn with probability 1 / ODDS (0, the shrink target: absent)
MAX_LOGPROBS = 5  # top-k of a drawn logprobs / prompt_logprobs: 1..5 (vLLM's default cap is 20)
PENALTIES = {"repetition_penalty": (1.5, 0.8), "frequency_penalty": (1.5, -1.0),
             "presence_penalty": (1.5, -1.0)}
BIASES = (-100.0, 10.0)  # a ban of the emitted token, and a push towards it
ALL = ("logprobs", "stop_token_ids", "min_tokens", "ignore_eos", "penalty", "logit_bias",
       "prompt_logprobs", "messages", "echo", "stop", "structured", "skip_special_tokens")
TEXT_SHAPES = ("chat", "messages")  # prompts that are text (a chat template's IDs)
ECHO_LOGPROBS = 1  # logprobs sent with a drawn echo when none is drawn (the prompt's scores)
# a drawn constraint: an index into these (0, the shrink target, the smallest); the regexes and
# the three-way choice are the ``constrained`` kind's (its DEFAULT_CONSTRAINTS)
CONSTRAINTS = (("choice", ("yes", "no")), ("choice", ("red", "green", "blue")),
               ("regex", "[0-9]{3}"), ("regex", "(cat|dog|bird) [0-9]{1,2}"))
CHAT_WORDS = ("the engine cache block prefill decode token batch request stream step model "
              "server graph kernel memory").split()


@dataclass(frozen=True)
class Features:
    """The per-request parameters drawn for one fuzz request (None / False: absent).

    ``logprobs``: top-k 1..5 per output token. ``stop_at``: ``stop_token_ids`` = the ID emitted
    at this output position (0-based) by the same request without parameters (:func:`resolve`).
    ``min_tokens``: 1..max_tokens. ``eos``: ``ignore_eos`` off (the model's EOS ends the
    request). ``penalty``: (name, value), one of :data:`PENALTIES`. ``bias_at`` / ``bias``: a
    ``logit_bias`` of ``bias`` (:data:`BIASES`) on the ID emitted at output position
    ``bias_at`` by the request without parameters. ``prompt_logprobs``: 0..5, non-streamed
    requests only. ``echo``: OpenAI ``echo`` (the prompt's scores lead the logprobs; with
    ``logprobs``, :data:`ECHO_LOGPROBS` when none is drawn), non-streamed requests only.
    ``stop_str_at``: a stop string (``stop``) whose text completes at this output position of
    the request without parameters (:func:`stop_string`); text prompts of shape ``chat`` only.
    ``constraint``: ``structured_outputs``, index into :data:`CONSTRAINTS`, text prompts
    (shapes ``chat`` / ``messages``) only, ``ignore_eos`` off. ``raw``: ``skip_special_tokens``
    off (issue 52: the text keeps the special tokens among the IDs, check ``special_tokens``;
    not with a stop string or a constraint, whose text rules leave special tokens out)."""

    logprobs: int | None = None
    stop_at: int | None = None
    min_tokens: int | None = None
    eos: bool = False
    penalty: tuple[str, float] | None = None
    bias_at: int | None = None
    bias: float | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    stop_str_at: int | None = None
    constraint: int | None = None
    raw: bool = False

    @property
    def needs_base(self) -> bool:
        """Whether a concrete value comes from the output of :func:`base_spec`'s request
        (``stop_at``, ``bias_at``, ``stop_str_at``)."""
        return any(x is not None for x in (self.stop_at, self.bias_at, self.stop_str_at))

    def __bool__(self) -> bool:
        # by identity: a position or top-k of 0 (stop_at=0, prompt_logprobs=0) is present,
        # though 0 == False
        return any(getattr(self, f.name) is not None and getattr(self, f.name) is not False
                   for f in fields(self))

    def tag(self) -> str:
        """The summary notation, e.g. ``<lp2,stop@3,min2,eos,rep1.5,bias@0:-100,plp1,echo,
        stop"..."@4,regex2>`` (``stop"..."@J``: a stop string taken at output position J;
        ``choiceN`` / ``regexN``: constraint N of :data:`CONSTRAINTS`); empty when nothing is
        drawn."""
        parts = []
        if self.logprobs is not None:
            parts.append(f"lp{self.logprobs}")
        if self.stop_at is not None:
            parts.append(f"stop@{self.stop_at}")
        if self.min_tokens is not None:
            parts.append(f"min{self.min_tokens}")
        if self.eos:
            parts.append("eos")
        if self.penalty is not None:
            parts.append(f"{self.penalty[0][:3]}{self.penalty[1]:g}")
        if self.bias_at is not None:
            parts.append(f"bias@{self.bias_at}:{self.bias:g}")
        if self.prompt_logprobs is not None:
            parts.append(f"plp{self.prompt_logprobs}")
        if self.echo:
            parts.append("echo")
        if self.stop_str_at is not None:
            parts.append(f'stop"..."@{self.stop_str_at}')
        if self.constraint is not None:
            parts.append(f"{CONSTRAINTS[self.constraint][0]}{self.constraint}")
        if self.raw:
            parts.append("raw")
        return f"<{','.join(parts)}>" if parts else ""


NONE = Features()


def allowed(facts, enabled: bool, chat: bool) -> tuple[frozenset[str], list[str]]:
    """The features drawn on an engine of ``facts`` (an EngineFacts) and why some are not:
    (names of :data:`ALL`, notes). ``enabled``: FuzzParams.features (off: none); ``chat``:
    chat-shaped prompts asked (``messages`` then still needs a chat template, checked when the
    run starts: :meth:`pleharness.scenarios.fuzz.example.FuzzExamples._chat_prompts`)."""
    if not enabled:
        return frozenset(), []
    out = set(ALL)
    notes = []
    k = facts.num_speculative_tokens
    if k != 0:
        out.discard("logit_bias")
        notes.append("features: logit_bias left out: vLLM refuses it with speculative decoding "
                     + (f"(k = {k})" if k is not None else "(k unknown: pass "
                        "--num-speculative-tokens 0 where it is off)"))
    if not chat:
        out -= {"messages", "stop", "structured"}
        notes.append("features: stop strings and constrained output left out: they need text "
                     "prompts (chat-shaped), and chat-shaped prompts are off")
    return frozenset(out), notes


def gate(ctx, names: frozenset[str]) -> tuple[frozenset[str], list[str]]:
    """The features of ``names`` that this engine serves, and notes on those it does not:
    ``structured`` only when the ``constrained`` kind's probe
    (:func:`pleharness.scenarios.constrained.probe`: one request constrained to a single
    choice answers exactly it) passes on ``ctx`` (a ScenarioContext). Sends one request when
    ``structured`` is asked; never raises for an engine's refusal."""
    if "structured" not in names:
        return names, []
    why = probe(ctx)
    if why is None:
        return names, []
    return names - {"structured"}, [f"features: constrained output left out: {why}"]


def draw_features(draw, names: frozenset[str], max_tokens: int, stream: bool,
                  shape: str = "random") -> Features:
    """Draw a :class:`Features` (hypothesis ``draw``) over the feature ``names`` for a request
    of ``max_tokens`` (>= 1), streamed or not, of prompt ``shape`` (random | chat | messages).
    Each feature is present with probability 1 / ODDS; every value shrinks towards absent
    (then towards its smallest value). Conflicts are resolved later by :func:`fit`."""
    from hypothesis import strategies as st  # lazy: hypothesis, only when a fuzz run draws

    def on(name: str) -> bool:
        return name in names and draw(st.integers(0, ODDS - 1)) == ODDS - 1

    lp = draw(st.integers(1, MAX_LOGPROBS)) if on("logprobs") else None
    stop_at = draw(st.integers(0, max_tokens - 1)) if on("stop_token_ids") else None
    mt = draw(st.integers(1, max_tokens)) if on("min_tokens") else None
    eos = on("ignore_eos")
    pen = None
    if on("penalty"):
        name = draw(st.sampled_from(sorted(PENALTIES)))
        pen = (name, draw(st.sampled_from(PENALTIES[name])))
    bias_at = bias = None
    if on("logit_bias"):
        bias_at, bias = draw(st.integers(0, max_tokens - 1)), draw(st.sampled_from(BIASES))
    plp = draw(st.integers(0, MAX_LOGPROBS)) if not stream and on("prompt_logprobs") else None
    echo = not stream and on("echo")
    sj = draw(st.integers(0, max_tokens - 1)) if shape == "chat" and on("stop") else None
    con = draw(st.integers(0, len(CONSTRAINTS) - 1)) \
        if shape in TEXT_SHAPES and on("structured") else None
    raw = on("skip_special_tokens")
    return Features(lp, stop_at, mt, eos, pen, bias_at, bias, plp, echo, sj, con, raw)


def fit(f: Features, max_tokens: int, stream: bool, shape: str = "random") -> Features:
    """``f`` made valid for a request of ``max_tokens``, streamed or not, of prompt ``shape``
    (a warm repeat keeps its own draw; this guards every combination): positions and
    min_tokens within max_tokens, no prompt_logprobs or echo on a streamed request, a stop
    string only on a ``chat`` prompt and a constraint only on a text one. A constraint drops
    stop IDs, a stop string and min_tokens (a stop before the constraint's end would leave a
    text that does not conform); a stop string drops stop IDs and min_tokens (vLLM checks no
    stop string before min_tokens, and a stop ID ends the output with finish_reason "stop"
    but no stop string: check ``stop_string`` could not tell these from a fault)."""
    if not f:
        return f
    out = f
    if out.stop_str_at is not None and (shape != "chat" or out.constraint is not None):
        out = replace(out, stop_str_at=None)
    if out.constraint is not None and shape not in TEXT_SHAPES:
        out = replace(out, constraint=None)
    if out.constraint is not None or out.stop_str_at is not None:
        out = replace(out, stop_at=None, min_tokens=None, raw=False)
    if out.stop_str_at is not None and out.stop_str_at >= max_tokens:
        out = replace(out, stop_str_at=max_tokens - 1)
    if stream and out.echo:
        out = replace(out, echo=False)
    if out.stop_at is not None and out.stop_at >= max_tokens:
        out = replace(out, stop_at=max_tokens - 1)
    if out.bias_at is not None and out.bias_at >= max_tokens:
        out = replace(out, bias_at=max_tokens - 1)
    if out.min_tokens is not None and out.min_tokens > max_tokens:
        out = replace(out, min_tokens=max_tokens)
    if stream and out.prompt_logprobs is not None:
        out = replace(out, prompt_logprobs=None)
    return out


def base_spec(spec: "RequestSpec") -> "RequestSpec":
    """The request whose output names ``stop_at`` / ``bias_at`` IDs: ``spec``'s prompt,
    max_tokens and sampling, streamed, no per-request parameters (its reference key is the
    plain one)."""
    return RequestSpec(spec.prompt, spec.max_tokens, temperature=spec.temperature,
                       seed=spec.seed, note="fuzz: output that names stop / bias IDs")


def resolve(f: Features, base_ids: list[int] | None, prompt_ids: tuple[int, ...]) \
        -> tuple[tuple[int, ...] | None, tuple[tuple[int, float], ...] | None]:
    """(stop_token_ids, logit_bias) of ``f`` from ``base_ids`` (the output of
    :func:`base_spec`'s request, None when it has none): the stop ID at ``stop_at``
    (:func:`pleharness.scenarios.shared.stops.stop_id`: the first ID at or after it not emitted before, so it stops
    there), the biased ID at ``bias_at``. A position past the output takes the prompt's ID at
    that position modulo its length (a valid ID that may not fire)."""

    def at(j: int) -> int:
        return int(base_ids[j]) if base_ids and j < len(base_ids) else \
            int(prompt_ids[j % len(prompt_ids)])
    stop = None
    if f.stop_at is not None:
        stop = (stop_id(base_ids, f.stop_at) if base_ids and f.stop_at < len(base_ids)
                else at(f.stop_at),)
    bias = ((at(f.bias_at), float(f.bias)),) if f.bias_at is not None else None
    return stop, bias


def stop_string(ctx, f: Features, base_ids: list[int] | None) -> tuple[str | None, str]:
    """(stop string, why) of ``f.stop_str_at`` = j: the ``stop_strings`` kind's pick
    (:func:`pleharness.scenarios.shared.stops.stop_for`: the text of token j, then of j-1..j,
    ... whose first occurrence in the output's text ends at token j) in ``base_ids`` (the
    output of :func:`base_spec`'s request), kept only when it also holds for the text the
    engine searches (EOS IDs left out). (None, why) when there is none: no output there, no
    such text, or /detokenize failed (the feature is then dropped for this request)."""
    j = f.stop_str_at
    if j is None:
        return None, ""
    if not base_ids or j >= len(base_ids):
        return None, (f"stop string dropped: the request without parameters emitted "
                      f"{len(base_ids or ())} token(s), none at position {j}")
    try:
        ids = [int(t) for t in base_ids]
        s = stop_for(ctx, ids, j)
        eos = eos_ids(ctx)
        text = ctx.detokenize([t for t in ids[:j + 1] if t not in eos]) if s else ""
    except EngineError as exc:
        return None, f"stop string dropped: /detokenize failed ({str(exc)[:80]})"
    if s is None or not text.endswith(s) or text.find(s) != len(text) - len(s):
        return None, (f"stop string dropped: no text of the output's last tokens through "
                      f"position {j} completes only there")
    return s, f"stop {s!r} completes at output position {j} of the request without parameters"


def apply(spec: "RequestSpec", f: Features, base_ids: list[int] | None,
          ctx=None) -> "RequestSpec":
    """``spec`` with the parameters of ``f`` (stop / bias IDs by :func:`resolve`, the stop
    string by :func:`stop_string`, which needs ``ctx``, a ScenarioContext: without one it is
    dropped) and the checks they call for: ``stop_token`` with stop IDs, min_tokens or EOS on
    (a constraint turns EOS on; not with a stop string: it ends with finish_reason "stop" on
    no stop ID), ``stop_string``
    with a stop string, the absolute ``prompt_logprobs`` rules with prompt_logprobs or echo,
    ``constrained`` with a constraint (sent with ``ignore_eos`` off: the output ends at the
    constraint's end). A dropped stop string is said in the note. Returns a new spec."""
    if not f:
        return spec
    stop, bias = resolve(f, base_ids, spec.prompt.ids)
    text, why = stop_string(ctx, f, base_ids) if ctx is not None else \
        (None, "stop string dropped: no engine to take it from" if f.stop_str_at is not None
         else "")
    pen = dict([f.penalty]) if f.penalty else {}
    checks = dict(spec.checks)
    if (stop or f.min_tokens or f.eos or f.constraint is not None) and not text:
        checks["stop_token"] = {}
    if text:
        checks["stop_string"] = {}
    if f.prompt_logprobs is not None or f.echo:
        checks[PLP] = {}
    if f.constraint is not None:
        checks[CON] = {}
    if f.raw:
        checks[SPECIAL] = {}
    lp = f.logprobs if f.logprobs is not None else spec.logprobs
    if f.echo and lp is None:
        lp = ECHO_LOGPROBS
    return replace(spec, logprobs=lp, stop_token_ids=stop, min_tokens=f.min_tokens,
                   ignore_eos=not (f.eos or f.constraint is not None), logit_bias=bias,
                   prompt_logprobs=f.prompt_logprobs, checks=checks, echo=f.echo,
                   stop=(text,) if text else spec.stop,
                   structured=CONSTRAINTS[f.constraint] if f.constraint is not None
                   else spec.structured, skip_special_tokens=not f.raw,
                   note=(spec.note or "") + f" {f.tag()}" + (f" ({why})" if why else ""), **pen)


def messages_prompt(client, length: int, seed: int, key: str, why: str) \
        -> tuple["Prompt", tuple[tuple[str, str], ...]]:
    """A one-user-message conversation whose chat template (``client.tokenize`` with the
    generation prompt) is at most ``length`` tokens, as close as 4 tries get: ``Reply with
    OK.`` and words of :data:`CHAT_WORDS` (from ``seed``), and the Prompt of its template's IDs.
    Raises EngineError from /tokenize (no chat template)."""

    def ids_of(n: int) -> tuple[list[int], tuple[tuple[str, str], ...]]:
        words = "".join(" " + CHAT_WORDS[(seed + i) % len(CHAT_WORDS)] for i in range(n))
        msgs = (("user", "Reply with OK." + words),)
        return client.tokenize(messages=[{"role": r, "content": c} for r, c in msgs],
                               add_generation_prompt=True), msgs

    ids, msgs = ids_of(0)
    n = max(0, length - len(ids))
    for _ in range(4):
        if n <= 0:
            break
        got, m = ids_of(n)
        if len(got) <= length:
            ids, msgs = got, m
            if len(got) == length:
                break
            n += max(1, (length - len(got)) // 2)
        else:
            n -= max(1, len(got) - length)
    return Prompt(key=key, ids=tuple(int(t) for t in ids), text=msgs[-1][1][:60], why=why), msgs


def toml_lines(spec: "RequestSpec") -> list[str]:
    """The replay-file lines (``[[params.phases.requests]]`` keys, :mod:`.replay`) of
    ``spec``'s per-request parameters: logprobs, ignore_eos, stop, penalties, logit_bias (a
    table of ID strings), stop_token_ids, min_tokens, prompt_logprobs, echo,
    structured_outputs (``{ choice = [...] }``, ``{ regex = "..." }``; a JSON Schema as JSON,
    which TOML reads as an inline table), messages (inline tables of role and content); none
    for a plain request."""
    lines = []
    if spec.logprobs is not None:
        lines.append(f"logprobs = {int(spec.logprobs)}")
    p: dict[str, Any] = spec.params
    if p.get("ignore_eos") is False:
        lines.append("ignore_eos = false")
    if "stop" in p:
        lines.append(f"stop = {_s(p['stop'])}")
    for name in PENALTIES:
        if name in p:
            lines.append(f"{name} = {float(p[name])!r}")
    if "logit_bias" in p:
        lines.append("logit_bias = { " + ", ".join(f'"{t}" = {float(b)!r}' for t, b in
                                                    p["logit_bias"].items()) + " }")
    for name in ("stop_token_ids", "min_tokens", "prompt_logprobs"):
        if name in p:
            lines.append(f"{name} = {json.dumps(p[name])}")
    if p.get("echo"):
        lines.append("echo = true")
    if p.get("skip_special_tokens") is False:
        lines.append("skip_special_tokens = false")
    if "structured_outputs" in p:
        ((kind, con),) = p["structured_outputs"].items()
        lines.append(f"structured_outputs = {{ {kind} = {_toml(con)} }}")
    if spec.messages:
        lines.append("messages = [" + ", ".join(f"{{ role = {_s(r)}, content = {_s(c)} }}"
                                                for r, c in spec.messages) + "]")
    return lines


def _toml(v) -> str:
    """A TOML value of ``v`` (str, bool, int, float, list, dict with string keys: an inline
    table). Raises ValueError for None or another type (TOML has no null)."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_s(str(k))} = {_toml(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return _s(v) if isinstance(v, str) else repr(v)
    raise ValueError(f"no TOML value for {v!r}")


def _s(v) -> str:
    """A TOML value of a string or list of strings (JSON escapes, non-ASCII kept literally:
    TOML has no surrogate-pair escapes)."""
    return json.dumps(v, ensure_ascii=False)


def failing_fields(spec: "RequestSpec", f: Features) -> dict[str, Any]:
    """The ``fuzz_failing`` columns of one request: ``features`` (the drawn tag), ``logprobs``,
    ``params`` (as sent, :attr:`RequestSpec.params`; None when none) and ``api`` (``chat`` for
    a chat-shaped request)."""
    return {"features": f.tag() or None, "logprobs": spec.logprobs,
            "params": spec.params or None, "api": "chat" if spec.messages else None}
