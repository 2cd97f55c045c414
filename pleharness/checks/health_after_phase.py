"""Phase check ``health_after_phase``: GET /health answers 200 after every phase.

A request that kills the engine core (e.g. an unsupported attention shape, shared/ENGINE_NOTES.md)
often leaves the HTTP front end up for a moment; this catches it at the phase where it happened.

Kind: **absolute** (the engine's contract).
"""
from ..manifest import CheckResult
from . import register_phase


@register_phase("health_after_phase")
def check(ctx, phase) -> CheckResult:
    """GET /health answers 200 within 10 s after ``phase`` (a PhaseRecord) finished. Returns
    pass or fail; never raises."""
    if ctx.client.health(timeout=10):
        return CheckResult(name="health_after_phase", status="pass")
    return CheckResult(name="health_after_phase", status="fail", detail="/health did not answer 200")
