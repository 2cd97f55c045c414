"""``ple-harness selftest``: the detection power of a suite on this engine (issue 27).

The harness's own negative control, the black-box analogue of vLLM's tests that plant corrupted
logprobs in their accuracy checker: one engine is launched (or attached with ``--url``), and the
chosen suite runs against it through an in-process fault-injection proxy
(:class:`pleharness.faults.proxy.FaultProxy`) once clean and once per planted fault class
(:data:`pleharness.faults.builtin.BUILTIN`). Each pass is a complete ``stress`` run of its own
(its own references, manifest and verdict) in ``<results-dir>/<selftest-id>/<NN>-<class>/``.

Per class: ``detected`` (the fault fired on at least one request, and a rule the clean pass did
not raise failed on a request of a prompt the fault changed, or on a phase holding one: issue 47
item 4, a pass that fails for the engine's own numerics detects nothing), ``missed`` (the fault
fired and nothing of its own failed), or ``missed (never triggered)`` (the suite never sent what
the fault needs, e.g. no two requests in flight for ``flip_under_load`` with ``--scenario
boundary``): never hidden. A family class that was not detected because this engine cannot
serve or judge what it changes, which its scenario says with the reason (issue 52: requests
left out, no LoRA adapter, seeded or truncated samples and logit_bias with speculative
decoding, seeded choices sent uncompared where seeds do not reproduce;
:meth:`~pleharness.faults.builtin.SelftestFault.vacuous`), is ``vacuous (reason)``: neither
detected nor missed, named in the headline, not a failure. ``caught_by`` lists the rules that caught it; ``also_failed`` the
rules that failed elsewhere or that the clean pass raised too. The clean pass's failures are
false alarms; a clean pass that fails makes the headline "clean pass failed (rules ...):
detection power unknown for them". Exit 0 when every class is detected (or vacuous) and the clean pass has
no false alarm, 1 otherwise, 2 usage error, 3 the engine failed to start or died, 130 / 143
interrupted.

The engine's own numerics (issue 47 item 3): the clean pass measures them on itself
(``--numerics-from self``: it is the measurement, nothing is planted in it), every fault pass is
judged at that envelope (``--numerics-from`` the clean pass: a planted fault cannot widen its own
tolerance), and each class sizes what it plants to it (:meth:`SelftestFault.calibrate`: a flip
at a margin twice the measured near-tie threshold, logprobs lowered by twice the logprob
tolerance), so the headline says what this suite detects on this engine. The engine
runs in one :class:`~pleharness.engine.session.EngineSession` (stopped on every exit path, its
GPU memory checked after a launch on GPUs: ``selftest.json``'s ``gpu_memory``).

Family classes (:mod:`pleharness.faults.families`, :mod:`~pleharness.faults.scores` and
:mod:`~pleharness.faults.shapes`, issue 35 item 8 and issue 52: stop strings, mixed parameters,
token-level stops, chat completions, client disconnects, prefix-cache isolation, sampled
requests, several choices, prompt logprobs, emitted-token logprobs, sampling parameters in one
batch, stops with min_tokens, special tokens, LoRA adapters, stops in streams) plant a fault on one request feature; the pass of such a class runs only
its family's scenario (the suite's entry of that kind, else the entry of
``scenarios/suites/selftest-families.toml``), and the clean pass runs the suite plus every
family scenario the suite lacks, so the false alarms are counted on all of them
(:func:`plan_passes`).

Default suite: ``scenarios/suites/selftest.toml`` (a short ladder with C3 and C2, boundary depth
1 with the warm half, pairs): every built-in class needs concurrency, a warm run, logprobs or
streamed and non-streamed answers, which it has, and its ten passes take a few minutes on the
CPU engine; the default suite (transitions x2, boundary depth 3, insert's 300-token decode) would
take about ten times as long. ``--suite default`` runs the default suite instead.
"""
from __future__ import annotations

import io
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .causes import causes
from .engine.inflight import LoopThread
from .engine.session import EngineSession, Interrupted
from .environment import gpu_inventory
from .errors import EngineError, ExitCode, UsageError
from .faults import BUILTIN, FamilyFault, SelftestFault
from .faults.proxy import FaultProxy
from .faults.rules import Fault
from .files import write_private
from .jobrecord import JobFrame, JobRecord
from .manifest import load_manifest
from .pipeline import run_stress
from .run.rundir import new_run_dir
from .scenarios import load_scenario_file, load_scenarios
from .suites import load_suite

DEFAULT_SUITE = "selftest"
FAMILY_SUITE = "selftest-families"  # the family classes' scenarios when the suite lacks them


@dataclass
class PassResult:
    """One pass: ``fault`` (None: the clean pass), its run's exit code and verdict, the requests
    the fault changed, the rules that failed (``caught_by``), and the outcome."""

    name: str
    run_dir: str
    exit_code: int
    verdict: str | None
    fired: int = 0
    caught_by: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    also_failed: list[str] = field(default_factory=list)  # elsewhere, or raised clean too
    outcome: str = ""
    summary: str = ""
    wall_s: float = 0.0
    ran: list[str] = field(default_factory=list)  # the scenarios of this pass
    family: str = ""  # a family class's feature ("" for the core classes and the clean pass)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def caught_by(m, keys: set[tuple] | None = None) -> list[str]:
    """The rules that failed in manifest ``m``: ``parity`` for untolerated token differences,
    each failed request check and phase check by name, ``request_error`` for failed requests.
    With ``keys`` (a fault's (prompt hash, max_tokens) pairs; ("chat",): any chat request),
    only on the requests of those and in the phase checks of the phases holding one."""
    def mine(r) -> bool:
        return keys is None or (r.prompt_hash, r.max_tokens) in keys or (
            ("chat",) in keys and r.api == "chat")
    names, phases = set(), set()
    for r in m.requests:
        if not mine(r):
            continue
        phases.add(r.phase)
        if r.parity_failed:
            names.add("parity")
        if r.request_error:
            names.add("request_error")
        names.update(c.name for c in r.failed_checks)
    for p in m.phases:
        if keys is None or p.name in phases:
            names.update(c.name for c in p.checks if c.status == "fail")
    return sorted(names)


def judge(name: str, fault: SelftestFault | None, code: int, m,
          clean_rules: Sequence[str] = ()) -> PassResult:
    """The outcome of one pass (see the module docstring); ``clean_rules``: the rules the clean
    pass raised (they detect nothing)."""
    res = PassResult(name=name, run_dir="", exit_code=code, verdict=m.verdict if m else None,
                     fired=len(set(fault.hits)) if fault is not None else 0,
                     caught_by=caught_by(m) if m else [], causes=causes(m)[:5] if m else [],
                     summary=fault.summary if fault is not None else "no fault")
    if fault is not None and m is not None:
        own = [x for x in caught_by(m, fault.keys) if x not in clean_rules]
        res.also_failed = [x for x in res.caught_by if x not in own]
        res.caught_by = own
    if code not in (ExitCode.OK, ExitCode.FAIL):
        res.outcome = f"error (exit {code})"
    elif fault is None:
        res.outcome = "clean" if code == ExitCode.OK else "false alarm"
    elif res.fired and code == ExitCode.FAIL and res.caught_by:
        res.outcome = "detected"
    elif (why := fault.vacuous(m)) is not None:
        res.outcome = f"vacuous ({why})"
    elif not res.fired:
        res.outcome = "missed (never triggered)"
    else:
        res.outcome = "missed" + (f" (failed only on what the clean pass raised or elsewhere: "
                                  f"{', '.join(res.also_failed)})" if res.also_failed else "")
    return res


def false_alarms(m) -> int:
    """Failures of a clean pass: problem requests plus failed phases (0 for a passing run)."""
    if m is None:
        return 0
    return (sum(1 for r in m.requests if r.is_problem)
            + sum(1 for p in m.phases if p.status == "fail"))


def headline(results: list[PassResult], alarms: int) -> str:
    """'this suite on this engine catches 9/9 planted fault classes; 0 false alarms', led by
    'clean pass failed (rules ...): detection power unknown for them; ' when the clean pass
    failed."""
    faults = [r for r in results if r.name != "clean" and not r.outcome.startswith("vacuous")]
    vacuous = [r.name for r in results if r.outcome.startswith("vacuous")]
    hit = sum(1 for r in faults if r.outcome == "detected")
    clean = next((r for r in results if r.name == "clean"), None)
    lead = ""
    if clean is not None and clean.outcome == "false alarm":
        lead = (f"clean pass failed (rules {', '.join(clean.caught_by) or '-'}): detection "
                "power unknown for them; ")
    line = lead + (f"this suite on this engine catches {hit}/{len(faults)} planted fault "
                   f"classes; {alarms} false alarm{'s' if alarms != 1 else ''}")
    missed = [r.name for r in faults if r.outcome != "detected"]
    if missed:
        line += f" (missed: {', '.join(missed)})"
    if vacuous:
        line += (f"; {len(vacuous)} vacuous on this engine, its requests left out: "
                 f"{', '.join(vacuous)}")
    return line


def _name(ref) -> str:
    return ref if isinstance(ref, str) else ref[0]


def plan_passes(cfg, faults: list[str], kinds: list[str]) -> list[tuple[str, Any, list]]:
    """(name, fault or None, scenario refs) of every pass: the clean pass first, then one per
    class of ``faults`` (names of :data:`BUILTIN`, instantiated here). ``kinds``: the scenario
    kind of each of ``cfg.suite.scenarios``. A core class's pass runs the suite; a family class's
    pass (:class:`~pleharness.faults.families.FamilyFault`) runs only the scenarios of its family:
    the suite's entry of that kind, else the entry of :data:`FAMILY_SUITE`; the clean pass runs
    the suite and every family scenario the suite lacks (so its false alarms cover all of them).
    Raises UsageError when the family suite lacks a family's scenario."""
    base = list(cfg.suite.scenarios)
    own = {k: ref for k, ref in zip(kinds, base)}
    fams = [BUILTIN[f]() for f in faults]
    wanted = [k for f in fams if isinstance(f, FamilyFault) for k in f.scenarios]
    extra: dict[str, Any] = {}
    if any(k not in own for k in wanted):
        refs = {_name(r): r for r in load_suite(FAMILY_SUITE).scenario_refs()}
        for r in load_suite(DEFAULT_SUITE).scenario_refs():  # e.g. transitions, for a suite
            refs.setdefault(_name(r), r)                      # that is the family suite itself
        for f in fams:
            for k in getattr(f, "scenarios", ()) if isinstance(f, FamilyFault) else ():
                if k not in own and k not in refs:
                    raise UsageError(f"--fault {f.name}: its pass needs a {k!r} scenario, which "
                                     f"neither the suite nor {FAMILY_SUITE} or {DEFAULT_SUITE} "
                                     "holds: add one to the suite, or leave the class out")
                if k not in own:
                    extra[k] = refs[k]
    clean = base + [extra[k] for k in dict.fromkeys(wanted) if k in extra]
    plan: list[tuple[str, Any, list]] = [("clean", None, clean)]
    for name, f in zip(faults, fams):
        if isinstance(f, FamilyFault):
            plan.append((name, f, [own.get(k) or extra[k] for k in f.scenarios]))
        else:
            plan.append((name, f, base))
    return plan


def _overrides_for(refs: list, overrides: dict[str, Any]) -> dict[str, Any]:
    """The command-line overrides that apply to one of ``refs`` (a family pass runs a subset of
    the suite: an override of the suite's other scenarios is no error there)."""
    if not overrides:
        return {}
    keys = {k for r in refs for k in type(load_scenario_file(_name(r)).params).model_fields}
    return {k: v for k, v in overrides.items() if k in keys}


def run_selftest(cfg, faults: list[str], console: Console, err: Console,
                 selftest_id: str | None = None) -> int:
    """Run the clean pass and one pass per fault class in ``faults`` (names of
    :data:`BUILTIN`) against one engine, with ``cfg`` (a :class:`pleharness.config.StressConfig`:
    the engine, scenarios and options of every pass). Each pass is a ``stress`` run
    (:func:`pleharness.pipeline.run_stress`, one floor down: a job imports no other job). Writes
    ``selftest.json`` (the rows and the headline) in the selftest folder first, after every pass
    and at the end, with the job's record (``job``: :class:`~pleharness.jobrecord.JobRecord`,
    the steps engine, passes, verdict) and from it ``status`` (running | complete |
    interrupted | failed, with ``error``; an engine that did not start also with
    ``root_cause`` and ``engine_log`` | engine_died: the engine died during the passes) and
    ``exit_code``, and prints a table. Returns the exit code (module
    docstring). Raises UsageError for an unknown fault class or bad options, before anything
    starts."""
    unknown = [f for f in faults if f not in BUILTIN]
    if unknown:
        raise UsageError(f"--fault {unknown[0]!r}: not a built-in fault class (known: "
                         f"{', '.join(BUILTIN)})")
    cfg.validate()
    # bad input: before anything starts
    kinds = [sc.kind for sc in load_scenarios(cfg.suite.scenarios, cfg.suite.overrides)]
    plan = plan_passes(cfg, faults, kinds)
    for refs in {repr(r): r for _n, _f, r in plan if r != list(cfg.suite.scenarios)}.values():
        load_scenarios(refs, _overrides_for(refs, cfg.suite.overrides))
    target = cfg.target(console)
    sid, sdir = new_run_dir(Path(cfg.output.results_dir), selftest_id)
    console.print(f"selftest {sid}: {len(faults)} fault classes + 1 clean pass; results in "
                  f"{escape(str(sdir))}")
    results: list[PassResult] = []
    extra: dict[str, Any] = {}  # false_alarms, then headline, gpu_memory; error, root_cause
    scen = [s if isinstance(s, str) else s[0] for s in cfg.suite.scenarios]

    def save(rec: JobRecord) -> None:
        """selftest.json now: written first, after every pass, and at the end (issue 37)."""
        out = {"selftest_id": sid, "status": rec.status, "scenarios": scen,
               "passes": [r.as_dict() for r in results], **extra}
        if rec.exit_code is not None:
            out["exit_code"] = rec.exit_code
        out["job"] = rec.model_dump()
        write_private(sdir / "selftest.json", json.dumps(out, indent=2))

    def failed(exc: BaseException, rec: JobRecord) -> None:
        extra["error"] = str(exc)[:500]
        if isinstance(exc, EngineError):
            extra.update(root_cause=rec.root_cause, engine_log=exc.log_path)

    frame = JobFrame("selftest", save, crash_dir=sdir, on_error=failed)
    try:
        with frame:
            code, why = _passes(cfg, plan, target, sdir, frame, results, extra, console)
            with frame.step("verdict"):
                alarms = extra.get("false_alarms", 0)
                line = headline(results, alarms)
                ok = code == ExitCode.OK and alarms == 0 and all(
                    r.outcome == "detected" or r.outcome.startswith("vacuous")
                    for r in results if r.name != "clean") and \
                    len(results) == len(faults) + 1
                if code == ExitCode.OK and not ok:
                    code = ExitCode.FAIL
                extra["headline"] = line
            if code in (ExitCode.OK, ExitCode.FAIL):
                frame.complete(code)
            else:  # the passes were cut short: the engine died, or a pass ended in an error
                frame.complete(code, "engine_died" if code == ExitCode.ENGINE else "failed",
                               why)
    except EngineError as exc:  # the engine did not start: its record, no traceback
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        console.print(f"selftest.json: {escape(str(sdir / 'selftest.json'))}")
        return int(frame.record.exit_code)
    render(results, line, console)
    console.print(f"selftest.json: {escape(str(sdir / 'selftest.json'))}")
    return int(code)


def _passes(cfg, plan: list, target, sdir: Path, frame: JobFrame, results: list[PassResult],
            extra: dict[str, Any], console: Console) -> tuple[int, str | None]:
    """The selftest's steps on its engine, in one engine session (stopped on every exit path):
    ``engine`` (start or attach it), ``passes`` (the clean pass, then one per class, each
    judged and added to ``results``, ``extra["false_alarms"]`` updated, the record saved after
    each; a pass that ended in an error or an engine that died ends them). Returns (the exit
    code so far: 0, or that of the pass that ended them; why they ended early, or None).
    Raises EngineError when the engine does not start; Interrupted when a pass was
    interrupted."""
    code, why = ExitCode.OK, None
    extra["false_alarms"] = 0
    with EngineSession(console, sdir, timeouts=cfg.timeouts,
                       explicit_facts=cfg.attach.explicit_facts,
                       gpus_before=gpu_inventory() if cfg.attach.url is None else None,
                       gpu_tolerance_mib=cfg.engine.gpu_memory_tolerance_mib) as session:
        with frame.step("engine"):
            eng = session.start(target, gather=False)
        facts = dict(cfg.attach.explicit_facts)
        envelope, clean_dir, clean_rules = None, "self", []
        with frame.step("passes"):
            for i, (name, fault, refs) in enumerate(plan):
                if fault is not None:
                    fault.calibrate(envelope)  # sized to the clean pass's measured numerics
                numerics = cfg.verdict.numerics_from or clean_dir
                pcfg = replace(
                    cfg, engine=replace(cfg.engine, model=None, args=[], env={}, profile=None),
                    verdict=replace(cfg.verdict, numerics_from=numerics),
                    attach=replace(cfg.attach, url=None, explicit_facts=facts),
                    suite=replace(cfg.suite, scenarios=list(refs),
                                  overrides=_overrides_for(refs, cfg.suite.overrides)),
                    output=replace(cfg.output, results_dir=sdir, run_id=f"{i:02d}-{name}",
                                   invocation=cfg.output.invocation
                                   + [f"(selftest pass {name})"]))
                res, pcode, m = _run_pass(pcfg, name, fault, eng.client, clean_rules)
                res.ran, res.family = [_name(r) for r in refs], getattr(fault, "family", "")
                if pcode in (ExitCode.SIGINT, ExitCode.SIGTERM):  # the pass was interrupted:
                    results.append(res)  # so is the selftest (not "complete, catches 0/0")
                    raise Interrupted(pcode - 128)
                if fault is None:
                    if pcode in (ExitCode.OK, ExitCode.FAIL):
                        extra["false_alarms"] = false_alarms(m)
                    clean_rules = list(res.caught_by)
                    envelope = m.run_options.numerics_envelope if m is not None else None
                    measured = (envelope or {}).get("measured") or {}
                    clean_dir = res.run_dir if measured.get("logprob_nats") is not None \
                        or measured.get("flip_margin_nats") is not None else None
                results.append(res)
                frame.save(frame.record)
                alarms = extra["false_alarms"]
                console.print(f"  {name}: {res.outcome}"
                              + (f" (fired on {res.fired} request(s); caught by "
                                 f"{', '.join(res.caught_by) or '-'})" if fault is not None else
                                 f" ({alarms} false alarm(s))")
                              + f" [{res.wall_s:.0f} s]")
                if res.outcome.startswith("error"):
                    code = ExitCode.ENGINE if pcode == ExitCode.ENGINE else pcode
                    why = f"pass {name} ended in an {res.outcome}"
                    break
                if eng.server is not None and not eng.server.alive():
                    code, why = ExitCode.ENGINE, f"the engine died during pass {name}"
                    break
    if session.gpu_memory:  # a launched engine on GPUs: did their memory come back?
        extra["gpu_memory"] = session.gpu_memory
    return code, why


def _run_pass(pcfg, name: str, fault: SelftestFault | None, client,
              clean_rules: Sequence[str] = ()) -> tuple:
    """One pass: the ``stress`` run ``pcfg`` (:func:`pleharness.pipeline.run_stress`) through a
    fault proxy in front of ``client``'s engine planting ``fault`` (None: the clean pass).
    Returns (its :class:`PassResult`, its exit code, its manifest or None). Raises UsageError
    naming the pass."""
    t0 = time.monotonic()
    with FaultProxy(client.base_url, fault or Fault()) as proxy:
        pcfg = replace(pcfg, attach=replace(pcfg.attach, url=proxy.url))
        quiet = Console(file=io.StringIO(), width=200)
        try:
            pcode = run_stress(pcfg, quiet, quiet)
        except UsageError as exc:
            raise UsageError(f"selftest pass {name}: {exc}") from None
    _close_pass_clients(keep=client)
    mpath = Path(pcfg.output.results_dir) / pcfg.output.run_id / "manifest.json"
    m = load_manifest(mpath) if mpath.exists() else None
    res = judge(name, fault, pcode, m, clean_rules)
    res.run_dir = str(Path(pcfg.output.results_dir) / pcfg.output.run_id)
    res.wall_s = round(time.monotonic() - t0, 1)
    return res, pcode, m


def _close_pass_clients(keep) -> None:
    """Close the HTTP clients a finished pass left open (its run's engine client), so that ten
    passes in one process leave no unclosed aiohttp session behind; ``keep``: the selftest's own
    client of the engine."""
    own = getattr(keep, "_lt", None)
    for lt in list(LoopThread.live):
        if lt is not own:
            lt.close()


def _ran(r: dict) -> str:
    """What a pass ran, for the table: "suite" for the suite itself, else its scenarios."""
    return ", ".join(r.get("ran") or []) if r.get("family") else "suite"


def render(results: list[PassResult], line: str, console: Console) -> None:
    """The per-class table (a family class's row names its family and the scenarios its pass
    ran) and the headline."""
    t = Table(title="selftest: planted fault classes")
    for col in ("class", "family", "what was planted", "ran", "fired on", "outcome", "caught by"):
        t.add_column(col)
    for r in results:
        t.add_row(escape(r.name), escape(r.family or "-"), escape(r.summary),
                  escape(_ran(r.as_dict())), "-" if r.name == "clean" else str(r.fired),
                  escape(r.outcome), escape(", ".join(r.caught_by) or "-"),
                  style="" if r.outcome in ("detected", "clean") else "red")
    console.print(t)
    console.print(escape(line))


def markdown_table(path: Path) -> str:
    """The rows of a ``selftest.json`` as a Markdown table (for a README or a PR)."""
    data = json.loads(Path(path).read_text())
    lines = ["| class | family | what was planted | ran | fired on (requests) | outcome | caught by |",
             "|---|---|---|---|---:|---|---|"]
    for r in data["passes"]:
        lines.append(f"| {r['name']} | {r.get('family') or '-'} | {r['summary']} | {_ran(r)} | "
                     f"{'-' if r['name'] == 'clean' else r['fired']} | {r['outcome']} | "
                     f"{', '.join(r['caught_by']) or '-'} |")
    return "\n".join(lines + ["", data["headline"]])
