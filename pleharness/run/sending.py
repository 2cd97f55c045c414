"""The request path of a run context: what is sent for a spec (:func:`request_args`), which
endpoint a load phase goes to under ``--api`` (:meth:`Sender.mode`), the one request of a
``together`` phase, and the default coroutine that sends one spec (:meth:`Sender.aissue`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..engine.client import Completion, EngineClient
from ..errors import UsageError
from ..manifest import Manifest
from ..request import RequestSpec
from . import api


def request_args(spec: RequestSpec, logprobs: int | None) -> dict[str, Any]:
    """The arguments of :meth:`EngineClient.acomplete` for ``spec`` (``logprobs``: the run's top-k
    logprobs, where the spec asks none of its own)."""
    lp = spec.logprobs if spec.logprobs is not None else logprobs
    extra = {k: v for k, v in spec.params.items() if k not in ("stop", "ignore_eos")}
    if spec.temperature > 0:  # nucleus / top-k sampling (vLLM's top_p, top_k fields)
        extra.update({k: v for k, v in (("top_p", spec.top_p), ("top_k", spec.top_k))
                      if v is not None})
    return {"prompt_ids": list(spec.prompt.ids), "max_tokens": spec.max_tokens,
            "logprobs": lp, "temperature": spec.temperature, "seed": spec.seed,
            "stream": spec.stream, "ignore_eos": spec.ignore_eos, "stop": spec.stop,
            "keep_chunks": spec.keep_chunks, "extra": extra or None,
            "abandon_after_tokens": spec.abandon_after_tokens}


class Sender:
    """The request path of one run context: ``client`` (the engine client), ``options`` (its
    :class:`~pleharness.run.context.RunOptions`), ``manifest`` (``run_options`` gets the ``--api``
    outcome), ``warn`` (prints a warning). ``route``: in a phase under ``--api chat``, a spec's id
    -> its chat form."""

    def __init__(self, client: EngineClient, options, manifest: Manifest,
                 warn: Callable[[str], None]):
        self.client = client
        self.options = options
        self.manifest = manifest
        self.warn = warn
        self.route: dict[int, RequestSpec] = {}  # --api chat: phase spec id -> its chat form
        self.api_used: str | None = None  # --api once the chat template was asked

    def args(self, spec: RequestSpec) -> dict[str, Any]:
        """:func:`request_args` of ``spec`` with the run's logprobs."""
        return request_args(spec, self.options.logprobs)

    def mode(self, specs: Sequence[RequestSpec], role: str) -> str:
        """The ``--api`` mode of a phase of ``specs``:
        :attr:`pleharness.run.context.RunOptions.api`, once the model's chat template answered
        (asked at the first load phase with a prompt of message form; none: completions for the
        rest of the run, said in ``run_options`` and a warning)."""
        mode = self.options.api
        if mode == "completions" or role != "load" or not any(s.prompt.messages
                                                               for s in specs):
            return mode
        if self.api_used is None:
            got = api.resolve(mode, self.client)
            self.manifest.run_options.assign(**got)
            self.api_used = got["api_used"]
            if got.get("api_note"):
                self.warn(got["api_note"])
        return self.api_used

    def together(self, name: str, specs: Sequence[RequestSpec], concurrency: int,
                 issue) -> Callable:
        """The job of a ``together`` phase (see
        :meth:`pleharness.run.context.RunContext.run_phase`): one coroutine sending every
        spec's prompt in one request. Raises UsageError for specs that cannot share one."""
        args = [self.args(s) for s in specs]
        first = {k: v for k, v in args[0].items() if k != "prompt_ids"} if args else {}
        why = None
        if issue is not None:
            why = "a custom issue function"
        elif any(s.messages for s in specs):
            why = "chat requests (one prompt each)"
        elif concurrency != len(specs):
            why = f"concurrency {concurrency} != {len(specs)} requests"
        elif any({k: v for k, v in a.items() if k != "prompt_ids"} != first for a in args):
            why = "requests differ in more than their prompts"
        elif first and (not first["stream"] or first["abandon_after_tokens"] is not None
                        or first["keep_chunks"]):
            why = "not streamed, abandoned or keep_chunks"
        if why:
            raise UsageError(f"phase {name}: requests sent together in one "
                             f"request: {why}")
        many = {k: v for k, v in first.items()
                if k not in ("stream", "abandon_after_tokens", "keep_chunks")}

        async def job(group: Sequence[RequestSpec]) -> list[Completion]:
            return await self.client.acomplete_many([list(s.prompt.ids) for s in group], **many)
        return job

    async def aissue(self, spec: RequestSpec, on_token=None) -> Completion:
        """Issue one spec on the client's event loop (the default request path of
        :meth:`pleharness.run.context.RunContext.run_phase`):
        ``/v1/completions``, or ``/v1/chat/completions`` for a spec with ``messages`` (or
        routed there by ``--api chat``)."""
        spec = self.route.get(id(spec), spec)
        args = self.args(spec)
        if spec.messages:
            return await self.client.achat(
                [{"role": r, "content": c} for r, c in spec.messages], spec.max_tokens,
                temperature=spec.temperature, ignore_eos=spec.ignore_eos,
                logprobs=args["logprobs"], seed=spec.seed, on_token=on_token,
                extra=args["extra"], stop=spec.stop, keep_chunks=spec.keep_chunks)
        return await self.client.acomplete(**args, on_token=on_token)
