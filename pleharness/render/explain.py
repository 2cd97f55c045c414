"""Renderings of ``ple-harness explain``'s report (its result as written,
:class:`pleharness.manifest.explain.ExplainResult`):
the console table and diagnoses (:func:`render`), ``explain.md`` (:func:`to_markdown`, pasteable
into a PR) and ``junit.xml`` (:func:`to_junit`, one failing test case per explained divergence).
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..manifest.explain import CaseReport, ExplainResult


def _cell(r: dict[str, Any]) -> str:
    """One suspect's result for one case, in a few words."""
    if not r:
        return "-"
    if r.get("skipped") or r.get("error"):
        if r.get("skipped") == "not tested yet":
            return "not tested yet"
        if str(r.get("skipped") or "").startswith("implied"):
            return "implied"
        return "skipped" if r.get("skipped") else "error"
    word = {True: "fails", False: "ok"}
    if r.get("new_length") not in (None, r.get("length")):
        return (f"L={r['new_length']} {word[r['fails_at_new_length']]}, "
                f"L={r['length']} {word[r['fails']]}")
    return "vanishes" if r.get("vanishes") else "persists"


def render(report: ExplainResult, console: Console) -> None:
    """The attribution table on the console, then each case's diagnosis."""
    t = Table(title=escape(f"explain {report.run_id}"))
    for col in ("case", "phase", "C", "L", "requests", "minimal case",
                *[s.name for s in report.suspects]):
        t.add_column(escape(col))
    for c in report.cases:
        cells = [_cell(c.controls.get(s.name, {})) for s in report.suspects]
        t.add_row(str(c.case), escape(c.phase), str(c.concurrency),
                  str(c.prompt_len), escape(", ".join(c.requests[:4])),
                  escape(c.minimal_case or "-"), *cells)
    console.print(t)
    for text, cs in _by_diagnosis(report):
        console.print(f"case{'s' if len(cs) > 1 else ''} "
                      f"{', '.join(str(c.case) for c in cs)}: {escape(text)}", highlight=False)


def _by_diagnosis(report: ExplainResult) -> list[tuple[str, list[CaseReport]]]:
    """The cases grouped by their (identical) diagnosis, in case order."""
    groups: dict[str, list[CaseReport]] = {}
    for c in report.cases:
        groups.setdefault(c.attribution, []).append(c)
    return list(groups.items())


def _two_by_two_md(c: CaseReport) -> list[str]:
    it = (c.narrowing or {}).get("interaction")
    if not it:
        return []
    x, y = it["features"]
    ctl = c.controls
    word = {True: "fails", False: "passes", None: "-"}
    get = lambda name: word[ctl.get(name, {}).get("fails")]  # noqa: E731
    return ["", f"2x2 table, case {c.case} (the replayed case on each engine):", "",
            f"| | {y} on | {y} off |", "|---|---|---|",
            f"| **{x} on** | fails (under test) | {get(y)} |",
            f"| **{x} off** | {get(x)} | {get(it['cell'])} |"]


def _numeric_md(c: CaseReport) -> list[str]:
    out = []
    for st in (c.narrowing or {}).get("numeric", []):
        out += ["", f"Trigger length against {st['fact']}, case {c.case}"
                    + (f" (L from {st['formula']})" if st.get("formula") else "") + ":", "",
                f"| {st['symbol']} | re-derived L | result | the prompt as run (L="
                f"{c.prompt_len}) |", "|---:|---:|---|---|"]
        word = {True: "fails", False: "passes"}
        out += [f"| {p['value']} | {p['length']} | {word[p['fails']]} | "
                f"{word[p.get('fails_as_run', p['fails'])]} |" for p in st["points"]]
    return out


def to_markdown(report: ExplainResult) -> str:
    """The attribution table, each case's diagnosis (2x2 tables, trigger lengths) and the
    evidence as Markdown (pasteable into a PR)."""
    sus = [s.name for s in report.suspects]
    elapsed = report.elapsed_s if report.elapsed_s is not None else 0
    done = sum(1 for la in report.launches if la.get("command"))
    lines = [f"## Attribution (`ple-harness explain {report.run_id}`)", ""]
    if report.status != "complete":
        lines += [f"**Status: {report.status}** (this file is rewritten after every launch; "
                  "configurations marked \"not tested yet\" were not reached)", ""]
    lines += [f"Engine launches: {done}; tries per replay: {report.tries}; {elapsed} s."
              + (f" Estimate: {report.estimate['text']}." if report.estimate else "")
              + (f" Replays judged by the run's rule; golden model: {report.golden}."
                 if report.golden else ""), ""]
    when = report.timeline.line()
    if when:
        lines += [f"Time line (from the command's start): {when}.", ""]
    for text, cs in _by_diagnosis(report):
        lines.append(f"- **case{'s' if len(cs) > 1 else ''} "
                     f"{', '.join(str(c.case) for c in cs)}** (L="
                     f"{', '.join(str(c.prompt_len) for c in cs)}): {text}")
    lines += ["", "| case | phase | C | L | requests | minimal case | " + " | ".join(sus) +
              " | reproducer |",
              "|---:|---|---:|---:|---|---|" + "---|" * len(sus) + "---|"]
    for c in report.cases:
        cells = [_cell(c.controls.get(s, {})) for s in sus]
        lines.append(f"| {c.case} | {c.phase} | {c.concurrency} | "
                     f"{c.prompt_len} | {', '.join(c.requests[:4])} | "
                     f"{c.minimal_case or '-'} | " + " | ".join(cells) +
                     f" | `{c.repro}` |")
    for c in report.cases:
        lines += _two_by_two_md(c) + _numeric_md(c)
    lines += ["", "Evidence (first divergent positions, per configuration):", ""]
    for c in report.cases:
        base = {k: [d["first_divergence"] for d in v["divergent"]] for k, v in c.baseline.items()}
        ctl = {k: [d["first_divergence"] for d in v.get("divergent", [])]
               for k, v in c.controls.items()}
        lines.append(f"- case {c.case}: under test {base}; controls {ctl}")
    for c in report.cases:
        if c.reproduction_verdict:
            lines.append(f"- case {c.case}: `{c.repro}` {c.reproduction_verdict}")
    for la in report.launches:
        if la.get("command"):
            lines.append(f"- {la['config']}: `{' '.join(la['command'])}`")
        elif la.get("skipped"):
            lines.append(f"- {la['config']}: {la['skipped']}")
    return "\n".join(lines) + "\n"


def to_junit(report: ExplainResult) -> str:
    """JUnit XML: one test case per failing divergence; the failure message names the suspect."""
    root = ET.Element("testsuites", name=f"ple-harness explain {report.run_id}")
    suite = ET.SubElement(root, "testsuite", name="explain", tests=str(len(report.cases)),
                          failures=str(len(report.cases)))
    for c in report.cases:
        tc = ET.SubElement(suite, "testcase", classname="explain",
                           name=f"case {c.case}: {c.phase} C{c.concurrency} "
                                f"({', '.join(c.requests[:4])})")
        f = ET.SubElement(tc, "failure", message=c.attribution)
        f.text = json.dumps({"minimal_case": c.minimal_case,
                             "narrowing": c.narrowing, "controls": c.controls,
                             "reproduction": c.reproduction_verdict}, indent=1)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
