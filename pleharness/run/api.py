"""Which endpoint each request of a load phase goes to: ``--api completions|chat|both`` (issue
35 item 1).

Most prompts are token IDs with no message form (random IDs, chat templates padded with filler
tokens): they can only go to ``/v1/completions``. A prompt whose IDs are exactly the chat
template of some messages (:attr:`pleharness.prompts.Prompt.messages`, e.g.
:meth:`pleharness.prompts.ChatPromptBuilder.prompt`, used unpadded by ``stop_strings`` and
``insert``) can also go to ``/v1/chat/completions``, where the server applies the template
itself. Per load phase (never the reference passes, which stay on completions):

- ``completions``: nothing changes.
- ``both``: every spec whose prompt has messages gets a chat twin in the same phase (same
  max_tokens and parameters, streamed: the chat path streams; one twin per reference key, so a
  streamed and a non-streamed copy of one request share it), sent after the phase's own specs
  and compared with the same completions reference (the reference key ignores the endpoint).
- ``chat``: such specs go to the chat endpoint instead (:func:`plan` routes them).

The model's chat template is asked (:func:`resolve`) at the first load phase with a prompt of
message form; a model without one leaves every request on completions, with a note.

A spec whose parameters the chat path does not take stays on completions (counted as
``not_chat_shaped``): a disconnect (``abandon_after_tokens``), ``echo`` / ``prompt_logprobs``,
``n`` > 1, a constraint, an edge probe (``accept_4xx``), or a phase sent as one batched-prompt
request. ``summary.api_paths`` counts per scenario the requests that went to each endpoint
(:func:`count`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import EngineError
from ..request import RequestSpec

MODES = ("completions", "chat", "both")
CHAT_PROBE = [{"role": "user", "content": "Reply with OK."}]


def chat_form(spec: RequestSpec) -> RequestSpec | None:
    """The ``/v1/chat/completions`` form of ``spec``: the same request with ``messages`` =
    its prompt's messages, streamed, its note marked ``(chat path)``; None when its prompt has
    no message form, it is a chat request already, or its parameters keep it on completions
    (see the module docstring)."""
    if not spec.prompt.messages or spec.messages or not chat_shaped(spec):
        return None
    return replace(spec, messages=spec.prompt.messages, stream=True,
                   note=f"{spec.note} (chat path)" if spec.note else "chat path")


def chat_shaped(spec: RequestSpec) -> bool:
    """Whether the chat path takes ``spec``'s parameters (module docstring)."""
    return (spec.n == 1 and spec.abandon_after_tokens is None and not spec.echo
            and spec.prompt_logprobs is None and spec.structured is None
            and not spec.accept_4xx)


@dataclass
class Plan:
    """What one load phase sends under an ``--api`` mode: ``send`` (the specs to issue, in
    order: the phase's own, then the ``both`` twins), ``route`` (id of a phase spec -> the chat
    form it is sent as, ``chat`` mode), ``twins`` (how many were added) and ``counts`` (see
    :func:`count`)."""

    send: list[RequestSpec]
    route: dict[int, RequestSpec] = field(default_factory=dict)
    twins: int = 0
    counts: dict[str, int] = field(default_factory=dict)


def plan(specs: Sequence[RequestSpec], mode: str, *, load: bool, batched: bool = False) -> Plan:
    """The :class:`Plan` of a phase of ``specs`` under ``mode`` (one of :data:`MODES`).
    ``load``: a load phase (others: nothing changes, only counted); ``batched``: the phase goes
    out as one batched-prompt request (chat requests cannot join it). Raises ValueError for an
    unknown mode."""
    if mode not in MODES:
        raise ValueError(f"api mode {mode!r}: one of {', '.join(MODES)}")
    out = Plan(list(specs))
    n = {"completions": 0, "chat": 0, "chat_twins": 0, "no_chat_form": 0,
         "not_chat_shaped": 0}
    seen: set[tuple] = set()
    for s in specs:
        if s.messages:
            n["chat"] += 1
            continue
        if load and not s.prompt.messages:
            n["no_chat_form"] += 1
        form = chat_form(s) if load and mode != "completions" and not batched else None
        if load and mode != "completions" and s.prompt.messages and form is None:
            n["not_chat_shaped"] += 1
        if form is None or mode == "both":
            n["completions"] += 1
        if form is None:
            continue
        if mode == "chat":
            out.route[id(s)] = form
            n["chat"] += 1
        elif s.ref_key not in seen:
            seen.add(s.ref_key)
            out.send.append(form)
            out.twins += 1
            n["chat"] += 1
            n["chat_twins"] += 1
    out.counts = n
    return out


def count(paths: dict[str, dict[str, int]], scenario: str, counts: dict[str, int]) -> None:
    """Add one phase's ``counts`` to ``paths`` (``summary.api_paths``: scenario -> {
    ``completions``: requests sent to /v1/completions, ``chat``: to /v1/chat/completions,
    ``chat_twins``: of those, twins added by ``--api both``, ``no_chat_form``: load requests
    whose token-ID prompt has no message form, ``not_chat_shaped``: load requests with a
    message form whose parameters kept them on completions})."""
    row = paths.setdefault(scenario or "-", {k: 0 for k in counts})
    for k, v in counts.items():
        row[k] = row.get(k, 0) + int(v)


def begin_phase(summary, scenario: str, specs: Sequence[RequestSpec], mode: str, *,
                load: bool, batched: bool, on_outcome=None) -> tuple[list[RequestSpec],
                                                                     dict[int, RequestSpec], Any]:
    """What :meth:`pleharness.run.context.RunContext.run_phase` sends for a phase of ``specs``
    under ``mode`` (:func:`plan`), its counts added to ``summary.api_paths`` under
    ``scenario``: (the specs to send, the chat route, ``on_outcome`` wrapped so that it never
    sees a twin: the scenario's hook judges its own specs). Raises ValueError for an unknown
    mode."""
    p = plan(specs, mode, load=load, batched=batched)
    paths = summary.api_paths or {}
    count(paths, scenario, p.counts)
    summary.api_paths = paths
    twins = {id(s) for s in p.send[len(specs):]}
    hook = on_outcome
    if hook is not None and twins:
        def on_outcome(o):
            if id(o.spec) not in twins:
                hook(o)
    return p.send, p.route, on_outcome


def probe_chat_template(client) -> tuple[bool, str | None]:
    """Whether the served model has a chat template: ``/tokenize`` with a one-message
    conversation answers. Returns (True, None) or (False, why); never raises."""
    try:
        client.tokenize(messages=CHAT_PROBE, add_generation_prompt=True)
    except (EngineError, ValueError, TypeError, KeyError) as exc:
        return False, f"/tokenize with messages was refused ({str(exc)[:160]})"
    return True, None


def resolve(mode: str, client) -> dict[str, Any]:
    """The run's api settings for ``manifest.run_options``: ``api`` (the mode asked),
    ``api_used`` (``completions`` when the model has no chat template), ``chat_template``
    (True / False; absent when not asked: ``--api completions``) and ``api_note`` (why the mode
    fell back). Never raises."""
    if mode == "completions":
        return {"api": mode, "api_used": mode}
    ok, why = probe_chat_template(client)
    if ok:
        return {"api": mode, "api_used": mode, "chat_template": True}
    return {"api": mode, "api_used": "completions", "chat_template": False,
            "api_note": f"--api {mode}: every request stays on /v1/completions: the model has "
                        f"no chat template? {why}"}

