"""Reviewer- and CI-facing renderings of a manifest: Markdown ("Test plan and result", pasteable
into a PR), JUnit XML (one testcase per phase and per failing check), and throughput per
concurrency over repeats."""
from __future__ import annotations

import shlex
import statistics
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import Any

from .manifest import Manifest
from .report import headline


def throughput_by_concurrency(m: Manifest) -> dict[str, dict[str, Any]]:
    """Decode throughput per concurrency level: for each repeat, completion tokens / wall time
    summed over that repeat's load phases at C (phases that count for throughput); then median,
    min and max over the repeats (tok/s)."""
    per: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for p in m.phases:
        if p.counts_for_throughput and p.role == "load" and p.wall_s and p.status not in ("not_run", "interrupted"):
            acc = per[p.concurrency][p.repeat]
            acc[0] += p.completion_tokens
            acc[1] += p.wall_s
    out = {}
    for c in sorted(per):
        vals = [tok / wall for tok, wall in per[c].values() if wall > 0]
        if vals:
            out[f"C{c}"] = {"median_tok_per_s": statistics.median(vals), "min_tok_per_s": min(vals),
                            "max_tok_per_s": max(vals), "repeats": len(vals)}
    return out


def reproduce_command(m: Manifest) -> str:
    """The recorded invocation as a shell command that starts a new run: ``--run-id`` is dropped
    (the old folder exists, and a new run may not reuse it). For an attached run (``--url``) the
    engine at that URL must be running again; :func:`pleharness.report.next_steps` says so."""
    if not m.invocation:
        return "(not recorded)"
    out: list[str] = []
    skip = False
    for a in m.invocation:
        if skip:
            skip = False
        elif a == "--run-id":
            skip = True
        elif not a.startswith("--run-id="):
            out.append(a)
    return shlex.join(out)


def to_markdown(m: Manifest) -> str:
    """The "Test plan and result" section a maintainer pastes into a PR: the verdict and its
    causes first, then next steps (logs, tokens, the reproduce command), then the tables."""
    from .report import causes, next_steps
    s = m.summary
    lines = ["## Test plan and result", ""]
    lines.append(f"**Verdict: {(m.verdict or 'none').upper()}** (status {m.status}, exit "
                 f"{m.exit_code}). {headline(m)}.")
    why = causes(m)
    if why:
        lines += ["", "### Why", ""] + [f"- {x}" for x in why]
    lines += ["", "### Next steps", ""]
    for text, cmd in next_steps(m):
        lines.append(f"- {text}")
        if cmd:
            lines += ["", "  ```bash", f"  {cmd}", "  ```"]
    lines.append("")
    e = m.engine
    lines.append("### Engine")
    lines.append("")
    lines.append(f"- vLLM {e.get('version')}, model `{e.get('model')}`, max_model_len "
                 f"{e.get('max_model_len')}, {e.get('mode')}")
    if e.get("command"):
        lines.append(f"- command: `{shlex.join(e['command'])}`")
    if e.get("control_engine", {}).get("command"):
        lines.append(f"- control engine: `{shlex.join(e['control_engine']['command'])}`")
    if e.get("reference_engine", {}).get("command"):
        lines.append(f"- reference engine: `{shlex.join(e['reference_engine']['command'])}`")
    digest = e.get("model_digest") or {}
    if digest.get("weights_sha256"):
        lines.append(f"- model: embedded, weights SHA256 `{digest['weights_sha256']}` (verified)")
    o = m.run_options
    if o.get("near_tie_nats") is not None:
        lines.append(f"- near-tie threshold: {o['near_tie_nats']:g} nats "
                     f"({o.get('near_tie_source', 'given')}); reference: {o.get('reference')}; "
                     f"golden classifier: {o.get('golden_classifier', 'n/a')}")
    facts = ", ".join(f"{k}={v['value']}" for k, v in m.facts.items() if v.get("value") is not None)
    if facts:
        lines.append(f"- facts: {facts}")
    gpus = m.environment.get("gpus")
    if gpus:
        lines.append(f"- GPUs: {', '.join(g['name'] for g in gpus)}")
    lines += ["", "### Phases", "", "| phase | scenario | C | requests | matched | near ties | "
              "errors | decode tok/s | status |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in m.phases:
        tps = f"{p.decode_tok_per_s:.1f}" if p.decode_tok_per_s is not None else "-"
        compared = p.matched + p.mismatched + p.near_ties
        lines.append(f"| {p.name} | {p.scenario} | {p.concurrency} | {p.requests} | "
                     f"{p.matched}/{compared} | {p.near_ties} | {p.errors} | {tps} | {p.status}"
                     f"{' (' + p.reason + ')' if p.reason else ''} |")
    tbc = s.get("throughput_by_concurrency") or throughput_by_concurrency(m)
    if tbc:
        lines += ["", "### Decode throughput per concurrency (over repeats)", "",
                  "| C | median tok/s | min | max | repeats |", "|---|---:|---:|---:|---:|"]
        for c, v in tbc.items():
            lines.append(f"| {c} | {v['median_tok_per_s']:.1f} | {v['min_tok_per_s']:.1f} | "
                         f"{v['max_tok_per_s']:.1f} | {v['repeats']} |")
    from .scenarios import REGISTRY
    for kind in dict.fromkeys(sc.get("kind") for sc in m.scenarios):  # each kind renders its own
        if kind in REGISTRY:
            lines += REGISTRY[kind].markdown(m)
    div = [r for r in m.requests if r.divergence]
    if div:
        lines += ["", "### Divergences", "", "| request | phase | prompt | position | class | "
                  "classified by | reference margin (nats) | golden gap (nats) | reconverged | "
                  "checks failed | control run |", "|---|---|---|---:|---|---|---:|---:|---|---|---|"]
        for r in div:
            d = r.divergence
            mg = "-" if d.margin_nats is None else f"{d.margin_nats:.4f}"
            gg = "-" if d.golden_gap_nats is None else f"{d.golden_gap_nats:.4f}"
            lines.append(f"| {r.id} | {r.phase} | {r.prompt_key} | {d.position} | {d.cls}"
                         f"{'' if d.fails else ' (warning)'} | {d.classified_by or '-'} | "
                         f"{mg} | {gg} | {d.reconverged} | "
                         f"{', '.join(d.checks_failed) or '-'} | {d.attribution or '-'} |")
    notes = [(r, c) for r in m.requests for c in r.checks if c.status == "note"]
    if notes:
        lines += ["", "### Model-behaviour notes (not failures)", ""]
        for r, c in notes[:30]:
            lines.append(f"- {r.id} ({r.phase}, {r.prompt_key}): {c.name}: {c.detail[:240]}")
    bad = [r for r in m.requests if r.is_problem]
    if bad:
        lines += ["", "### Failed requests", ""]
        for r in bad[:50]:
            why = [f"{r.error}: {r.error_detail}"] if r.error else []
            why += [f"{c.name}: {c.detail}" for c in r.failed_checks]
            lines.append(f"- {r.id} ({r.phase}, {r.prompt_key}): {'; '.join(why)[:300]}")
    return "\n".join(lines) + "\n"


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
                f = ET.SubElement(tc, "failure", message=p.reason or "phase failed")
                f.text = "\n".join(ev[:100])
            elif p.status in ("not_run", "interrupted"):
                skips += 1
                ET.SubElement(tc, "skipped", message=p.reason or "not run")
        suite.set("tests", str(n))
        suite.set("failures", str(fails))
        suite.set("skipped", str(skips))
        total_fail += fails
    if m.status in ("engine_died", "failed", "interrupted", "incomplete"):
        suite = ET.SubElement(root, "testsuite", name="run", tests="1", failures="1", skipped="0")
        tc = ET.SubElement(suite, "testcase", classname="run", name="run completed")
        f = ET.SubElement(tc, "failure", message=f"status {m.status}: {m.reason or ''}")
        f.text = "\n".join(([m.root_cause] if m.root_cause else []) + m.log_tail)
        total_fail += 1
    root.set("failures", str(total_fail))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
