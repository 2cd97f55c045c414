"""Fault doubles for issue 23 item 1 (which side of a divergence is wrong)."""
from doubles import Corrupt


class FirstRunCorrupt(Corrupt):
    """Corrupt only the first run of the prompt(s) of ``prompt_len`` tokens (every later run of it
    is left alone): from output position ``start`` on, each token becomes ``(id + 1) % vocab``.
    Its logprobs are made to agree (the new token is top-1), so only parity can tell. The
    prompt's first run is its cold single-request reference, so this is a solo path that is
    corrupted deterministically once (a fresh prefill misdispatched), as seen on the H200.
    ``hits``: the corrupted requests (arrival number, prompt length, max_tokens)."""

    def __init__(self, prompt_len: int, vocab: int, start: int = 1):
        super().__init__(self._pick, lambda t, pos: ((t + 1) % vocab, f" t{(t + 1) % vocab}"),
                         start=start, consistent=True)  # its logprobs agree (sane)
        self.prompt_len = prompt_len

    def _pick(self, ctx) -> bool:
        return (len(ctx.body.get("prompt") or []) == self.prompt_len
                and self.occurrence(ctx) == 1)
