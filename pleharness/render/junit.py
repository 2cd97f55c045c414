"""JUnit XML rendering of a run (``junit.xml``): a testsuite per scenario, a testcase per phase,
failures with evidence, skips with reasons, and a failed "run completed" case when the run did not
complete."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from ..manifest import Manifest


def to_junit(m: Manifest) -> str:
    """JUnit XML: a testsuite per scenario, a testcase per phase (failure with evidence, skipped
    with reason for phases not run) plus a testcase per request check that failed."""
    root = ET.Element("testsuites", name=f"ple-harness {m.run_id}")
    by_scenario: dict[str, list] = defaultdict(list)
    for p in m.phases:
        by_scenario[p.scenario or "run"].append(p)
    reqs_by_phase: dict[str, list] = defaultdict(list)
    for r in m.requests:
        reqs_by_phase[r.phase].append(r)
    total_fail = 0
    for scen, phases in by_scenario.items():
        suite = ET.SubElement(root, "testsuite", name=scen)
        n = fails = skips = 0
        for p in phases:
            n += 1
            tc = ET.SubElement(suite, "testcase", classname=f"{scen}", name=f"{p.name} (C{p.concurrency})",
                               time=f"{p.wall_s or 0:.3f}")
            if p.status == "fail":
                fails += 1
                ev = [f"{r.id} {r.prompt_key}: " + "; ".join(
                    [f"{r.error}: {r.error_detail}"] if r.error else
                    [f"{c.name}: {c.detail}" for c in r.failed_checks])
                    for r in reqs_by_phase[p.name] if r.is_problem]
                ev += [f"{c.name}: {c.detail}" for c in p.checks if c.status == "fail"]
                corrupt = [f"{r.id} {r.prompt_key}: corrupt reference: {c.detail}"
                           for r in reqs_by_phase[p.name] for c in r.failed_checks
                           if c.name == "corrupt_reference"]
                ev = corrupt + ev  # the corrupt request first
                f = ET.SubElement(tc, "failure", message=(corrupt[0] if corrupt else
                                                          p.reason or "phase failed"))
                f.text = "\n".join(ev[:100])
            elif p.status in ("not_run", "interrupted", "skip"):
                skips += 1
                ET.SubElement(tc, "skipped", message=p.reason or "not run")
        suite.set("tests", str(n))
        suite.set("failures", str(fails))
        suite.set("skipped", str(skips))
        total_fail += fails
    if m.status in ("engine_died", "failed", "interrupted", "incomplete", "control_failed"):
        suite = ET.SubElement(root, "testsuite", name="run", tests="1", failures="1", skipped="0")
        tc = ET.SubElement(suite, "testcase", classname="run", name="run completed")
        f = ET.SubElement(tc, "failure", message=f"status {m.status}: {m.reason or ''}")
        f.text = "\n".join(([m.root_cause] if m.root_cause else []) + m.log_tail)
        total_fail += 1
    root.set("failures", str(total_fail))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
