"""``ple-harness explain RUN``: which engine feature each failing divergence of a finished run
depends on.

For every distinct failing (prompt, phase concurrency) of the run (divergences that fail the
verdict: hard, or only under test), the smallest case that still fails is found on the
configuration under test, then replayed on engines that each switch one suspect off:

1. **Cases**, smallest first: the prompt alone (one request in flight); else the prompt with its
   phase companions at the phase's concurrency (the whole phase as it ran). A level "fails" when
   any of its requests differs from that engine's own single-request reference (each prompt run
   alone twice first, the second, warm, run kept: the stress run's rule), in any of ``tries``
   attempts (batching is not perfectly repeatable).
2. **Suspects**, chosen from the run's engine facts and launch: speculative decoding (drop
   ``--speculative-config``), prefix caching (``--no-enable-prefix-caching``), chunked prefill (a
   budget of max_model_len tokens, so any prompt prefills in one step), and on GPUs CUDA graphs
   (``--enforce-eager``) and FULL graphs (``--compilation-config {"cudagraph_mode": "PIECEWISE"}``);
   plus every ``--suspect ARG`` (an engine argument appended to the launch).
3. **Verdict per case**: "vanishes with X: attributed to X" for each suspect whose engine no longer
   fails it; "persists in every control: not explained" when none does.

One engine per configuration serves all cases (launches = 1 + suspects; each is printed before it
starts). ``budget_s`` caps the time: configurations not started in time are reported as skipped.
Outputs in ``RUN/explain/``: ``explain.json``, ``explain.md``, ``junit.xml`` (a test case per
divergence; the failure message names the suspect) and ``repro-N.toml`` for each case: a
``replay`` scenario file that ``ple-harness stress --scenario FILE`` replays.
"""
from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .engine.client import EngineClient
from .errors import EngineError, UsageError
from .engine.launch import EngineServer, LaunchSpec
from .manifest import Manifest, load_manifest, write_atomic
from .divergence import first_divergence
from .parity import token_hash

PIECEWISE = '{"cudagraph_mode": "PIECEWISE"}'


@dataclass
class Suspect:
    """One control configuration: the launch arguments with ``drop`` removed and ``add`` added."""

    name: str
    why: str
    add: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)


@dataclass
class Case:
    """A failing (prompt, concurrency) of the run and its replay levels.

    ``levels``: name -> (concurrency, [(prompt ids, max_tokens)]), smallest first.
    """

    index: int
    prompt_hash: str
    concurrency: int
    phase: str
    requests: list[str]
    first_divergence: int | None
    levels: dict[str, tuple[int, list[tuple[list[int], int]]]]
    minimal: str | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def attribution(self) -> str:
        if self.minimal is None:
            return "not reproduced on the configuration under test"
        gone = [n for n, r in self.results.items() if r.get("vanishes")]
        if gone:
            return "vanishes with " + ", ".join(gone) + ": attributed to " + " / ".join(gone)
        if any(r.get("skipped") for r in self.results.values()):
            return "persists in every control that ran (some skipped: budget)"
        return "persists in every control: not explained"


def suspects_for(m: Manifest, extra: Sequence[str] = (), drops: Sequence[str] = (),
                 auto: bool = True) -> list[Suspect]:
    """The suspects worth switching off for this run (module docstring), from its facts
    (``auto``), then one per ``extra`` engine argument (appended) and one per ``drops`` flag
    (removed with its value)."""
    f = {k: (v or {}).get("value") for k, v in m.facts.items()}
    args = list(m.engine.get("launch", {}).get("engine_args") or [])
    out = []
    if not auto:
        f, args, m = {"prefix_caching": False}, [], Manifest(run_id=m.run_id)
    if f.get("num_speculative_tokens") or any(a.startswith("--speculative-config") for a in args):
        out.append(Suspect("speculative decoding", "num_speculative_tokens "
                           f"{f.get('num_speculative_tokens')}", drop=["--speculative-config"]))
    if f.get("prefix_caching") is not False:
        out.append(Suspect("prefix caching", "prefix caching on",
                           add=["--no-enable-prefix-caching"], drop=["--enable-prefix-caching"]))
    c, mlen = f.get("max_num_batched_tokens"), f.get("max_model_len")
    if mlen and (c is None or int(c) < int(mlen)):
        out.append(Suspect("chunked prefill", f"chunk budget {c} < max_model_len {mlen}",
                           add=[f"--max-num-batched-tokens={mlen}"],
                           drop=["--max-num-batched-tokens"]))
    if m.environment.get("gpus"):
        out.append(Suspect("CUDA graphs", "GPU run", add=["--enforce-eager"]))
        out.append(Suspect("FULL CUDA graphs", "GPU run",
                           add=[f"--compilation-config={PIECEWISE}"],
                           drop=["--compilation-config", "-O"]))
    for a in extra:
        out.append(Suspect(a, "--suspect", add=[a]))
    for d in drops:
        out.append(Suspect(f"without {d}", "--suspect-drop", drop=[d]))
    return out


def failing_cases(m: Manifest, include_warnings: bool = False) -> list[Case]:
    """One case per distinct (prompt, phase concurrency) whose divergence fails the run (with
    ``include_warnings``: every divergence, near ties and also_in_control ones too).

    Raises UsageError when the run kept no prompt IDs for them (runs before prompt keeping)."""
    groups: dict[tuple[str, int], list] = {}
    for r in m.requests:
        if r.divergence and (include_warnings or r.divergence.fails):
            groups.setdefault((r.prompt_hash, r.concurrency), []).append(r)
    cases = []
    for i, ((ph, conc), recs) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0].id), 1):
        r0 = recs[0]
        if ph not in m.prompts:
            raise UsageError(f"{m.run_id}: the manifest keeps no prompt IDs for {r0.prompt_key}; "
                             "rerun with this version of ple-harness to explain it")
        levels = {"alone": (1, [(m.prompts[ph], r0.max_tokens)])}
        phase = [q for q in m.requests if q.phase == r0.phase and q.prompt_hash in m.prompts]
        if conc > 1 and len(phase) > 1:
            levels["with its phase companions"] = (conc, [(m.prompts[q.prompt_hash], q.max_tokens)
                                                          for q in phase])
        cases.append(Case(i, ph, conc, r0.phase, [q.id for q in recs], r0.first_divergence,
                          levels))
    return cases


def _launch_spec(m: Manifest, suspect: Suspect | None, python: str | None) -> LaunchSpec:
    from .attribution import control_args
    la = m.engine.get("launch") or {}
    env = {k: (os.environ.get(k, "") if v == "<redacted>" else v)
           for k, v in (la.get("env") or {}).items()}
    args = list(la.get("engine_args") or [])
    if suspect is not None:
        args = control_args(args, suspect.drop, suspect.add)
    return LaunchSpec(model=la["model"], python=python or la["python"], tp=la.get("tp", 1),
                      engine_args=args, env=env, host=la.get("host", "127.0.0.1"),
                      served_model_name=m.engine.get("model"))


class _Replayer:
    """Runs case levels on one engine and judges them against that engine's own warm solo
    references (cached per prompt)."""

    def __init__(self, client: EngineClient):
        self.client = client
        self.refs: dict[tuple[str, int], list[int]] = {}

    def _solo(self, ids: list[int], mt: int) -> list[int]:
        key = (token_hash(ids), mt)
        if key not in self.refs:
            self.client.complete(ids, mt)  # cold run: discarded
            c = self.client.complete(ids, mt)
            if c.error:
                raise EngineError(f"reference request failed: {c.error}: {c.error_detail}")
            self.refs[key] = list(c.token_ids)
        return self.refs[key]

    def run(self, level: tuple[int, list[tuple[list[int], int]]], tries: int) -> dict[str, Any]:
        conc, reqs = level
        refs = [self._solo(ids, mt) for ids, mt in reqs]
        seen = []
        for t in range(1, tries + 1):
            with ThreadPoolExecutor(max_workers=conc) as pool:
                outs = list(pool.map(lambda r: self.client.complete(r[0], r[1]), reqs))
            for (ids, _), ref, c in zip(reqs, refs, outs):
                if c.error is None and c.token_ids != ref:
                    seen.append({"try": t, "prompt_len": len(ids),
                                 "first_divergence": first_divergence(ref, c.token_ids),
                                 "output_hash": token_hash(c.token_ids)[:16],
                                 "reference_hash": token_hash(ref)[:16]})
            if seen:
                break
        return {"fails": bool(seen), "tries": t, "divergent": seen[:8]}


def write_repro(case: Case, path: Path, run_id: str) -> None:
    """The case's minimal failing level as a ``replay`` scenario file, with the comparisons that
    failed there (``[[params.failed]]``: which request, compared with that engine's own warm
    single-request reference, first divergent position; :mod:`pleharness.scenarios.replay`)."""
    name = case.minimal or "with its phase companions"
    conc, reqs = case.levels.get(name) or case.levels["alone"]
    phase = f"case{case.index}-{name.replace(' ', '-')}"
    lines = [f"# ple-harness explain {run_id}, case {case.index}: {case.phase} (C{case.concurrency}),"
             f" requests {', '.join(case.requests)}",
             f"# minimal failing level: {name}. Replay: ple-harness stress --scenario {path.name} "
             "(with the run's engine arguments)",
             'kind = "replay"', f'description = "explain case {case.index}: {name}"', "",
             "[[params.phases]]", f'name = "{phase}"',
             f"concurrency = {conc}"]
    for ids, mt in reqs:
        lines += ["", "[[params.phases.requests]]", f"prompt = {json.dumps(ids)}",
                  f"max_tokens = {mt}"]
    lines += _failed_lines(case, name, phase, reqs)
    write_atomic(path, "\n".join(lines) + "\n")


def _failed_lines(case: Case, level: str, phase: str, reqs: list) -> list[str]:
    """``[[params.failed]]`` entries for a case's reproducer: the divergent requests of its
    minimal level on the configuration under test (each against that engine's warm solo
    reference: its 2nd solo run), else the run's own first divergence."""
    seen = (case.baseline.get(level) or {}).get("divergent") or []
    out: list[str] = []
    lens = [len(ids) for ids, _ in reqs]
    for d in seen[:8]:
        j = lens.index(d["prompt_len"]) if d.get("prompt_len") in lens else None
        out += ["", "[[params.failed]]", f'phase = "{phase}"']
        if j is not None:
            out.append(f"request = {j}")
        out += [f"prompt_len = {int(d['prompt_len'])}", 'run = "load (explain replay, try '
                f'{int(d.get("try") or 1)})"',
                'compared_with = "its warm single-request reference on the same engine (2nd '
                'solo run; the cold 1st run discarded)"']
        if d.get("first_divergence") is not None:
            out.append(f"first_divergence = {int(d['first_divergence'])}")
    if not seen:
        out += ["", "[[params.failed]]", f'phase = "{phase}"',
                f'run = "load ({case.phase}, C{case.concurrency}, requests '
                f'{", ".join(case.requests[:4])} of the explained run)"',
                'compared_with = "its single-request reference in the explained run"']
        if case.first_divergence is not None:
            out.append(f"first_divergence = {int(case.first_divergence)}")
    return out


def confirm_repros(report: dict[str, Any], m: Manifest, run_dir: Path, runs: int, *,
                   engine_python: str | None = None, start_timeout_s: float = 900.0,
                   console: Console | None = None) -> None:
    """Replay every case's ``repro-N.toml`` ``runs`` times, each on a freshly started engine of
    the configuration under test (:mod:`pleharness.reproduce`); each report case gets
    ``reproduction`` (the result) and ``reproduction_verdict`` ("reproduced 3/3 on fresh
    engines", "0/3: not reproduced ..."). Cases whose reproducers replay the same schedule (the
    cases of one phase, at its companions level) are replayed once and share the result
    (``same_schedule_as``). Replays run under ``RUN/explain/confirm/``."""
    from .reproduce import ReplayInterrupted, ReplayTarget, replay_reproducer
    console = console or Console(stderr=True)
    o = m.run_options
    rt = ReplayTarget(launch=_launch_spec(m, None, engine_python),
                      golden=o.get("golden", True) is not False, strict=bool(o.get("strict")),
                      reference_cache_state=o.get("reference_cache_state") or "warm",
                      start_timeout_s=start_timeout_s)
    from .scenarios import load_scenario_file
    done: dict[str, tuple[str, dict]] = {}  # schedule key -> (repro, result)
    for c in report["cases"]:
        path = run_dir / c["repro"]
        # cases of one phase share its schedule ("with its phase companions"): replayed once
        key = json.dumps([[ph.concurrency, [r.model_dump() for r in ph.requests]]
                          for ph in load_scenario_file(str(path)).params.phases],
                         sort_keys=True)  # phase names carry the case number: not compared
        if key in done:
            first, res = done[key]
            c["reproduction"] = {**res, "same_schedule_as": first}
            c["reproduction_verdict"] = f"{res['verdict']} (the schedule of {first})"
            continue
        console.print(f"confirming {escape(c['repro'])}: {runs} replay(s), each on a freshly "
                      "started engine", highlight=False)
        try:
            res = replay_reproducer(path, rt, runs, path.parent / "confirm",
                                    log=lambda x: console.print(escape(x), highlight=False))
        except ReplayInterrupted:
            raise KeyboardInterrupt from None
        done[key] = (c["repro"], res)
        c["reproduction"] = res
        c["reproduction_verdict"] = res["verdict"]
        console.print(f"{escape(c['repro'])}: {escape(res['verdict'])}", highlight=False)


def explain(run: Path, *, suspects_extra: Sequence[str] = (), suspects_drop: Sequence[str] = (),
            auto_suspects: bool = True, include_warnings: bool = False, tries: int = 3,
            budget_s: float = 3600.0, engine_python: str | None = None,
            start_timeout_s: float = 900.0, console: Console | None = None,
            confirm_runs: int = 3) -> dict[str, Any]:
    """Explain the failing divergences of the run at ``run`` (folder or manifest); see the module
    docstring. Returns the report dict (also written to ``RUN/explain/explain.json``).

    ``confirm_runs``: replays of each reproducer on fresh engines (:func:`confirm_repros`; 0:
    skip).

    Raises UsageError for a run that cannot be explained (attached engine, nothing failing, no
    prompt IDs kept); EngineError when the configuration under test cannot be started.
    """
    console = console or Console(stderr=True)
    try:
        m = load_manifest(run)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run_dir = Path(run) if Path(run).is_dir() else Path(run).parent
    if m.engine.get("mode") != "launched" or not m.engine.get("launch"):
        raise UsageError(f"{run}: explain relaunches the engine, so the run must have been "
                         "launched by the harness (not attached with --url)")
    cases = failing_cases(m, include_warnings)
    out_dir = run_dir / "explain"
    out_dir.mkdir(exist_ok=True)
    report: dict[str, Any] = {"run_id": m.run_id, "tries": tries, "budget_s": budget_s,
                              "cases": [], "suspects": [], "launches": []}
    if not cases:
        console.print("no failing divergences in this run: nothing to explain")
        write_atomic(out_dir / "explain.json", json.dumps(report, indent=1))
        return report
    suspects = suspects_for(m, suspects_extra, suspects_drop, auto_suspects)
    report["suspects"] = [s.__dict__ for s in suspects]
    console.print(f"{len(cases)} failing case(s); {1 + len(suspects)} engine launch(es) planned: "
                  f"the configuration under test, then without: "
                  f"{', '.join(s.name for s in suspects) or '(no suspects)'}", highlight=False)
    t0 = time.monotonic()
    configs: list[Suspect | None] = [None, *suspects]
    for n, sus in enumerate(configs):
        label = "under test" if sus is None else f"without {sus.name}"
        if time.monotonic() - t0 > budget_s:
            report["launches"].append({"config": label, "skipped": "budget"})
            for c in cases:
                if sus is not None:
                    c.results[sus.name] = {"skipped": "budget"}
            continue
        todo = [c for c in cases if sus is None or c.minimal is not None]
        if not todo:
            break
        spec = _launch_spec(m, sus, engine_python)
        console.print(f"[{n + 1}/{len(configs)}] launching the engine {escape(label)} ...",
                      highlight=False)
        srv = EngineServer(spec, out_dir, start_timeout_s, log_name=f"engine-{n}")
        try:
            srv.start()
        except EngineError as exc:
            if sus is None:
                raise
            report["launches"].append({"config": label, "error": str(exc.args[0]),
                                       "root_cause": exc.root_cause})
            for c in todo:
                c.results[sus.name] = {"error": str(exc.args[0])}
            continue
        try:
            client = EngineClient(srv.url, spec.served_model_name)
            client.resolve_model()
            rp = _Replayer(client)
            report["launches"].append({"config": label, "command": srv.command,
                                       "ready_s": round(srv.ready_s or 0, 1)})
            for c in todo:
                if sus is None:
                    for name, level in c.levels.items():
                        res = rp.run(level, tries)
                        c.baseline[name] = res
                        if res["fails"]:
                            c.minimal = name
                            break
                else:
                    res = rp.run(c.levels[c.minimal], tries)
                    c.results[sus.name] = {**res, "vanishes": not res["fails"]}
        finally:
            srv.stop()
    for c in cases:
        path = out_dir / f"repro-{c.index}.toml"
        write_repro(c, path, m.run_id)
        report["cases"].append({
            "case": c.index, "prompt_hash": c.prompt_hash, "concurrency": c.concurrency,
            "phase": c.phase, "requests": c.requests, "first_divergence": c.first_divergence,
            "minimal_case": c.minimal, "baseline": c.baseline, "controls": c.results,
            "attribution": c.attribution(), "repro": str(path.relative_to(run_dir))})
    if confirm_runs:
        confirm_repros(report, m, run_dir, confirm_runs, engine_python=engine_python,
                       start_timeout_s=start_timeout_s, console=console)
    report["elapsed_s"] = round(time.monotonic() - t0, 1)
    write_atomic(out_dir / "explain.json", json.dumps(report, indent=1))
    write_atomic(out_dir / "explain.md", to_markdown(report))
    write_atomic(out_dir / "junit.xml", to_junit(report))
    render(report, console)
    return report


def render(report: dict[str, Any], console: Console) -> None:
    """The attribution table on the console."""
    t = Table(title=escape(f"explain {report['run_id']}"))
    for col in ("case", "phase", "C", "requests", "minimal case", *[s["name"] for s in
                                                                   report["suspects"]],
                "attribution"):
        t.add_column(escape(col))
    for c in report["cases"]:
        cells = []
        for s in report["suspects"]:
            r = c["controls"].get(s["name"], {})
            cells.append("skipped" if r.get("skipped") else "error" if r.get("error") else
                         "-" if not r else "vanishes" if r.get("vanishes") else "persists")
        t.add_row(str(c["case"]), escape(c["phase"]), str(c["concurrency"]),
                  escape(", ".join(c["requests"][:4])), escape(c["minimal_case"] or "-"),
                  *cells, escape(c["attribution"]))
    console.print(t)


def to_markdown(report: dict[str, Any]) -> str:
    """The attribution table and evidence as Markdown (pasteable into a PR)."""
    sus = [s["name"] for s in report["suspects"]]
    lines = [f"## Attribution (`ple-harness explain {report['run_id']}`)", "",
             f"Engine launches: {len(report['launches'])}; tries per replay: {report['tries']}; "
             f"{report.get('elapsed_s', 0)} s.", "",
             "| case | phase | C | requests | minimal case | " + " | ".join(sus) +
             " | attribution | reproducer |",
             "|---:|---|---:|---|---|" + "---|" * len(sus) + "---|---|"]
    for c in report["cases"]:
        cells = []
        for s in sus:
            r = c["controls"].get(s, {})
            cells.append("skipped" if r.get("skipped") else "error" if r.get("error") else "-"
                         if not r else "vanishes" if r.get("vanishes") else "persists")
        lines.append(f"| {c['case']} | {c['phase']} | {c['concurrency']} | "
                     f"{', '.join(c['requests'][:4])} | {c['minimal_case'] or '-'} | "
                     + " | ".join(cells) + f" | {c['attribution']} | `{c['repro']}` |")
    lines += ["", "Evidence (first divergent positions, per configuration):", ""]
    for c in report["cases"]:
        base = {k: [d["first_divergence"] for d in v["divergent"]] for k, v in c["baseline"].items()}
        ctl = {k: [d["first_divergence"] for d in v.get("divergent", [])]
               for k, v in c["controls"].items()}
        lines.append(f"- case {c['case']}: under test {base}; controls {ctl}")
    for c in report["cases"]:
        if c.get("reproduction_verdict"):
            lines.append(f"- case {c['case']}: `{c['repro']}` {c['reproduction_verdict']}")
    for la in report["launches"]:
        if la.get("command"):
            lines.append(f"- {la['config']}: `{' '.join(la['command'])}`")
    return "\n".join(lines) + "\n"


def to_junit(report: dict[str, Any]) -> str:
    """JUnit XML: one test case per failing divergence; the failure message names the suspect."""
    root = ET.Element("testsuites", name=f"ple-harness explain {report['run_id']}")
    suite = ET.SubElement(root, "testsuite", name="explain", tests=str(len(report["cases"])),
                          failures=str(len(report["cases"])))
    for c in report["cases"]:
        tc = ET.SubElement(suite, "testcase", classname="explain",
                           name=f"case {c['case']}: {c['phase']} C{c['concurrency']} "
                                f"({', '.join(c['requests'][:4])})")
        f = ET.SubElement(tc, "failure", message=c["attribution"])
        f.text = json.dumps({"minimal_case": c["minimal_case"], "controls": c["controls"],
                             "reproduction": c.get("reproduction_verdict")}, indent=1)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
