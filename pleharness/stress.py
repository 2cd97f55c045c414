"""The ``stress`` job: launch or attach, run the selected scenarios, write the manifest, verdict."""
from __future__ import annotations


import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .engine.client import EngineClient, Timeouts
from .engine.errors import EngineError, HarnessError, UsageError
from .engine.facts import gather_facts
from .engine.launch import EngineServer, LaunchSpec, engine_python_check, redact_env
from .manifest import Manifest, now_iso, write_manifest
from .report import headline, render
from .runner import (EXIT_ENGINE, EXIT_FAIL, EXIT_OK, RequestTimeoutAbort, RunContext,
                     environment_info, gpu_inventory, harness_info, new_run_dir)
from .scenarios import Scenario, load_scenario_file

DEFAULT_SCENARIOS = ["transitions", "boundary", "pairs", "insert"]
# Engine arguments added when the embedded model is launched: block size 32 is valid on the CPU
# attention backend (which refuses 16) and on GPUs.
# The chunked-prefill budget is set so that the boundary lengths n*C + q are known and short.
EMBEDDED_ENGINE_ARGS = ["--block-size", "32", "--max-num-batched-tokens", "256"]
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


def load_scenarios(names: list[str], overrides: dict[str, Any]) -> list[Scenario]:
    """Load scenario files; each override applies to the scenarios whose parameters have that key."""
    out = []
    for n in names:
        sc = load_scenario_file(n)
        mine = {k: v for k, v in overrides.items() if k in type(sc.params).model_fields}
        if mine:
            sc = load_scenario_file(n, mine)
        out.append(sc)
    unused = set(overrides) - {k for sc in out for k in type(sc.params).model_fields}
    if unused:
        raise UsageError(f"option(s) {', '.join(sorted(unused))} apply to none of the selected "
                         f"scenarios ({', '.join(names)})")
    return out


class _Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def run_stress(cfg: StressConfig, console: Console | None = None) -> int:
    """Run the job; returns the exit code (see :mod:`pleharness.runner`). Never leaves an engine."""
    console = console or Console(stderr=False)
    scenarios = load_scenarios(cfg.scenarios, cfg.overrides)  # bad input: before anything starts
    served_name = cfg.served_model_name
    model_path = cfg.model
    engine_args = list(cfg.engine_args)
    engine_env = dict(cfg.engine_env)
    if cfg.url is None:
        problem = engine_python_check(cfg.engine_python)
        if problem:
            raise UsageError(problem)
        if model_path is None:
            from .model import SERVED_NAME, ensure_embedded_model
            model_path = str(ensure_embedded_model(cfg.engine_python, log=console.print))
            served_name = served_name or SERVED_NAME
            engine_args = EMBEDDED_ENGINE_ARGS + engine_args
            engine_env = {**EMBEDDED_ENV, **engine_env}
        elif not Path(model_path).exists():
            raise UsageError(f"model path {model_path} does not exist")
    elif not EngineClient(cfg.url, api_key=cfg.api_key).health(timeout=10):
        raise UsageError(f"no engine answers GET {cfg.url.rstrip('/')}/health with 200 "
                         "(is the server running and the URL right?)")
    if cfg.on_timeout not in ("continue", "abort"):
        raise UsageError(f"--on-timeout {cfg.on_timeout!r}: expected continue or abort")
    run_id, run_dir = new_run_dir(Path(cfg.results_dir), cfg.run_id)
    mpath = run_dir / "manifest.json"
    manifest = Manifest(run_id=run_id, harness=harness_info(), invocation=cfg.invocation,
                        scenarios=[s.definition() for s in scenarios])
    manifest.environment = environment_info(cfg.engine_python if cfg.url is None else None)
    if manifest.environment.get("gpus"):
        from .probe import capability_summary  # cheap: capability only, never raises
        manifest.environment["ple_probe"] = capability_summary()
    manifest.summary = {"phases_planned": sum(getattr(s, "planned_phases", lambda: 0)()
                                              for s in scenarios),
                        "phases_completed": 0, "hashes_compared": 0, "hashes_matched": 0}
    write_manifest(mpath, manifest)
    console.print(f"run {run_id}: results in {run_dir}")

    server: EngineServer | None = None
    ready = False
    old_handlers = {}
    signalled = []

    def on_signal(signum, _frame):
        if signalled:  # a second Ctrl-C / SIGTERM: skip the grace period
            if server is not None and server.proc is not None:
                from .engine.launch import _signal_group
                _signal_group(server.proc.pid, signal.SIGKILL)
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
    try:
        if cfg.url is None:
            spec = LaunchSpec(model=model_path, python=cfg.engine_python, tp=cfg.tp,
                              engine_args=engine_args, env=engine_env, host=cfg.host,
                              port=cfg.port, served_model_name=served_name)
            server = EngineServer(spec, run_dir, cfg.start_timeout_s, api_key=cfg.api_key)
            manifest.engine = {"mode": "launched", "launch": {
                "model": model_path, "python": cfg.engine_python, "tp": cfg.tp,
                "engine_args": engine_args, "env": redact_env(engine_env),
                "host": cfg.host, "profile": cfg.profile}, "engine_log": "engine.log", "launcher_log": "launcher.log"}
            with console.status("starting the engine (see engine.log) ..."):
                server.start()
            manifest.engine["command"] = server.command
            manifest.engine["ready_s"] = round(server.ready_s or 0, 3)
            url = server.url
            console.print(f"engine ready after {server.ready_s:.0f} s at {url}")
        else:
            url = cfg.url
            manifest.engine = {"mode": "attached", "url": url}
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
                             model_path=local_model)
        manifest.facts = facts.to_dict()
        for sc in scenarios:
            sc.validate_against(facts.values)
        write_manifest(mpath, manifest)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            ctx = RunContext(client, manifest, mpath, facts, console, server, progress,
                             check_registry=_checks())
            ctx.on_timeout = cfg.on_timeout
            for sc in scenarios:
                ctx.scenario_name = sc.name
                sc.run(ctx)
                ctx.ensure_engine_alive()
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
        console.print(f"[red]aborted:[/red] {exc}")
    except KeyboardInterrupt:
        manifest.status, manifest.verdict, manifest.reason = "interrupted", "error", "SIGINT"
        code = 130
    except EngineError as exc:
        manifest.status = "engine_died" if ready else "failed"
        manifest.verdict = "error"
        manifest.reason = str(exc.args[0]) if exc.args else str(exc)
        manifest.root_cause = exc.root_cause or (server.root_cause() if server else None)
        manifest.log_tail = server.log_tail(20) if server else []
        code = EXIT_ENGINE
        console.print(f"[red]engine error:[/red] {manifest.reason}")
        if manifest.root_cause:
            console.print(f"root cause: {manifest.root_cause}")
        if server:
            console.print(f"engine log: {server.log_path}")
    except HarnessError as exc:
        manifest.status, manifest.verdict, manifest.reason = "failed", "error", str(exc)
        code = exc.exit_code
        console.print(f"[red]error:[/red] {exc}")
    except Exception as exc:  # noqa: BLE001 - a harness bug still leaves an honest manifest
        manifest.status, manifest.verdict = "failed", "error"
        manifest.reason = f"harness error: {exc.__class__.__name__}: {exc}"
        console.print(traceback.format_exc())
        code = EXIT_FAIL
    finally:
        try:
            if server is not None:
                with console.status("stopping the engine ..."):
                    server.stop(grace_s=0 if len(signalled) > 1 else None)
                if gpus_before:
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
    render(manifest, console)
    console.print(f"status {manifest.status}, verdict {manifest.verdict}, exit {code}; "
                  f"manifest: {mpath}")
    return code


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
        "request_errors": sum(1 for r in m.requests if r.error and not r.error_expected),
        "checks_failed": sum(1 for r in m.requests for c in r.checks if c.status == "fail"),
    })
    m.summary["headline"] = headline(m)


def _verdict(m: Manifest) -> int:
    _summarize(m)
    s = m.summary
    failed = (s["hashes_matched"] < s["hashes_compared"] or s["request_errors"] or
              s["checks_failed"] or any(p.status == "fail" for p in m.phases))
    m.verdict = "fail" if failed else "pass"
    return EXIT_FAIL if failed else EXIT_OK


