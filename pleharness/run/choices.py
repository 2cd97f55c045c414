"""Phases with requests for several choices (issue 35 item 2): the run context's grouping of
choice specs into requests.

A spec with ``n`` > 1 (:class:`pleharness.request.RequestSpec`) is one choice of a request for
``n`` choices; the request's n specs stand consecutively in the phase, choice 0 .. n - 1,
identical but for ``choice`` and ``seed`` (choice i's seed is the request's seed + i, vLLM's
derived seed). :func:`plan` groups a phase's specs into requests (a spec with n = 1 is a request
of its own) and gives the job that sends one group: one request for n choices
(:func:`pleharness.engine.choices.acomplete_choices`), or the context's own request path for
n = 1. The phase then keeps ``concurrency`` requests (not choices) in flight, and every choice
gets its own record, compared with its own reference and checked.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ..engine.choices import acomplete_choices, request_args
from ..errors import UsageError
from ..request import RequestSpec


def has_choices(specs: Sequence[RequestSpec]) -> bool:
    """Whether any spec is a choice of a request for n > 1 choices."""
    return any(s.n > 1 for s in specs)


def plan(name: str, specs: Sequence[RequestSpec], issue: Callable | None,
         single: Callable, args: Callable[[RequestSpec], dict], client
         ) -> tuple[list[list[int]], Callable]:
    """(groups, job) for a phase named ``name``: ``groups`` the spec indices of each request in
    order, ``job(group_specs)`` a coroutine function returning the group's completions in
    spec order. ``single``: the context's coroutine for one n = 1 spec; ``args(spec)``: its
    request arguments (:meth:`pleharness.run.sending.Sender.args`); ``client``:
    the :class:`pleharness.engine.client.EngineClient`. Raises
    UsageError naming the phase and the spec for choices that cannot form one request (not
    consecutive, out of order, differing in more than choice and seed, a seed that is not the
    request's + the index, a chat, abandoned or chunk-keeping spec, a custom ``issue``)."""
    if issue is not None:
        raise UsageError(f"phase {name}: a custom issue function cannot send requests for "
                         "several choices")
    groups: list[list[int]] = []
    i = 0
    while i < len(specs):
        s = specs[i]
        if s.n == 1:
            groups.append([i])
            i += 1
            continue
        group = list(range(i, i + s.n))
        why = None
        if s.n < 1 or i + s.n > len(specs):
            why = f"only {len(specs) - i} spec(s) left for n = {s.n}"
        else:
            first = request_args(s)
            for k, j in enumerate(group):
                o = specs[j]
                if o.choice != k:
                    why = f"spec {j} is choice {o.choice}, expected {k}"
                elif request_args(o) != first:
                    why = (f"spec {j} differs from choice 0 in more than choice and seed "
                           "(a seeded choice's seed must be the request's seed + its index)")
                if why:
                    break
            if why is None and (s.messages or s.abandon_after_tokens is not None
                                or s.keep_chunks):
                why = "chat, abandoned or keep_chunks requests have one choice"
        if why:
            raise UsageError(f"phase {name}: the choices of request {s.prompt.key} (n = {s.n}) "
                             f"at spec {i}: {why}")
        groups.append(group)
        i += s.n

    async def job(group: Sequence[RequestSpec]):
        s = group[0]
        if s.n == 1:
            return [await single(s)]
        a = args(s)
        return await acomplete_choices(
            client, a["prompt_ids"], s.max_tokens, s.n, temperature=s.temperature,
            seed=a["seed"], logprobs=a["logprobs"], stream=s.stream, ignore_eos=s.ignore_eos,
            stop=s.stop, extra=a["extra"])
    return groups, job


def ungroup(groups: Sequence[Sequence[int]], results: Sequence, total: int) -> list:
    """The completions of each group (``results[g]``, a list in group order) back in spec
    order (``total`` specs; a group not finished leaves None)."""
    out: list = [None] * total
    for g, cs in zip(groups, results):
        if cs is None:
            continue
        for j, c in zip(g, cs):
            out[j] = c
    return out
