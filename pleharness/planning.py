"""A suite's plan on an engine's facts, without an engine (issue 48): what ``ple-harness
scenarios --check FILE --facts FACTS`` prints and the facts-matrix test asserts.

- :func:`load_plan_facts`: the facts of a ``ple-harness facts --json`` file, of a previous
  run's manifest (a ``manifest.json`` or its run folder), or those an engine profile's launch
  arguments give (a ``.toml``), with what they say about the engine
  beyond its facts (launched or attached, a chat template) as :class:`~pleharness.run.dryrun.
  Assumptions`;
- :func:`plan_suite`: every scenario's plan (:func:`pleharness.run.dryrun.plan_scenario`: the
  kind's own ``run`` against a synthetic engine with those facts), as a :class:`SuitePlan`;
- :func:`plan_lines`: the plan as text: one line per scenario and per load phase (requests,
  prompt lengths, max_tokens), every phase left out or vacuous with its reason, and the
  problems (a kind that raised, a request that would not fit): a ple-harness bug.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .option_rules import find_profile
from .engine.facts import FACT_DOCS, EngineFacts, gather_facts
from .engine.session import EMBEDDED_ENGINE_ARGS
from .errors import UsageError
from .model import SHIPPED_DIR
from .profile import load_profile
from .run.dryrun import Assumptions, ScenarioPlan, plan_scenario
from .scenarios import Scenario

SHOWN_FACTS = (("max_model_len", "M"), ("vocab_size", "V"), ("block_size", "B"),
               ("max_num_batched_tokens", "C"), ("num_speculative_tokens", "k"),
               ("speculative_method", "method"), ("max_num_seqs", "max_num_seqs"),
               ("prefix_caching", "prefix caching"), ("tensor_parallel_size", "TP"),
               ("mamba_block_size", "mamba block"), ("cudagraph_capture_sizes", "S"))


@dataclass
class SuitePlan:
    """The plans of a suite's scenarios on one engine (``repeat``: whole-suite repeats; the
    plans are of one repeat, references taken once)."""

    plans: list[ScenarioPlan]
    facts: EngineFacts
    assume: Assumptions
    repeat: int = 1
    source: str = ""

    @property
    def planned(self) -> int:
        """Load phases a run counts (``summary.phases_planned``)."""
        return self.repeat * sum(p.planned for p in self.plans)

    @property
    def requests(self) -> int:
        """Requests of one repeat (references included)."""
        return sum(p.requests for p in self.plans)

    @property
    def problems(self) -> list[str]:
        """What would go wrong on this engine and is the harness's fault: a kind that raised,
        a request that does not fit, a phase count that does not add up."""
        out = []
        for p in self.plans:
            if p.error:
                out.append(f"{p.name}: the {p.kind} kind raised {p.error}")
            for ph in p.phases:
                out += [f"{p.name}: phase {ph.name}: {x}" for x in ph.over_limit]
            if len(p.load) != p.planned:
                out.append(f"{p.name}: {len(p.load)} load phases recorded, {p.planned} planned")
        return out


def facts_of(values: dict[str, Any], sources: dict[str, str] | None = None) -> EngineFacts:
    """An EngineFacts holding ``values`` (fact name -> value; None values left out)."""
    f = EngineFacts()
    for k, v in values.items():
        if v is not None:
            f.values[k] = v
            f.sources[k] = (sources or {}).get(k, "given")
    return f


def load_plan_facts(path: str | Path) -> tuple[EngineFacts, Assumptions, str]:
    """(facts, assumptions, description) from ``path``: a ``ple-harness facts --json`` file, a
    run's ``manifest.json``, a run folder holding one, or an engine profile (a ``.toml`` path
    or a shipped profile's name: :func:`_profile_facts`). Both record ``facts`` as {name:
    {"value", "source"}}; a launched engine serves ``/reset_prefix_cache`` (an attached one is
    assumed not to), and a manifest's ``run_options.chat_template`` says whether the model has
    a chat template (unknown: assumed it has). Raises UsageError naming the file on anything
    else."""
    p = Path(path)
    if not p.exists() and p.suffix != ".json":
        p = find_profile(str(path))  # a shipped profile's name (UsageError: none)
    if p.suffix == ".toml":
        return _profile_facts(p)
    if p.is_dir():
        p = p / "manifest.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--facts {path}: cannot read a facts file or manifest: {exc}") from None
    facts = data.get("facts") if isinstance(data, dict) else None
    if not isinstance(facts, dict) or not facts:
        raise UsageError(f"--facts {path}: no 'facts' in it (expected the JSON of ple-harness "
                         "facts --json, or a run's manifest.json)")
    values = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in facts.items()
              if k in FACT_DOCS}
    sources = {k: str(v.get("source")) for k, v in facts.items() if isinstance(v, dict)}
    mode = data.get("mode") or (data.get("engine") or {}).get("mode")
    chat = (data.get("run_options") or {}).get("chat_template")
    assume = Assumptions(chat_template=chat is not False,
                         prefix_cache_reset=mode != "attached")
    what = "manifest" if "run_id" in data else "facts file"
    return facts_of(values, sources), assume, f"{what} {p}"


def _profile_facts(path: Path) -> tuple[EngineFacts, Assumptions, str]:
    """The facts an engine launched with profile ``path`` would start from: its launch
    arguments (vLLM's defaults for what they leave out: no speculative decoding, prefix caching
    on, TP 1) and its model's config.json where the folder is here (the embedded model's, with
    its launch arguments, without a ``model``). What only the engine says (B, C when not given,
    S) stays unknown: ``ple-harness facts --json`` of the engine gives them all."""
    prof = load_profile(path)
    args, model = list(prof.engine_args), prof.model
    if model is None:
        args, model = EMBEDDED_ENGINE_ARGS + args, str(SHIPPED_DIR)
    f = gather_facts(engine_args=args, launched=True, tp=prof.tp,
                     model_path=model if Path(model).is_dir() else None)
    return f, Assumptions(), f"profile {path} (launch arguments and config.json only)"


def plan_suite(scenarios: list[Scenario], facts, assume: Assumptions = Assumptions(),
               repeat: int = 1, source: str = "", run_dir: Path | None = None) -> SuitePlan:
    """Every scenario's plan on ``facts`` (EngineFacts or a dict of values), in order."""
    f = facts if isinstance(facts, EngineFacts) else facts_of(dict(facts))
    return SuitePlan([plan_scenario(sc, f, assume, run_dir) for sc in scenarios], f, assume,
                     repeat, source)


def _span(a: int | None, b: int | None) -> str:
    return "-" if a is None else str(a) if a == b else f"{a}..{b}"


def facts_line(f: EngineFacts) -> str:
    """The facts a plan depends on, in one line ("M 2048, V 151936, B 16, ...")."""
    out = []
    for name, label in SHOWN_FACTS:
        v = f.get(name)
        if isinstance(v, list) and len(v) > 8:
            v = f"[{', '.join(map(str, v[:4]))}, ..., {v[-1]}] ({len(v)} sizes)"
        if v is not None:
            out.append(f"{label} {'on' if v is True else 'off' if v is False else v}")
    return ", ".join(out) or "no facts known"


def plan_lines(plan: SuitePlan, title: str) -> list[str]:
    """The plan as text (module docstring): the facts and assumptions, then per scenario its
    load phases (name, concurrency, requests, prompt lengths in tokens, max_tokens), each left
    out or vacuous phase with its reason, the kind's notes of what it shortened or left out, and
    at the end the totals and any problem."""
    a = plan.assume
    lines = [f"{title}: plan on {plan.source or 'the given facts'}",
             f"  facts: {facts_line(plan.facts)}",
             f"  assumed: outputs {a.outputs}, chat template {'yes' if a.chat_template else 'no'}"
             f", structured outputs {'yes' if a.structured_outputs else 'no'}, prefix-cache "
             f"reset {'yes' if a.prefix_cache_reset else 'no'}; no /metrics (counter checks "
             "are decided on the engine)"]
    n_run = n_left = n_vac = 0
    for p in plan.plans:
        refs = [ph for ph in p.phases if ph.role != "load"]
        lines.append(f"{p.name} ({p.kind}): {len(p.load)} load phase(s), {p.requests} "
                     f"request(s) ({sum(ph.requests for ph in refs)} in reference and warm-up "
                     "phases)")
        for ph in p.load:
            if ph.status == "left out":
                n_left += 1
                lines.append(f"  {ph.name} (C{ph.concurrency}): LEFT OUT (vacuous): {ph.vacuous}")
                continue
            n_run += 1
            lo, hi = ph.prompt_lens or (None, None)
            lines.append(f"  {ph.name} (C{ph.concurrency}): {ph.requests} requests, prompts "
                         f"{_span(lo, hi)} tokens, max_tokens up to {ph.max_tokens}"
                         + (f"; VACUOUS: {ph.vacuous}" if ph.vacuous else ""))
            n_vac += bool(ph.vacuous)
        said = {ph.vacuous for ph in p.phases if ph.vacuous}
        lines += [f"  note: {n}" for n in p.notes if _worth(n) and n.split(": ", 1)[-1] not in said]
    lines.append(f"{plan.planned} load phase(s) planned" + (f" ({plan.repeat} repeats)"
                                                           if plan.repeat > 1 else "")
                 + f": {n_run} run ({n_vac} vacuous), {n_left} left out; {plan.requests} "
                   "requests per repeat; no usage error")
    probs = plan.problems
    if probs:
        lines.append(f"PROBLEMS ({len(probs)}; a ple-harness bug, please report):")
        lines += [f"  {x}" for x in probs]
    return lines


def _worth(note: str) -> bool:
    """Notes that say what was shortened or left out (not the per-length drop lists)."""
    return " dropped: longer than " not in note and "lengths skipped:" not in note


def assumptions(base: Assumptions, **changes: Any) -> Assumptions:
    """``base`` with ``changes`` (None values ignored)."""
    return Assumptions(**{**base.__dict__, **{k: v for k, v in changes.items() if v is not None}})
