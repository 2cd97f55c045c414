"""Scenario kind ``chat_api``: the ``/v1/chat/completions`` path beside ``/v1/completions``
(issue 35 item 1).

Real traffic to a vLLM server is mostly chat: the server applies the model's chat template and
streams the answer. Every other kind sends token-ID prompts to ``/v1/completions``, so on the
chat path a green run said nothing. Here ``conversations`` seeded conversations (one user
message; every third with a system message; every fourth with an earlier user / assistant turn)
are sent to both paths:

1. Each conversation's prompt IDs are what the engine's ``/tokenize`` makes of its messages with
   the generation prompt (the chat template), and its ``/v1/completions`` single-request
   reference is taken with those IDs.
2. Phase ``chat-api-solo``: each conversation through ``/v1/chat/completions``, one at a time
   (vLLM's ``return_token_ids`` gives the output IDs and the prompt IDs it used): each output
   equals the completions reference of the same prompt IDs (the engine computes the same thing:
   a difference is a path defect, judged by the run's rule, near ties included).
3. Phase ``chat-api-c<C>``: chat and completions requests of every conversation interleaved,
   ``concurrency`` in flight, each equal to the same reference.

Phase check ``chat_template`` (on ``chat-api-solo``): the prompt IDs each chat response
reports equal the ``/tokenize`` IDs of its messages (a template or special-token difference
between the two paths fails; a server that does not report them is a warning). Table
``chat_api``: per conversation its turns, prompt length and whether the template IDs matched.
A server without ``return_token_ids`` on chat fails the requests with a protocol error; a model
without a chat template (``/tokenize`` refuses the messages) skips the kind with a note in
``chat_api_notes``.
"""
from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from ..errors import EngineError
from ..manifest import CheckResult
from ..prompts import Prompt
from ..request import RequestSpec
from .base import Params, Scenario, TableRow, register

if TYPE_CHECKING:  # pragma: no cover
    from ..run.scenario_context import ScenarioContext

WORDS = ("the engine cache block prefill decode token batch request stream step model server "
         "graph kernel memory queue slot answer question prompt length chunk draft verify "
         "accept reject schedule tensor layer head weight value key page table count order "
         "first next last small large fast slow early late again always never maybe").split()


class ChatApiParams(Params):
    """Parameters of ``chat_api``: ``conversations`` (seeded, ``seed``), words per message
    (``min_words`` .. ``max_words``), ``max_tokens`` per answer, ``concurrency`` of the mixed
    phase."""

    conversations: int = Field(4, ge=1, le=256)
    min_words: int = Field(4, ge=1, le=4000)
    max_words: int = Field(40, ge=1, le=4000)
    max_tokens: int = Field(16, ge=1, le=1_000_000)
    concurrency: int = Field(4, ge=1, le=1024)
    seed: int = 35

    @model_validator(mode="after")
    def _words(self):
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) must be <= max_words "
                             f"({self.max_words})")
        return self


class ChatRow(TableRow):
    """One conversation: its prompt key, turns (messages), prompt length (tokens, by
    /tokenize) and whether the chat response's prompt IDs equal them (``same``, ``differs at
    N``, ``not returned``, ``failed``)."""

    conversation: str
    turns: int
    prompt_len: int
    template: str


def conversations(p: ChatApiParams) -> list[tuple[tuple[str, str], ...]]:
    """The seeded conversations (see the module docstring): the same parameters always give
    the same messages."""
    rnd = random.Random(p.seed)

    def text() -> str:
        n = rnd.randint(p.min_words, p.max_words)
        return " ".join(rnd.choice(WORDS) for _ in range(n)).capitalize() + "?"
    out = []
    for i in range(p.conversations):
        msgs: list[tuple[str, str]] = []
        if i % 3 == 2:
            msgs.append(("system", "You answer briefly. " + text()))
        if i % 4 == 3:
            msgs += [("user", text()), ("assistant", text().rstrip("?") + ".")]
        msgs.append(("user", text()))
        out.append(tuple(msgs))
    return out


@register
class ChatApi(Scenario):
    """Kind ``chat_api``: see the module docstring (two phases; check ``chat_template``; table
    ``chat_api``)."""

    kind = "chat_api"
    summary = ("the /v1/chat/completions path: each chat answer equals the completions "
               "reference of its template's IDs, alone and under load")
    Params = ChatApiParams
    phases = 2  # left out (vacuous, with the reason) without a chat template or room in M
    tables = {"chat_api": ChatRow}

    def run(self, ctx: "ScenarioContext") -> None:
        p = self.params
        convs = conversations(p)
        comp, chat = [], []
        names = ["chat-api-solo", (f"chat-api-c{p.concurrency}", p.concurrency)]
        m = ctx.facts.max_model_len
        for i, msgs in enumerate(convs):
            try:
                ids = ctx.client.tokenize(messages=[{"role": r, "content": c} for r, c in msgs],
                                          add_generation_prompt=True)
            except EngineError as exc:  # no chat template: nothing to test, and said so
                self.leave_out_phases(ctx, names, "chat path not exercised: /tokenize of a "
                                      f"conversation failed ({str(exc)[:200]}); the model may "
                                      "have no chat template")
                return
            if m is not None and len(ids) + p.max_tokens > int(m):
                ctx.note("chat_api_notes", f"conversation {i} left out: {len(ids)} tokens + "
                         f"max_tokens {p.max_tokens} exceed max_model_len {m}", echo=True)
                continue
            prompt = Prompt(f"chat-api-{i}", tuple(int(t) for t in ids),
                            text=msgs[-1][1][:60])
            spec = RequestSpec(prompt, p.max_tokens, note=f"conversation {i}: completions path")
            comp.append(spec)
            chat.append(replace(spec, messages=msgs, note=f"conversation {i}: chat path"))
        if not comp:
            lower = ("lower max_tokens (stress --max-tokens or the scenario's key): it alone "
                     "leaves no room" if m is not None and p.max_tokens >= int(m) - 1
                     else "lower max_words or max_tokens")
            self.leave_out_phases(ctx, names, f"no conversation fits max_model_len {m} with "
                                  f"max_tokens {p.max_tokens} ({lower})")
            return
        convs = [msgs for i, msgs in enumerate(convs)
                 if any(s.prompt.key == f"chat-api-{i}" for s in comp)]
        ctx.take_references(comp)
        solo = ctx.run_phase("chat-api-solo", 1, chat)
        if not solo:
            return  # reference pass only (collect-only)
        rows, differs, missing = [], [], 0
        for i, (msgs, s, o) in enumerate(zip(convs, chat, solo)):
            got = o.completion.prompt_token_ids
            if o.completion.error is not None:
                state = "failed"
            elif got is None:
                state, missing = "not returned", missing + 1
            elif list(got) == list(s.prompt.ids):
                state = "same"
            else:
                at = next((j for j, (a, b) in enumerate(zip(got, s.prompt.ids)) if a != b),
                          min(len(got), len(s.prompt.ids)))
                state = f"differs at {at} ({len(got)} vs {len(s.prompt.ids)} tokens)"
                differs.append(f"{s.prompt.key}: {state}")
            rows.append(ChatRow(conversation=s.prompt.key, turns=len(msgs),
                                prompt_len=len(s.prompt), template=state))
        self.put_table(ctx, "chat_api", rows)
        if differs:
            res = CheckResult(name="chat_template", status="fail",
                              detail="the chat path's prompt IDs differ from /tokenize of the "
                                     "same messages: " + "; ".join(differs[:4]))
        elif missing:
            res = CheckResult(name="chat_template", status="warn",
                              detail=f"{missing} chat response(s) reported no prompt IDs "
                                     "(return_token_ids): the template was not compared")
        else:
            res = CheckResult(name="chat_template", status="pass",
                              detail=f"{len(rows)} conversation(s): the chat path's prompt IDs "
                                     "equal /tokenize of the same messages")
        ctx.add_phase_check(solo.phase, res,
                            reason="chat template differs between the two paths"
                            if differs else None)
        mixed = [s for pair in zip(chat, comp) for s in pair]
        ctx.run_phase(f"chat-api-c{p.concurrency}", p.concurrency, mixed)

    @classmethod
    def markdown(cls, m) -> list[str]:
        return cls.markdown_table(m, "chat_api", "Chat completions path", [
            ("conversation", "conversation"), ("turns:", "turns"),
            ("prompt tokens:", "prompt_len"), ("chat prompt IDs vs /tokenize", "template")])
