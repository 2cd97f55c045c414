"""A stress run's outcome, from its manifest: the summary counts (:func:`summarize`), the verdict
and exit code (:func:`verdict`), a failed control engine's part in them (:func:`control_outcome`),
and the reports written beside the manifest (:func:`write_reports`: summary.md, junit.xml)."""
from __future__ import annotations

from pathlib import Path

from .causes import headline
from .errors import ExitCode
from .evidence import run_evidence
from .manifest import Manifest, write_atomic
from .render import to_junit, to_markdown
from .summary import throughput_by_concurrency


def summarize(m: Manifest) -> None:
    """The run's counts in ``m.summary`` (phases, compared hashes, divergences by kind, request
    errors, failed checks, notes), its throughput by concurrency, its evidence and headline."""
    load = [p for p in m.phases if p.role == "load"]
    compared = [r for r in m.requests if r.match is not None]
    m.summary.assign(
        phases_completed=sum(1 for p in load if p.status in ("pass", "fail")),
        phases_left_out=sum(1 for p in load if p.status == "skip"),
        phases_failed=sum(1 for p in load if p.status == "fail"),
        hashes_compared=len(compared),
        hashes_matched=sum(1 for r in compared if r.match),
        near_ties=sum(1 for r in m.requests if r.tolerated
                      and r.divergence.attribution != "also_in_control"),
        also_in_control=sum(1 for r in m.requests if r.divergence
                            and r.divergence.attribution == "also_in_control"),
        only_under_test=sum(1 for r in m.requests if r.divergence
                            and r.divergence.attribution == "only_under_test"),
        hard_divergences=sum(1 for r in m.requests if r.divergence and r.divergence.fails),
        request_errors=sum(1 for r in m.requests if r.request_error),
        checks_failed=sum(1 for r in m.requests for c in r.failed_checks
                          if c.name != "parity"),
        model_behaviour_notes=sum(1 for r in m.requests for c in r.checks
                                  if c.status == "note"))
    m.summary.throughput_by_concurrency = throughput_by_concurrency(m)
    engaged, vacuous = run_evidence(m)
    m.summary.engaged = engaged
    m.summary.vacuous = vacuous
    m.summary.vacuous_run_level = [v for v in vacuous if not v.startswith("phase ")]
    m.summary.headline = headline(m)


def verdict(m: Manifest) -> int:
    """Summarize ``m`` and set its verdict: fail when a request is a problem
    (:attr:`RequestRecord.is_problem`: an untolerated parity difference, a request error, a failed
    check) or a phase failed (phase checks such as health_after_phase). Returns the exit code."""
    summarize(m)
    failed = (any(r.is_problem for r in m.requests) or any(p.status == "fail" for p in m.phases)
              or bool(m.run_options.strict and m.summary.vacuous_run_level))
    m.verdict = "fail" if failed else "pass"
    return ExitCode.FAIL if failed else ExitCode.OK


def control_outcome(m: Manifest, code: int) -> int:
    """A requested control engine that failed to start or died is part of the outcome (issue
    32 item 4): status ``control_failed``, the reason and root cause recorded, exit 3 (the
    engine code) whatever the run's own verdict, which stays as judged without the control."""
    err = (m.engine.control_engine or {}).get("error")
    if not err:
        return code
    m.status = "control_failed"
    m.reason = f"the control engine failed: {err}"
    m.root_cause = m.root_cause or (m.engine.control_engine or {}).get("root_cause")
    return ExitCode.ENGINE


def write_reports(m: Manifest, run_dir: Path) -> None:
    """``summary.md`` and ``junit.xml`` in ``run_dir`` from ``m``; a failure to write them is
    recorded in ``summary.report_error``, never raised (the manifest stands on its own)."""
    try:
        write_atomic(run_dir / "summary.md", to_markdown(m, str(run_dir)))
        write_atomic(run_dir / "junit.xml", to_junit(m))
    except Exception as exc:  # noqa: BLE001 - reports never hide the manifest
        m.summary.report_error = str(exc)
