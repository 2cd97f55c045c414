"""Check ``max_model_len_edge``: at the max_model_len edge the engine answers cleanly.

Asserts: HTTP 200 with finish_reason "length" (the output stopped at max_tokens or at M), or a
clean HTTP 4xx rejection. A 5xx, a broken connection or a timeout fails (the health of the engine
afterwards is the phase check ``health_after_phase``). Params: ``total`` (prompt + max_tokens) and
``max_model_len``, for the evidence.
"""
from ..manifest import CheckResult
from . import register


@register("max_model_len_edge")
def check(ctx, spec, c, params) -> CheckResult:
    where = f"prompt {len(spec.prompt)} + max_tokens {spec.max_tokens} vs M {params.get('max_model_len')}"
    if c.error is None:
        if c.finish_reason == "length":
            return CheckResult(name="max_model_len_edge", status="pass",
                               detail=f"200, finish_reason length, {len(c.token_ids)} tokens ({where})")
        return CheckResult(name="max_model_len_edge", status="fail",
                           detail=f"200 but finish_reason {c.finish_reason!r} ({where})")
    if c.error == "http" and c.http_status is not None and 400 <= c.http_status < 500:
        return CheckResult(name="max_model_len_edge", status="pass",
                           detail=f"clean {c.http_status} rejection ({where})")
    return CheckResult(name="max_model_len_edge", status="fail",
                       detail=f"{c.error}: {(c.error_detail or '')[:120]} ({where})")
