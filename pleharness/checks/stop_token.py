"""Check ``stop_token``: a request with ``stop_token_ids`` and / or ``min_tokens``
(``RequestSpec.stop_token_ids``, ``RequestSpec.min_tokens``) stops exactly where vLLM's contract
says, whatever the model says (issue 35 item 5).

The contract, as vLLM implements it (``vllm/v1/core/sched/utils.py`` ``check_stop``: after each
token, the request stops when that token is EOS (unless ``ignore_eos``) or one of
``stop_token_ids``; ``min_tokens`` is enforced by masking those IDs in the logits until that many
tokens exist; a stop ID is returned as the last ID). With ``S`` the stop IDs (``stop_token_ids``,
plus the engine's EOS IDs, fact ``eos_token_id``, when the request does not ignore EOS) and
``m`` = ``min_tokens`` (0 when unset):

- ``min_tokens``: no ID of ``S`` among the first ``m`` output IDs, and at least
  ``min(m, max_tokens)`` IDs (a request that stopped earlier broke the floor);
- ``stops at the first``: an ID of ``S`` at position ``m`` or later is the last ID (an ID after
  it is one the client should never have got: a stop inside a multi-token speculative step whose
  rest was kept, or the stop not applied to this request's row);
- ``finish_reason``: "stop" when the last ID is in ``S``, else "length" with ``max_tokens``
  IDs, or "stop" when the request has stop strings (``RequestSpec.stop``: one ended it).

With stop strings, ``min_tokens`` holds them back too (``vllm/v1/engine/detokenizer.py``: stop
strings are searched only once more than ``min_tokens`` IDs exist), so the ``min_tokens`` floor
above applies to an output a stop string ended (issue 52: a stop string that ends the output
before ``min_tokens`` IDs fails it).

A neighbour without these parameters that stops early (a stop ID applied to the wrong batch row)
is caught by parity with its own single-request reference, not here.

Kind: **absolute** (the engine's contract; it does not depend on which tokens the model emits).
"""
from __future__ import annotations

from ..manifest import CheckResult
from . import register
from .stop_string import eos_ids


@register("stop_token")
def check(ctx, spec, c, params) -> CheckResult:
    """The rules of the module docstring for completion ``c`` of ``spec``. Returns pass, fail
    (every broken rule, named, with the position and ID), or skip (the request failed or sets
    neither parameter). Never raises."""
    name = "stop_token"
    stops = {int(t) for t in (spec.stop_token_ids or ())}
    m = int(spec.min_tokens or 0)
    if not stops and not m:
        return CheckResult(name=name, status="skip", detail="no stop_token_ids, no min_tokens")
    if c.error is not None:
        return CheckResult(name=name, status="skip", detail=f"request failed: {c.error}")
    if not spec.ignore_eos:
        stops |= eos_ids(ctx)
    ids = [int(t) for t in c.token_ids]
    bad = []
    early = [(i, t) for i, t in enumerate(ids[:m]) if t in stops]
    if early:
        i, t = early[0]
        bad.append(f"min_tokens: stop ID {t} at position {i}, before min_tokens {m}")
    if len(ids) < min(m, spec.max_tokens):
        bad.append(f"min_tokens: {len(ids)} IDs, fewer than min_tokens {m}")
    later = [i for i, t in enumerate(ids) if i >= m and t in stops]
    if later and later[0] != len(ids) - 1:
        i = later[0]
        bad.append(f"stops at the first: stop ID {ids[i]} at position {i}, then "
                   f"{len(ids) - 1 - i} more ID(s) ({ids[i + 1: i + 5]})")
    ends_on_stop = bool(ids) and ids[-1] in stops and len(ids) - 1 >= m
    if ends_on_stop and c.finish_reason != "stop":
        bad.append(f"finish_reason: {c.finish_reason!r} after stop ID {ids[-1]}, expected 'stop'")
    by_string = bool(spec.stop) and c.finish_reason == "stop"  # a stop string ended it
    if not ends_on_stop and not by_string and not (c.finish_reason == "length"
                                                   and len(ids) == spec.max_tokens):
        bad.append(f"finish_reason: {c.finish_reason!r} with {len(ids)} of {spec.max_tokens} IDs "
                   "and no stop ID last, expected 'length' at max_tokens")
    what = (f"stop IDs {sorted(stops)}" if stops else "no stop IDs") + f", min_tokens {m}"
    if bad:
        return CheckResult(name=name, status="fail", detail=f"{what}: " + "; ".join(bad))
    where = (f"stopped on ID {ids[-1]} at position {len(ids) - 1}" if ends_on_stop
             else f"no stop ID emitted in {len(ids)} IDs")
    return CheckResult(name=name, status="pass", detail=f"{what}: {where}")
