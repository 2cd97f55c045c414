"""A record's settlement: its divergence settled under the run's rule, and its ``parity`` check
derived from the result (issue 50 item 3).

Every pass that adds evidence to a divergence after it was first judged (the measured golden
floor, :meth:`pleharness.run.judge.Judge.finish_judgement`; the control's attribution,
:func:`pleharness.attribution.attribute`; the numerics envelope, :func:`pleharness.envelope.apply`)
settles it again here, with the one rule (:func:`pleharness.divergence.settle_under` and the run's
:class:`~pleharness.divergence.Rule`), and the parity check's status follows from the settled
divergence by :func:`parity_status` alone. Source of the rule: docs/references.md.
"""
from __future__ import annotations

from collections.abc import Callable

from ..divergence import Rule, settle_under
from ..manifest import Divergence, RequestRecord


def parity_status(d: Divergence) -> str:
    """The status of the ``parity`` check of a record whose output diverges, derived from its
    settled divergence ``d`` (:func:`pleharness.divergence.settle`): "fail" when it fails, "warn"
    when it does not (a near tie, or one the control explains). The one place the parity
    check's status is derived from a divergence (:func:`record_settlement`,
    :meth:`pleharness.run.judge.Judge._judge`, the majority pass); a record re-judged equal to
    the output that replaced a corrupt reference passes instead
    (:func:`pleharness.run.judge.rejudge`). Raises nothing. Source: docs/references.md."""
    return "fail" if d.fails else "warn"


def record_settlement(rec: RequestRecord, rule: Rule,
                      note: str | Callable[[Divergence], str] = "",
                      only_if_changed: bool = False) -> bool:
    """Settle ``rec``'s divergence again under ``rule`` (the run's:
    :func:`pleharness.divergence.settle_under`, with ``rec``'s temperature) after a pass added
    evidence to it, and derive its ``parity`` check from the result (:func:`parity_status`),
    appending ``note`` (a string, or a function of the settled divergence) to the check's
    detail. With ``only_if_changed`` the check is left as it was unless the divergence's class
    or verdict changed. Returns whether (class, fails) changed; raises nothing. Left alone
    (False): a record without a divergence, and one whose output equals its reference because
    it was judged again against the output that replaced a corrupt reference
    (:func:`pleharness.run.judge.rejudge`): its divergence from the corrupt reference is
    evidence about that reference, its own verdict a pass (a later pass, e.g. the control's
    attribution, must not turn it back into a failing or warning parity check)."""
    d = rec.divergence
    if d is None or rec.match is True:
        return False
    before = (d.cls, d.fails)
    settle_under(d, rule, rec.temperature)
    changed = (d.cls, d.fails) != before
    if changed or not only_if_changed:
        text = note(d) if callable(note) else note
        for ch in rec.checks:
            if ch.name == "parity":
                ch.status = parity_status(d)
                ch.detail += text
    return changed
