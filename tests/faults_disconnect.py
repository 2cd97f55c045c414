"""Engine doubles for issue 26 items 4 and 5 (client disconnects, prefix-cache isolation): faults a
healthy engine never produces, planted in front of the real engine by a FaultProxy."""
from __future__ import annotations

import threading

from doubles import Fault, corrupt_if_selected


class CorruptAfterDisconnect(Fault):
    """Corrupt (every token: ``(id + 1) % vocab``) each completion that arrives after a client
    closed its stream early and whose prompt starts with the same ``block`` tokens as the
    abandoned prompt: an engine whose KV blocks, freed by an aborted request, corrupt the
    requests that reuse them. Keyed to the shared leading block, not to arrival order: on a
    slow machine a neighbour of the disconnect phase can reach the proxy after the
    before-first-token client has already gone, and it shares no block. ``gone``: the numbers
    of the requests whose client went away; ``hits``: the numbers of the corrupted ones;
    ``hit_prompts``: their prompts' first ``block`` token IDs."""

    def __init__(self, vocab: int, block: int):
        self.vocab = vocab
        self.block = block
        self.gone: list[int] = []
        self.heads: set[tuple[int, ...]] = set()
        self.hits: list[int] = []
        self.hit_prompts: list[tuple[int, ...]] = []
        self.lock = threading.Lock()

    def _head(self, body: dict) -> tuple[int, ...]:
        return tuple(body.get("prompt") or ())[:self.block]

    def disconnected(self, ctx):
        with self.lock:
            self.gone.append(ctx.number)
            self.heads.add(self._head(ctx.body))

    def request(self, ctx, body):
        head = self._head(body)
        with self.lock:
            if head in self.heads:
                ctx.state["selected"] = True
                self.hits.append(ctx.number)
                self.hit_prompts.append(head)
        return body

    def chunk(self, ctx, chunk):
        return corrupt_if_selected(ctx, chunk, self.vocab)


class ServeFromOriginal(Fault):
    """Answer a completion whose prompt differs in exactly one token from a prompt answered
    before (same length and max_tokens) with that prompt's answer: its token IDs and logprobs,
    position by position, as an engine whose block hashes collide serves a near duplicate from
    the original's cached KV. Forgets every answer when the engine's prefix cache is reset
    (``POST /reset_prefix_cache`` through the proxy). ``refuse_reset``: the proxy answers that
    endpoint 404 (an engine without VLLM_SERVER_DEV_MODE=1). ``hits``: (request number, number
    of the request whose answer it got)."""

    def __init__(self, refuse_reset: bool = False):
        self.refused = ("/reset_prefix_cache",) if refuse_reset else ()
        self.answers: dict[tuple, tuple[int, list]] = {}  # (prompt, max_tokens) -> (no, tokens)
        self.hits: list[tuple[int, int]] = []
        self.resets = 0
        self.lock = threading.Lock()

    def prefix_cache_reset(self):
        with self.lock:
            self.answers.clear()
            self.resets += 1

    def request(self, ctx, body):
        p, mt = tuple(body.get("prompt") or ()), body.get("max_tokens")
        with self.lock:
            for (q, qmt), (no, toks) in self.answers.items():
                if qmt == mt and len(q) == len(p) and sum(a != b for a, b in zip(p, q)) == 1:
                    ctx.state["serve"] = toks
                    self.hits.append((ctx.number, no))
                    break
        ctx.state["seen"] = []
        return body

    def chunk(self, ctx, chunk):
        serve = ctx.state.get("serve")
        pos = ctx.tokens_so_far
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids") or []
            lp = ch.get("logprobs") or {}
            for i in range(len(ids)):
                if serve is not None and pos + i < len(serve):
                    tok, top, tlp = serve[pos + i]
                    ids[i] = tok
                    if lp.get("top_logprobs") and top is not None:
                        lp["top_logprobs"][i] = dict(top)
                    if lp.get("token_logprobs") and tlp is not None:
                        lp["token_logprobs"][i] = tlp
                    if lp.get("tokens"):
                        lp["tokens"][i] = f"token_id:{tok}"
                elif serve is None:
                    top = (lp.get("top_logprobs") or [None] * len(ids))[i]
                    tlp = (lp.get("token_logprobs") or [None] * len(ids))[i]
                    ctx.state["seen"].append((ids[i], dict(top) if top else None, tlp))
            if serve is None and ch.get("finish_reason") is not None:
                key = (tuple(ctx.body.get("prompt") or ()), ctx.body.get("max_tokens"))
                with self.lock:
                    self.answers[key] = (ctx.number, list(ctx.state["seen"]))
        return chunk
