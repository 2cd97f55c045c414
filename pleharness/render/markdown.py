"""Markdown rendering of a run: the "Test plan and result" section of ``summary.md``, pasteable
into a PR (verdict and causes first, next steps, engine, phases, throughput, each scenario kind's
own tables, divergences, notes, failed requests)."""
from __future__ import annotations

import shlex
from typing import Any

from ..manifest import Manifest
from ..summary import throughput_by_concurrency
from ..causes import causes, headline
from ..envelope import describe as describe_envelope
from ..scenarios import REGISTRY
from ..timeline import mib
from .text import engaged_lines, next_steps


def _side(d) -> str:
    """'reference (golden: -3.46 vs -0.06)' / 'load (majority 1 vs 5 of 6)' / 'undecided'."""
    ev = d.side_evidence
    if d.corrupt_side is None or ev is None:
        return "-"
    if ev.method == "golden" and ev.golden_logprob_reference is not None \
            and ev.golden_logprob_observed is not None:
        return (f"{d.corrupt_side} (golden lp reference {ev.golden_logprob_reference:.2f}, "
                f"this run {ev.golden_logprob_observed:.2f})")
    if ev.method == "majority" and ev.votes_total:
        return (f"{d.corrupt_side} (runs: reference {ev.votes_reference}, this run "
                f"{ev.votes_observed}, of {ev.votes_total})")
    return d.corrupt_side


def to_markdown(m: Manifest, run_dir: str | None = None) -> str:
    """The "Test plan and result" section a maintainer pastes into a PR: the verdict and its
    causes first, then next steps (logs, tokens, the reproduce command), then the tables."""
    lines = ["## Test plan and result", ""]
    lines.append(f"**Verdict: {(m.verdict or 'none').upper()}** (status {m.status}, exit "
                 f"{m.exit_code}). {headline(m)}.")
    when = m.timeline.line()
    if when:
        lines += ["", f"Time line (from the command's start): {when}."]
    why = causes(m)
    if why:
        lines += ["", "### Why", ""] + [f"- {x}" for x in why]
    lines += ["", "### Next steps", ""]
    for text, cmd in next_steps(m, run_dir):
        lines.append(f"- {text}")
        if cmd:
            lines += ["", "  ```bash", f"  {cmd}", "  ```"]
    lines.append("")
    lines += _engine_md(m) + _phases_md(m)
    eng = engaged_lines(m)
    if eng:
        lines += ["", "### What the run exercised (engine counters)", ""] + \
            [f"- {x.strip()}" for x in eng]
    lines += _kinds_md(m) + _divergences_md(m) + _requests_md(m)
    return "\n".join(lines) + "\n"


def _or_unset(section, name: str, default: str) -> Any:
    """``section``'s field ``name`` when the run recorded it (even as None), else ``default``."""
    return getattr(section, name) if name in section.model_fields_set else default


def _engine_md(m: Manifest) -> list[str]:
    """The "Engine" section: version, model, commands, thresholds, facts, GPUs."""
    e = m.engine
    lines = ["### Engine", ""]
    if e.version is None and e.model is None and e.max_model_len is None:
        lines.append(f"- engine not reached ({e.mode or 'no engine recorded'}: the run ended "
                     "before the engine was up)")
    else:
        lines.append(f"- vLLM {e.version}, model `{e.model}`, max_model_len "
                     f"{e.max_model_len}, {e.mode}")
    if e.command:
        lines.append(f"- command: `{shlex.join(e.command)}`")
    lines += [f"- {w}" for w in e.launch_warnings or []]
    if (e.control_engine or {}).get("command"):
        lines.append(f"- control engine: `{shlex.join(e.control_engine['command'])}`")
    if (e.reference_engine or {}).get("command"):
        lines.append(f"- reference engine: `{shlex.join(e.reference_engine['command'])}`")
    digest = e.model_digest or {}
    if digest.get("weights_sha256"):
        lines.append(f"- model: embedded, weights SHA256 `{digest['weights_sha256']}` (verified)")
    o = m.run_options
    if o.near_tie_nats is not None:
        lines.append(f"- near-tie threshold: {o.near_tie_nats:g} nats "
                     f"({_or_unset(o, 'near_tie_source', 'given')}); reference: "
                     f"{o.reference}; golden classifier: "
                     f"{_or_unset(o, 'golden_classifier', 'n/a')}")
    gt = o.golden_tolerance
    if gt:
        lines.append(f"- golden tolerance (half precision): {gt.get('tolerance_nats')} nats "
                     f"({gt.get('source')})")
    lines += [f"- {x}" for x in describe_envelope(o.numerics_envelope)]
    if o.numerics_envelope is not None:
        lines.append("- independent reference: " + (
            o.independent_reference or "none (every reference is this engine configuration's "
            "own: a defect that corrupts every run alike passes)"))
    facts = ", ".join(f"{k}={v['value']}" for k, v in m.facts.items() if v.get("value") is not None)
    if facts:
        lines.append(f"- facts: {facts}")
    gpus = m.environment.get("gpus")
    if gpus:
        lines.append(f"- GPUs: {', '.join(g['name'] for g in gpus)}")
    sized = [e for e in m.timeline.engine_starts if e.cache_bytes is not None]
    if sized:
        lines.append(f"- compile cache: `{sized[-1].compile_cache}`, {mib(sized[-1].cache_bytes)}"
                     " (--compile-cache moves it; kept between jobs)")
    return lines


def _phases_md(m: Manifest) -> list[str]:
    """The phase table and the decode throughput per concurrency level."""
    lines = ["", "### Phases", "", "| phase | scenario | C | requests | matched | near ties | "
             "errors | decode tok/s | status |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in m.phases:
        tps = f"{p.decode_tok_per_s:.1f}" if p.decode_tok_per_s is not None else "-"
        compared = p.matched + p.mismatched + p.near_ties
        lines.append(f"| {p.name} | {p.scenario} | {p.concurrency} | {p.requests} | "
                     f"{p.matched}/{compared} | {p.near_ties} | {p.errors} | {tps} | {p.status}"
                     f"{' (' + p.reason + ')' if p.reason else ''} |")
    tbc = m.summary.throughput_by_concurrency or throughput_by_concurrency(m)
    if tbc:
        lines += ["", "### Decode throughput per concurrency (over repeats)", "",
                  "| C | median tok/s | min | max | repeats |", "|---|---:|---:|---:|---:|"]
        for c, v in tbc.items():
            lines.append(f"| {c} | {v['median_tok_per_s']:.1f} | {v['min_tok_per_s']:.1f} | "
                         f"{v['max_tok_per_s']:.1f} | {v['repeats']} |")
    return lines


def _kinds_md(m: Manifest) -> list[str]:
    """Each scenario kind's own Markdown section (a table of another schema: one line why not)."""
    lines: list[str] = []
    for kind in dict.fromkeys(sc.get("kind") for sc in m.scenarios):  # each kind renders its own
        if kind in REGISTRY:
            try:
                lines += REGISTRY[kind].markdown(m)
            except ValueError as exc:  # pydantic's ValidationError: a table row of another schema
                first = str(exc).splitlines()
                lines += ["", f"### {kind}", "", f"(this manifest's {kind} table does not fit "
                          f"this ple-harness's row model, so it is not shown: "
                          f"{' '.join(first[:2])})"]
    return lines


def _divergences_md(m: Manifest) -> list[str]:
    """The divergence table (one row per request with a first divergent token)."""
    div = [r for r in m.requests if r.divergence or r.differential]
    if not div:
        return []
    lines = ["", "### Divergences", "", "| request | phase | prompt | position | class | "
             "classified by | reference margin (nats) | golden gap (nats) | reconverged | "
             "checks failed | control run | corrupt side |",
             "|---|---|---|---:|---|---|---:|---:|---|---|---|---|"]
    for r in div:
        d = r.divergence or r.differential
        mg = "-" if d.margin_nats is None else f"{d.margin_nats:.4f}"
        gg = "-" if d.golden_gap_nats is None else f"{d.golden_gap_nats:.4f}"
        lines.append(f"| {r.id} | {r.phase} | {r.prompt_key} | {d.position} | {d.cls}"
                     f"{'' if d.fails else ' (warning)'} | {d.classified_by or '-'} | "
                     f"{mg} | {gg} | {d.reconverged} | "
                     f"{', '.join(d.checks_failed) or '-'} | "
                     f"{'answers differently' if d is r.differential else d.attribution or '-'} | "
                     f"{_side(d)} |")
    return lines


def _requests_md(m: Manifest) -> list[str]:
    """Model-behaviour notes (not failures) and the failed requests."""
    lines: list[str] = []
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
    return lines
