"""The ``stress`` job: launch or attach, run the selected scenarios, write the manifest, verdict."""
from __future__ import annotations


import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape


def esc(x) -> str:
    """Text for rich's console: user-given paths and messages may contain [brackets]."""
    return escape(str(x))

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .engine.client import EngineClient, Timeouts
from .errors import EXIT_INTERNAL, EngineError, HarnessError, UsageError, write_crash_log
from .engine.facts import gather_facts
from .engine.launch import EngineServer, LaunchSpec, engine_python_check, redact_env
from .manifest import Manifest, now_iso, write_manifest
from .report import headline, render
from .environment import environment_info, gpu_inventory, harness_info
from .runner import (EXIT_ENGINE, EXIT_FAIL, EXIT_OK, RequestTimeoutAbort, RunContext,
                     new_run_dir)
from .scenarios import Scenario, load_scenario_file

DEFAULT_SCENARIOS = ["transitions", "boundary", "pairs", "insert"]
# Engine arguments added when the embedded model is launched: block size 32 is valid on the CPU
# attention backend (which refuses 16) and on GPUs.
# The chunked-prefill budget is set so that the boundary lengths n*C + q are known and short.
# float32: the embedded model's own dtype (vLLM's --dtype auto would downcast it to bfloat16), so
# the engine and the golden reference (transformers, float32) compute the same numbers: measured
# 16/16 greedy outputs identical on the CPU engine, at golden margins down to 0.0036 nats.
EMBEDDED_ENGINE_ARGS = ["--block-size", "32", "--max-num-batched-tokens", "256",
                        "--dtype", "float32"]
EMBEDDED_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@dataclass
class StressConfig:
    """Resolved options of one ``ple-harness stress`` run (see ``ple-harness stress --help``)."""

    model: str | None = None
    url: str | None = None
    tp: int = 1
    engine_python: str = field(default_factory=lambda: sys.executable)
    engine_args: list[str] = field(default_factory=list)
    engine_env: dict[str, str] = field(default_factory=dict)
    served_model_name: str | None = None
    scenarios: list[str] = field(default_factory=lambda: list(DEFAULT_SCENARIOS))
    overrides: dict[str, Any] = field(default_factory=dict)
    results_dir: Path = Path("results")
    run_id: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    start_timeout_s: float = 900.0
    api_key: str | None = None
    explicit_facts: dict[str, Any] = field(default_factory=dict)
    timeouts: Timeouts = field(default_factory=Timeouts)
    invocation: list[str] = field(default_factory=list)
    profile: str | None = None
    on_timeout: str = "continue"
    gpu_memory_tolerance_mib: float = 1024.0
    reference: str = "solo"
    reference_engine_args: list[str] = field(default_factory=list)
    repeat: int = 1
    logprobs: int = 2
    near_tie_nats: float | None = None  # None: derived from the serving dtype (divergence.py)
    golden: bool = True  # classify divergences with the golden model when one can be built
    golden_model: str | None = None  # model folder for the golden model (default: the served one)
    control_engine_args: list[str] = field(default_factory=list)  # appended to the engine's args
    control_drop_args: list[str] = field(default_factory=list)  # flags removed from them
    control_profile: str | None = None  # or: the control's own engine profile (args and env)
    strict: bool = False
    reference_cache_state: str = "warm"


def load_scenarios(names: list, overrides: dict[str, Any]) -> list[Scenario]:
    """Load scenario files; each override applies to the scenarios whose parameters have that key.

    ``names`` items are a scenario name or path, or (name, params) pairs from a suite, whose
    params override the file's (command-line overrides win over both).
    """
    out = []
    for item in names:
        n, own = (item, {}) if isinstance(item, str) else item
        sc = load_scenario_file(n)
        mine = {**own, **{k: v for k, v in overrides.items() if k in type(sc.params).model_fields}}
        if mine:
            sc = load_scenario_file(n, mine)
        out.append(sc)
    unused = set(overrides) - {k for sc in out for k in type(sc.params).model_fields}
    if unused:
        raise UsageError(f"option(s) {', '.join(sorted(unused))} apply to none of the selected "
                         f"scenarios ({', '.join(str(n) for n in names)})")
    return out


class _Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _resolve_launch(cfg: StressConfig, console: Console) -> tuple[str | None, str | None,
                                                                  list[str], dict[str, str], list[str]]:
    """(model path, served name, engine args, engine env, base args for a reference engine)."""
    served_name = cfg.served_model_name
    model_path = cfg.model
    engine_args = list(cfg.engine_args)
    engine_env = dict(cfg.engine_env)
    base: list[str] = []
    if cfg.url is None:
        problem = engine_python_check(cfg.engine_python)
        if problem:
            raise UsageError(problem)
        if model_path is None:
            from .model import SERVED_NAME, ensure_embedded_model
            model_path = str(ensure_embedded_model(cfg.engine_python, log=console.print))
            served_name = served_name or SERVED_NAME
            engine_args = _defaults_not_overridden(EMBEDDED_ENGINE_ARGS, engine_args) + engine_args
            base = list(EMBEDDED_ENGINE_ARGS)  # a reference engine starts from the defaults
            engine_env = {**EMBEDDED_ENV, **engine_env}
        elif not Path(model_path).exists():
            raise UsageError(f"model path {model_path} does not exist")
    elif not EngineClient(cfg.url, api_key=cfg.api_key).health(timeout=10):
        raise UsageError(f"no engine answers GET {cfg.url.rstrip('/')}/health with 200 "
                         "(is the server running and the URL right?)")
    return model_path, served_name, engine_args, engine_env, base


def _defaults_not_overridden(defaults: list[str], user: list[str]) -> list[str]:
    """The ``--flag value`` pairs of ``defaults`` whose flag the user's arguments do not set."""
    from .engine.facts import parse_engine_args
    given = set(parse_engine_args(user))
    out = []
    for i in range(0, len(defaults), 2):
        if defaults[i] not in given:
            out += defaults[i: i + 2]
    return out


def _load_reference_manifest(spec: str) -> dict:
    from .manifest import load_manifest
    path = spec.split(":", 1)[1]
    try:
        ref = load_manifest(Path(path))
    except ValueError as exc:
        raise UsageError(f"--reference {spec}: {exc}") from None
    if not ref.references:
        raise UsageError(f"--reference {spec}: that manifest holds no references")
    return {(r.prompt_hash, r.max_tokens): r for r in ref.references}


def _launch(spec: LaunchSpec, log_dir: Path, log_name: str, cfg: StressConfig, console: Console,
            what: str) -> EngineServer:
    server = EngineServer(spec, log_dir, cfg.start_timeout_s, api_key=cfg.api_key,
                          log_name=log_name)
    with console.status(f"starting the {what} (see {log_name}.log) ..."):
        server.start()
    console.print(f"{what} ready after {server.ready_s:.0f} s at {server.url}")
    return server


def run_stress(cfg: StressConfig, console: Console | None = None,
               err_console: Console | None = None) -> int:
    """Run the job; returns the exit code (see :mod:`pleharness.runner`; 4 for an internal
    error, its traceback in ``<run>/harness-error.log``). Never leaves an engine. Reports go to
    ``console`` (stdout), errors and warnings to ``err_console`` (stderr)."""
    console = console or Console(stderr=False)
    err = err_console or Console(stderr=True)
    scenarios = load_scenarios(cfg.scenarios, cfg.overrides)  # bad input: before anything starts
    if cfg.on_timeout not in ("continue", "abort"):
        raise UsageError(f"--on-timeout {cfg.on_timeout!r}: expected continue or abort")
    if cfg.repeat < 1:
        raise UsageError("--suite-repeats must be >= 1")
    if cfg.reference_cache_state not in ("cold", "warm"):
        raise UsageError(f"--reference-cache-state {cfg.reference_cache_state!r}: expected cold "
                         "or warm")
    mode = cfg.reference.split(":", 1)[0]
    if mode not in ("solo", "engine", "manifest", "golden"):
        raise UsageError(f"--reference {cfg.reference!r}: expected solo, engine, golden or "
                         "manifest:PATH")
    if mode == "golden" and not cfg.golden:
        raise UsageError("--reference golden needs the golden model (drop --no-golden)")
    if mode == "engine" and cfg.url is not None:
        raise UsageError("--reference engine needs a launched engine (not --url)")
    control = bool(cfg.control_engine_args or cfg.control_drop_args or cfg.control_profile)
    if control and cfg.url is not None:
        raise UsageError("--control-engine-arg / --control-drop-arg / --control-profile need a "
                         "launched engine (not --url): the harness launches the control")
    stored_refs = _load_reference_manifest(cfg.reference) if mode == "manifest" else None
    model_path, served_name, engine_args, engine_env, base_args = _resolve_launch(cfg, console)
    golden_dir = cfg.golden_model or (model_path if cfg.url is None else None)
    if mode == "golden" and golden_dir is not None:
        from .golden import golden_problem
        problem = golden_problem(golden_dir)
        if problem:
            raise UsageError(f"--reference golden: {problem}")
    run_id, run_dir = new_run_dir(Path(cfg.results_dir), cfg.run_id)
    mpath = run_dir / "manifest.json"
    manifest = Manifest(run_id=run_id, harness=harness_info(), invocation=cfg.invocation,
                        scenarios=[s.definition() for s in scenarios])
    manifest.environment = environment_info(cfg.engine_python if cfg.url is None else None)
    if model_path is not None:
        from .model import model_digest
        manifest.engine["model_digest"] = model_digest(model_path)
    if manifest.environment.get("gpus"):
        from .probe import capability_summary  # cheap: capability only, never raises
        manifest.environment["ple_probe"] = capability_summary()
    manifest.summary = {"phases_planned": cfg.repeat * sum(
        getattr(s, "planned_phases", lambda: 0)() for s in scenarios),
        "phases_completed": 0, "hashes_compared": 0, "hashes_matched": 0}
    manifest.run_options = {"reference": cfg.reference, "repeat": cfg.repeat,
                            "logprobs": cfg.logprobs, "near_tie_nats": cfg.near_tie_nats,
                            "golden": cfg.golden,
                            "strict": cfg.strict, "on_timeout": cfg.on_timeout,
                            "reference_cache_state": cfg.reference_cache_state}
    write_manifest(mpath, manifest)
    console.print(f"run {run_id}: results in {esc(run_dir)}")

    servers: list[EngineServer] = []
    ready = False
    old_handlers = {}
    signalled = []

    def on_signal(signum, _frame):
        if signalled:  # a second Ctrl-C / SIGTERM: skip the grace period
            from .engine.launch import _signal_group
            for srv in servers:
                if srv.proc is not None:
                    _signal_group(srv.proc.pid, signal.SIGKILL)
            return
        signalled.append(signum)
        raise _Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old_handlers[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not in the main thread
            pass
    code = EXIT_FAIL
    gpus_before = manifest.environment.get("gpus")
    server: EngineServer | None = None
    golden_model = None
    try:
        references = dict(stored_refs or {})
        if mode == "engine":
            references = _reference_pass(cfg, manifest, mpath, scenarios, model_path, served_name,
                                         base_args, engine_args, engine_env, run_dir, console,
                                         servers)
        if cfg.url is None:
            spec = LaunchSpec(model=model_path, python=cfg.engine_python, tp=cfg.tp,
                              engine_args=engine_args, env=engine_env, host=cfg.host,
                              port=cfg.port, served_model_name=served_name)
            manifest.engine.update({"mode": "launched", "launch": _launch_record(spec, cfg),
                                    "engine_log": "engine.log", "launcher_log": "launcher.log"})
            server = _launch(spec, run_dir, "engine", cfg, console, "engine")
            servers.append(server)
            manifest.engine["command"] = server.command
            manifest.engine["ready_s"] = round(server.ready_s or 0, 3)
            url = server.url
        else:
            url = cfg.url
            manifest.engine.update({"mode": "attached", "url": url})
        client = EngineClient(url, served_name, cfg.api_key, cfg.timeouts)
        if not client.health(timeout=10):
            raise EngineError(f"no engine answers /health with 200 at {url}")
        client.resolve_model()
        ready = True
        card = client.model_card()
        manifest.engine.update({"url": url, "model": client.model, "version": client.version(),
                                "max_model_len": card.get("max_model_len"),
                                "model_root": card.get("root")})
        local_model = model_path if cfg.url is None else (card.get("root") or None)
        facts = gather_facts(explicit=cfg.explicit_facts,
                             engine_args=(server.command if server else None),
                             launched=server is not None, tp=cfg.tp, model_card=card,
                             model_path=local_model, client=client,
                             engine_log=server.log_path if server else None)
        facts.record(manifest, console)
        for sc in scenarios:
            sc.validate_against(facts.values)
        if "model_digest" not in manifest.engine and local_model:
            from .model import model_digest
            manifest.engine["model_digest"] = model_digest(local_model)
        golden_model = _golden_model(cfg, golden_dir or local_model, mode, manifest, run_dir)
        write_manifest(mpath, manifest)
        with _progress(console) as progress:
            ctx = _context(cfg, client, manifest, mpath, facts, console, server, progress)
            ctx.golden = golden_model
            if mode != "solo":
                ctx.reference_mode = mode
                ctx.references.update(references)
            _run_suite(ctx, scenarios, cfg.repeat)
        if control:
            if server is not None:  # one engine at a time (one GPU)
                server.stop()
                servers.remove(server)
            _control_pass(cfg, manifest, mpath, scenarios, facts, model_path, served_name,
                          engine_args, engine_env, run_dir, console, servers)
        manifest.status = "complete"
        code = _verdict(manifest)
    except _Interrupted as exc:
        manifest.status = "interrupted"
        manifest.verdict = "error"
        manifest.reason = f"interrupted by {signal.Signals(exc.signum).name}"
        code = 128 + exc.signum
    except RequestTimeoutAbort as exc:
        manifest.status, manifest.verdict, manifest.reason = "incomplete", "fail", str(exc)
        code = EXIT_FAIL
        err.print(f"[red]aborted:[/red] {esc(exc)}")
    except KeyboardInterrupt:
        manifest.status, manifest.verdict, manifest.reason = "interrupted", "error", "SIGINT"
        code = 130
    except EngineError as exc:
        srv = servers[-1] if servers else None
        manifest.status = "engine_died" if ready else "failed"
        manifest.verdict = "error"
        manifest.reason = str(exc.args[0]) if exc.args else str(exc)
        manifest.root_cause = exc.root_cause or (srv.root_cause() if srv else None)
        manifest.log_tail = srv.log_tail(20) if srv else []
        code = EXIT_ENGINE
        err.print(f"[red]engine error:[/red] {esc(manifest.reason)}")
        if manifest.root_cause:
            err.print(f"root cause: {esc(manifest.root_cause)}")
        if srv:
            err.print(f"engine log: {esc(srv.log_path)}")
    except HarnessError as exc:
        manifest.status, manifest.verdict, manifest.reason = "failed", "error", str(exc)
        code = exc.exit_code
        err.print(f"[red]error:[/red] {esc(exc)}")
    except Exception as exc:  # noqa: BLE001 - a harness bug still leaves an honest manifest
        log = write_crash_log(traceback.format_exc(), run_dir)
        manifest.status, manifest.verdict = "failed", "error"
        manifest.reason = (f"internal harness error: {exc.__class__.__name__}: {exc} "
                           f"(traceback in {Path(log).name})")
        err.print(f"[red]internal error:[/red] {esc(exc.__class__.__name__)}: {esc(exc)} (a "
                  f"ple-harness bug; traceback in {esc(log)})")
        code = EXIT_INTERNAL
    finally:
        try:
            if golden_model is not None:
                golden_model.close()
            for srv in servers:
                with console.status("stopping the engine ..."):
                    srv.stop(grace_s=0 if len(signalled) > 1 else None)
            if servers and gpus_before:
                _gpu_memory_after(manifest, gpus_before, cfg.gpu_memory_tolerance_mib, console)
        finally:
            for sig, h in old_handlers.items():
                signal.signal(sig, h)
            _summarize(manifest)
            manifest.ended_at = now_iso()
            manifest.exit_code = code
            if manifest.status == "running":
                manifest.status = "incomplete"
            write_manifest(mpath, manifest)
            _write_reports(manifest, run_dir)
    render(manifest, console, run_dir=str(run_dir))
    console.print(f"status {manifest.status}, verdict {manifest.verdict}, exit {code}; "
                  f"manifest: {esc(mpath)}")
    return code


def _launch_record(spec: LaunchSpec, cfg: StressConfig) -> dict:
    return {"model": spec.model, "python": spec.python, "tp": spec.tp,
            "engine_args": list(spec.engine_args), "env": redact_env(spec.env),
            "host": spec.host, "profile": cfg.profile}


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


def _golden_model(cfg: StressConfig, model_dir: str | None, mode: str, manifest: Manifest,
                  run_dir: Path):
    """The golden model (:mod:`pleharness.golden`, started lazily) for ``--reference golden`` and
    for classifying divergences, or None (``--no-golden``, or no local model that fits: the
    reason is recorded in ``run_options.golden_classifier``). Raises UsageError when
    ``--reference golden`` cannot have one."""
    from .golden import GoldenModel, golden_problem
    if not cfg.golden:
        manifest.run_options["golden_classifier"] = "off (--no-golden)"
        return None
    problem = golden_problem(model_dir)
    if problem:
        if mode == "golden":
            raise UsageError(f"--reference golden: {problem}")
        manifest.run_options["golden_classifier"] = f"unavailable: {problem}"
        return None
    manifest.run_options["golden_classifier"] = (
        f"transformers float32 on {model_dir} (python {cfg.engine_python}); started on the first "
        "divergence" + (" and for every reference" if mode == "golden" else ""))
    manifest.run_options["golden_log"] = "golden.log"
    return GoldenModel(model_dir, cfg.engine_python, log_path=run_dir / "golden.log")


def _context(cfg, client, manifest, mpath, facts, console, server, progress) -> RunContext:
    from .divergence import near_tie_threshold
    ctx = RunContext(client, manifest, mpath, facts, console, server, progress,
                     check_registry=_checks())
    ctx.on_timeout = cfg.on_timeout
    ctx.logprobs = cfg.logprobs or None
    ctx.near_tie_nats, why = near_tie_threshold(facts.get("dtype"), cfg.near_tie_nats)
    manifest.run_options["near_tie_nats"] = ctx.near_tie_nats
    manifest.run_options["near_tie_source"] = why
    ctx.strict = cfg.strict
    ctx.reference_cache_state = cfg.reference_cache_state
    return ctx


def _run_suite(ctx: RunContext, scenarios: list[Scenario], repeat: int) -> None:
    """Every scenario in order, ``repeat`` times on the same engine (references are taken once)."""
    for rep in range(1, repeat + 1):
        ctx.repeat_index = rep
        ctx.phase_prefix = f"rep{rep}/" if repeat > 1 else ""
        for sc in scenarios:
            ctx.scenario_name = sc.name
            sc.run(ctx)
            ctx.ensure_engine_alive()
    ctx.phase_prefix = ""


def _reference_pass(cfg, manifest, mpath, scenarios, model_path, served_name, base_args,
                    engine_args, engine_env, run_dir, console, servers) -> dict:
    """``--reference engine``: launch the reference configuration (model, tp, environment, the
    harness's defaults and --reference-engine-arg values; not --engine-arg), take every
    scenario's single-request references there, stop it. The boundary lengths come from the
    engine under test's facts (its launch arguments), not the reference engine's."""
    spec = LaunchSpec(model=model_path, python=cfg.engine_python, tp=cfg.tp,
                      engine_args=base_args + list(cfg.reference_engine_args), env=engine_env,
                      host=cfg.host, served_model_name=served_name)
    manifest.engine["reference_engine"] = {"launch": _launch_record(spec, cfg),
                                           "engine_log": "reference-engine.log"}
    srv = _launch(spec, run_dir, "reference-engine", cfg, console, "reference engine")
    servers.append(srv)
    try:
        client = EngineClient(srv.url, served_name, cfg.api_key, cfg.timeouts)
        client.resolve_model()
        card = client.model_card()
        manifest.engine["reference_engine"].update({"command": srv.command,
                                                    "version": client.version(),
                                                    "ready_s": round(srv.ready_s or 0, 3)})
        # the engine under test's launch arguments first (its lengths need references); the
        # reference engine's own resolved values fill what they leave open
        facts = gather_facts(explicit=cfg.explicit_facts, engine_args=engine_args, launched=True,
                             tp=cfg.tp, model_card=card, model_path=model_path, client=client,
                             engine_log=srv.log_path, engine_first=False)
        with _progress(console) as progress:
            ctx = _context(cfg, client, manifest, mpath, facts, console, srv, progress)
            ctx.collect_only = True
            ctx.reference_source = "engine"
            ctx.phase_prefix = "ref-engine/"
            for sc in scenarios:
                ctx.scenario_name = sc.name
                sc.run(ctx)
        return dict(ctx.references)
    finally:
        srv.stop()
        servers.remove(srv)


def _control_pass(cfg, manifest, mpath, scenarios, facts, model_path, served_name, engine_args,
                  engine_env, run_dir, console, servers) -> None:
    """Control run (:mod:`pleharness.attribution`): launch the control configuration (the engine
    under test's arguments without ``--control-drop-arg`` flags plus ``--control-engine-arg``
    values, or ``--control-profile``'s arguments and environment), run the same suite with the
    engine under test's facts (so prompts, phases, order and concurrency are identical), record it
    in ``control-manifest.json``, stop it, and classify every divergence of the engine under test
    as also_in_control / only_under_test. A control engine that fails is recorded
    (``engine.control_engine.error``) and leaves the divergences unattributed: they keep failing
    under the plain policy."""
    from .attribution import attribute, control_args
    from .profile import load_profile
    env = dict(engine_env)
    if cfg.control_profile:
        prof = load_profile(Path(cfg.control_profile))
        args = list(prof.engine_args) + list(cfg.control_engine_args)
        env.update(prof.env)
    else:
        args = control_args(engine_args, cfg.control_drop_args, cfg.control_engine_args)
    spec = LaunchSpec(model=model_path, python=cfg.engine_python, tp=cfg.tp, engine_args=args,
                      env=env, host=cfg.host, served_model_name=served_name)
    rec = manifest.engine["control_engine"] = {
        "launch": _launch_record(spec, cfg), "engine_log": "control-engine.log",
        "manifest": "control-manifest.json", "dropped": list(cfg.control_drop_args),
        "added": list(cfg.control_engine_args), "profile": cfg.control_profile}
    cm = Manifest(run_id=manifest.run_id + "-control", harness=manifest.harness,
                  invocation=manifest.invocation, scenarios=manifest.scenarios,
                  run_options={**manifest.run_options, "role": "control run"})
    cpath = run_dir / "control-manifest.json"
    try:
        srv = _launch(spec, run_dir, "control-engine", cfg, console, "control engine")
    except EngineError as exc:
        rec["error"] = f"{exc.args[0] if exc.args else exc}; root cause: {exc.root_cause}"
        console.print(f"[yellow]warning:[/yellow] control engine failed, divergences stay "
                      f"unattributed: {esc(rec['error'])}")
        return
    servers.append(srv)
    try:
        client = EngineClient(srv.url, served_name, cfg.api_key, cfg.timeouts)
        client.resolve_model()
        rec.update({"command": srv.command, "version": client.version(),
                    "ready_s": round(srv.ready_s or 0, 3)})
        cm.engine = {"mode": "launched", "command": srv.command, "url": srv.url}
        with _progress(console) as progress:
            ctx = _context(cfg, client, cm, cpath, facts, console, srv, progress)
            ctx.phase_prefix = ""
            _run_suite(ctx, scenarios, cfg.repeat)
        cm.status = "complete"
    except EngineError as exc:
        cm.status = "engine_died"
        rec["error"] = f"{exc.args[0] if exc.args else exc}; root cause: {exc.root_cause}"
        console.print(f"[yellow]warning:[/yellow] control engine died: {esc(rec['error'])}")
    finally:
        srv.stop()
        servers.remove(srv)
        cm.ended_at = now_iso()
        write_manifest(cpath, cm)
    counts = attribute(manifest, cm)
    manifest.summary.update(counts)
    rec["attribution"] = counts
    write_manifest(mpath, manifest)


def _write_reports(m: Manifest, run_dir: Path) -> None:
    from .manifest import write_atomic
    from .reports import to_junit, to_markdown
    try:
        write_atomic(run_dir / "summary.md", to_markdown(m))
        write_atomic(run_dir / "junit.xml", to_junit(m))
    except Exception as exc:  # noqa: BLE001 - reports never hide the manifest
        m.summary["report_error"] = str(exc)


def _gpu_memory_after(m: Manifest, before: list[dict], tolerance_mib: float, console,
                      wait_s: float = 30.0) -> None:
    """Record per-GPU memory after shutdown; warn when it has not returned to within
    ``tolerance_mib`` of the pre-launch baseline after ``wait_s`` seconds."""
    import time
    deadline = time.monotonic() + wait_s
    while True:
        after = gpu_inventory() or []
        by_index = {g["index"]: g for g in after}
        leaked = [(b["index"], by_index[b["index"]]["memory_used_mib"] - b["memory_used_mib"])
                  for b in before if b["index"] in by_index and
                  by_index[b["index"]]["memory_used_mib"] - b["memory_used_mib"] > tolerance_mib]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(2)
    m.environment["gpus_after_shutdown"] = after
    m.environment["gpu_memory_released"] = not leaked
    if leaked:
        msg = ", ".join(f"GPU {i}: +{d:.0f} MiB" for i, d in leaked)
        m.environment["gpu_memory_warning"] = f"not back to baseline after {wait_s:.0f} s: {msg}"
        console.print(f"[yellow]warning:[/yellow] GPU memory {m.environment['gpu_memory_warning']}")


def _checks() -> dict:
    from .checks import REGISTRY
    return REGISTRY


def _summarize(m: Manifest) -> None:
    load = [p for p in m.phases if p.role == "load"]
    compared = [r for r in m.requests if r.match is not None]
    m.summary.update({
        "phases_completed": sum(1 for p in load if p.status in ("pass", "fail")),
        "phases_failed": sum(1 for p in load if p.status == "fail"),
        "hashes_compared": len(compared),
        "hashes_matched": sum(1 for r in compared if r.match),
        "near_ties": sum(1 for r in m.requests if r.divergence and not r.divergence["fails"]
                         and r.divergence.get("attribution") != "also_in_control"),
        "also_in_control": sum(1 for r in m.requests if r.divergence
                               and r.divergence.get("attribution") == "also_in_control"),
        "only_under_test": sum(1 for r in m.requests if r.divergence
                               and r.divergence.get("attribution") == "only_under_test"),
        "hard_divergences": sum(1 for r in m.requests if r.divergence and r.divergence["fails"]),
        "request_errors": sum(1 for r in m.requests if r.error and not r.error_expected),
        "checks_failed": sum(1 for r in m.requests for c in r.checks
                             if c.status == "fail" and c.name != "parity"),
        "model_behaviour_notes": sum(1 for r in m.requests for c in r.checks
                                     if c.status == "note"),
    })
    from .reports import throughput_by_concurrency
    m.summary["throughput_by_concurrency"] = throughput_by_concurrency(m)
    m.summary["headline"] = headline(m)


def _verdict(m: Manifest) -> int:
    _summarize(m)
    s = m.summary
    tolerated = sum(1 for r in m.requests if r.match is False and r.error is None and
                    r.divergence and not r.divergence["fails"])
    failed = (s["hashes_matched"] + tolerated < s["hashes_compared"] or s["request_errors"]
              or s["checks_failed"] or any(p.status == "fail" for p in m.phases))
    m.verdict = "fail" if failed else "pass"
    return EXIT_FAIL if failed else EXIT_OK


