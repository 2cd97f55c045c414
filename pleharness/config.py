"""One configuration layer: every option of the run commands is checked and resolved here.

The command line (:mod:`pleharness.cli`) only parses: it hands the raw option values of its
option groups (a dict by Python name, plus the names given on the command line) to this module.
Here the cross-option rules are checked once for every command (a launch option with ``--url``,
an attach-only fact without it, an engine argument holding a space, an empty ``--results-dir``,
...), the engine profile is found (a path or a shipped name) and applied under the flags, and the
result is a :class:`StressConfig` whose :meth:`StressConfig.validate` checks what depends on
the resolved values. Every problem is a :class:`~pleharness.errors.UsageError` naming the
option (or the file and key); nothing has been read or started when one is raised.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from .defaults import DEFAULT_CONFIRM_RUNS
from .divergence import normalize_dtype
from .engine.inflight import Timeouts
from .engine.session import Target, resolve_target
from .engine.side_by_side import parse_parallel
from .errors import UsageError
from .profile import EngineProfile, load_profile
from .redact import redact_argv, redact_url
from .tomlfile import find_named

DEFAULT_SCENARIOS = ["transitions", "boundary", "pairs", "insert", "sampled", "stop_strings",
                     "mixed_params", "disconnects", "prefix_isolation", "chat_api",
                     "prompt_logprobs", "constrained"]
REFERENCE_MODES = ("solo", "engine", "manifest", "golden")

# launch-only options (python name, flag)
LAUNCH_ONLY = [("model", "--model"), ("engine_profile", "--engine-profile"), ("tp", "--tp"),
               ("engine_python", "--engine-python"), ("engine_arg", "--engine-arg"),
               ("engine_env", "--engine-env"), ("host", "--host"), ("port", "--port"),
               ("start_timeout", "--start-timeout"),
               ("reference_engine_arg", "--reference-engine-arg"),
               ("reference_drop_arg", "--reference-drop-arg"),
               ("control_engine_arg", "--control-engine-arg"),
               ("control_drop_arg", "--control-drop-arg"), ("control_profile", "--control-profile")]
# attach-only fact options: (python name, flag, how a launched engine gets that value,
# the StressConfig.explicit_facts key)
ATTACH_FACTS = [
    ("block_size", "--block-size", "--engine-arg --block-size=N", "block_size"),
    ("chunk_size", "--chunk-size", "--engine-arg --max-num-batched-tokens=N",
     "max_num_batched_tokens"),
    ("num_speculative_tokens", "--num-speculative-tokens",
     "--engine-arg '--speculative-config={...\"num_speculative_tokens\": N}'",
     "num_speculative_tokens"),
    ("max_num_seqs", "--max-num-seqs", "--engine-arg --max-num-seqs=N", "max_num_seqs"),
    ("max_model_len", "--max-model-len", "--engine-arg --max-model-len=N", "max_model_len"),
    ("vocab_size", "--vocab-size", "the model's config.json", "vocab_size"),
    ("dtype", "--dtype", "--engine-arg --dtype=D, else the model's config.json", "dtype")]
ENGINE_ARG_OPTIONS = (("engine_arg", "--engine-arg"),
                      ("reference_engine_arg", "--reference-engine-arg"),
                      ("control_engine_arg", "--control-engine-arg"))


def raise_all(problems: list[str]) -> None:
    """Raise one UsageError listing every problem (none: return)."""
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} problems with the options:\n"
                         + "\n".join(f"  - {x}" for x in problems))


def parse_ladder(text: str) -> list[int]:
    """'4,3,2,1' (also 'C4>C3') -> [4, 3, 2, 1]; each level 1..1024, else a usage error naming
    the flag."""
    items = text.replace(">", ",").replace("C", "").split(",")
    if text.strip() and any(not x.strip() for x in items):
        raise UsageError(f"--ladder {text!r}: an empty level between commas; expected "
                         "comma-separated concurrency levels, e.g. 4,3,2,1")
    try:
        levels = [int(x) for x in items if x.strip()]
    except ValueError:
        raise UsageError(f"--ladder {text!r}: expected comma-separated concurrency levels, "
                         "e.g. 4,3,2,1") from None
    if not levels:
        raise UsageError(f"--ladder {text!r}: expected at least one concurrency level, e.g. 4,3,2,1")
    bad = [x for x in levels if not 1 <= x <= 1024]
    if bad:
        raise UsageError(f"--ladder {text!r}: concurrency levels must be between 1 and 1024 "
                         f"(got {', '.join(map(str, bad))})")
    return levels


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """['NAME=VALUE', ...] -> {NAME: VALUE}; raises UsageError naming --engine-env."""
    out = {}
    for it in items:
        if "=" not in it or not it.split("=", 1)[0]:
            raise UsageError(f"--engine-env {it!r}: expected NAME=VALUE")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def engine_arg_problems(args: Iterable[str], where: str) -> list[str]:
    """Engine arguments are separate argv items: '--max-num-seqs 8' as one item never reaches
    vLLM as intended. A flag item whose name part (before '=') holds whitespace is refused."""
    out = []
    for a in args:
        name = a.split("=", 1)[0]
        if a.startswith("-") and any(ch.isspace() for ch in name):
            flag, _, value = a.strip().partition(" ")
            out.append(f"{where} {a!r}: one argument holding a space; use the = form: "
                       f"{where} {flag}={value.strip()}")
    return out


def check_url(url: str) -> str | None:
    """A usage-error line for a malformed --url (its password redacted), or None."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.hostname
    except ValueError as exc:
        return f"--url {shown!r}: not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (f"--url {shown!r}: expected an http:// or https:// URL with a host, e.g. "
                "http://127.0.0.1:8000")
    try:
        parts.port
    except ValueError:
        return f"--url {shown!r}: the port is not a number between 0 and 65535"
    if parts.query or parts.fragment:
        return (f"--url {shown!r}: the server's base URL has no query or fragment (the harness "
                "appends /health, /v1/...; a key goes in --api-key-env)")
    return None


def find_profile(name_or_path: Path | str) -> Path:
    """A profile path, or a shipped profile's name (``cpu-ngram`` -> profiles/cpu-ngram.toml), as
    --suite finds suites by name. Raises UsageError when neither exists."""
    here = Path(__file__).resolve().parent
    dirs = [d for d in (here / "profiles_data", here.parent / "profiles") if d.is_dir()]
    return find_named(str(name_or_path), dirs, "engine profile")


def program() -> list[str]:
    """How this harness was started, so that a recorded invocation runs as printed: the console
    script as it was called (e.g. .venv/bin/ple-harness), else ``PYTHON -m pleharness``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "ple-harness":
        return [argv0]
    return [sys.executable, "-m", "pleharness"]


def option_problems(o: Mapping[str, Any], given: Iterable[str]) -> list[str]:
    """Every conflicting, ignored or malformed option of a run command, found before anything is
    read or started (one usage error lists them all). ``o``: the command's option values by
    Python name (options a command lacks are simply absent); ``given``: the names given on the
    command line or through the environment."""
    given = set(given)
    out: list[str] = []
    url = o.get("url")
    if url is not None:
        problem = check_url(url)
        if problem:
            out.append(problem)
        launch = [flag for name, flag in LAUNCH_ONLY if name in given]
        if launch:
            out.append(f"{', '.join(launch)}: launch option(s), but --url attaches to a running "
                       "engine that the harness does not start (drop them, or drop --url)")
        if o.get("reference") == "engine":
            out.append("--reference engine needs a launched engine (not --url): the reference "
                       "engine is a second launch")
    else:
        for name, flag, how, _ in ATTACH_FACTS:
            if name in given:
                out.append(f"{flag} is for attaching with --url only: it would override the "
                           f"launched engine's real value; a launched engine takes it from "
                           f"{how}")
        for name, flag in (("reference_engine_arg", "--reference-engine-arg"),
                           ("reference_drop_arg", "--reference-drop-arg")):
            if name in given and o.get("reference") != "engine":
                out.append(f"{flag} is ignored without --reference engine")
    results_dir = o.get("results_dir")
    if results_dir is not None and str(results_dir).strip() == "":
        out.append("--results-dir '': expected a folder path (e.g. results)")
    if o.get("suite") is not None and o.get("scenario"):
        out.append("--suite and --scenario cannot be combined (a suite names its scenarios)")
    if o.get("repeat_old") is not None and "suite_repeats" in given:
        out.append("--repeat (deprecated) and --suite-repeats given together: use --suite-repeats")
    for name, flag in ENGINE_ARG_OPTIONS:
        out += engine_arg_problems(list(o.get(name) or []), flag)
    for name, flag in (*ENGINE_ARG_OPTIONS, ("control_drop_arg", "--control-drop-arg"),
                       ("reference_drop_arg", "--reference-drop-arg")):
        items = [a for a in (o.get(name) or []) if str(a).startswith("-")]
        twice = sorted({a for a in items if items.count(a) > 1})
        if twice:
            out.append(f"{flag} {', '.join(twice)}: given more than once (once is enough; a "
                       "repeated engine flag is a typo more often than an intent)")
    return out


def engine_fields(o: Mapping[str, Any], given: Iterable[str]) -> dict[str, Any]:
    """The :class:`StressConfig` fields of the engine, attach, verdict and output options
    (``o``: option values by Python name, as :func:`option_problems` takes them), the engine
    profile (a path or a shipped name) applied under the flags. Raises UsageError naming the
    option (all conflicting options at once, then a bad profile, --dtype or --api-key-env)."""
    raise_all(option_problems(o, given))
    profile_path = find_profile(o["engine_profile"]) if o.get("engine_profile") else None
    prof = load_profile(profile_path) if profile_path else EngineProfile()
    raise_all(engine_arg_problems(prof.engine_args, f"{profile_path}: engine_args item"))
    if o.get("dtype") is not None:
        if normalize_dtype(o["dtype"]) is None:
            raise UsageError(f"--dtype {o['dtype']!r}: expected bfloat16, float16 or float32")
    api_key = None
    if o.get("api_key_env"):
        api_key = os.environ.get(o["api_key_env"])
        if not api_key:
            raise UsageError(f"--api-key-env {o['api_key_env']}: that environment variable is "
                             + ("empty" if o["api_key_env"] in os.environ else "not set"))
    return dict(
        model=o.get("model") or prof.model, url=o.get("url"), tp=o.get("tp") or prof.tp or 1,
        engine_python=o.get("engine_python") or prof.python or sys.executable,
        engine_args=prof.engine_args + list(o.get("engine_arg") or []),
        engine_env={**prof.env, **parse_env(o.get("engine_env") or [])},
        host=o.get("host") or prof.host or "127.0.0.1", port=o.get("port"),
        start_timeout_s=o.get("start_timeout", 900.0),
        served_model_name=o.get("served_model_name") or prof.served_model_name,
        explicit_facts={fact: o[name] for name, _, _, fact in ATTACH_FACTS
                        if o.get(name) is not None},
        profile=str(profile_path) if profile_path else None, api_key=api_key,
        near_tie_nats=o.get("near_tie_nats"), strict=o.get("strict", False),
        golden=o.get("golden", True), engine_probe=o.get("engine_probe", True),
        results_dir=Path(o.get("results_dir", "results")), run_id=o.get("run_id"),
        invocation=redact_argv(program() + sys.argv[1:]))


def check_control_profile(name_or_path: Path | str, warn: Callable[[str], None]) -> Path:
    """Find and validate a --control-profile before anything starts (the control engine is
    launched only after the whole run under test); ``warn`` about the keys a control run
    ignores. Returns its path; raises UsageError naming the file and key."""
    path = find_profile(name_or_path)
    prof = load_profile(path)
    raise_all(engine_arg_problems(prof.engine_args, f"{path}: engine_args item"))
    ignored = [k for k in ("model", "python", "tp", "served_model_name", "host")
               if getattr(prof, k) is not None]
    if ignored:
        warn(f"--control-profile {path}: {', '.join(ignored)} ignored: the control engine "
             "serves the engine under test's model with its python, tp and host; only the "
             "profile's engine_args and [env] apply")
    return path


def check_plot_path(plot: str) -> Path:
    """``report --plot``: a PNG file path in an existing folder; raises UsageError."""
    p = Path(plot)
    if not plot.strip() or p.name in ("", ".", "..") or p.is_dir():
        raise UsageError(f"--plot {plot!r}: expected a PNG file path, e.g. --plot run.png")
    if not p.parent.is_dir():
        raise UsageError(f"--plot {plot!r}: folder {p.parent} does not exist")
    return p


def check_json_path(path: Path, flag: str = "--json") -> None:
    """A file path that can be written: not a folder, its folder not a file. Checked before the
    job runs (usage error, exit 2)."""
    if str(path) in ("", ".") or path.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: is a folder; expected a file path, e.g. "
                         f"{flag} probe.json")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {str(path)!r}: {parent} is not a folder")
            break


def check_db_folder(db: str | None) -> None:
    """``fuzz --db``: a folder path (created when missing) where this user can write: checked
    now, before an engine starts (a path under a regular file, under /proc or in a read-only
    place would only fail once the search began); raises UsageError."""
    if db is None:
        return
    if not db.strip() or (Path(db).exists() and not Path(db).is_dir()):
        raise UsageError(f"--db {db!r}: expected a folder path (created when missing)")
    p = Path(db).resolve()
    first = next((q for q in [p, *p.parents] if q.exists()), None)
    if first is None or not first.is_dir():
        raise UsageError(f"--db {db!r}: {first} is not a folder, so the database folder "
                         "cannot be created under it")
    if str(p).startswith(("/proc/", "/sys/")) or not os.access(first, os.W_OK | os.X_OK):
        raise UsageError(f"--db {db!r}: {first} is not writable, so the database folder "
                         "cannot be created there")



def stress_config(o: Mapping[str, Any], given: Iterable[str],
                  warn: Callable[[str], None]) -> "StressConfig":
    """The :class:`StressConfig` of ``ple-harness stress`` from its option values by Python name
    (``o``) and the names given on the command line: :func:`engine_fields`, then the suite (its
    scenarios and repeat, unless --scenario / --suite-repeats), the scenario overrides, the
    control profile (found and checked now), the reference and the timeouts. Raises
    UsageError naming the option."""
    given = frozenset(given)
    fields = engine_fields(o, given)
    from .suites import load_suite  # lazy: start-up (suites pulls compare into ple-harness --help)
    suite = load_suite(o["suite"]) if o.get("suite") is not None else None
    overrides = {k: v for k, v in (("ladder", None if o["ladder"] is None
                                    else parse_ladder(o["ladder"])),
                                   ("repeats", o["repeats"]), ("max_tokens", o["max_tokens"]))
                 if v is not None}
    control_profile = (check_control_profile(o["control_profile"], warn)
                       if o.get("control_profile") else None)
    explicit_repeats = "suite_repeats" in given or o["repeat_old"] is not None
    return StressConfig(
        **fields, overrides=overrides,
        scenarios=suite.scenario_refs() if suite else list(o["scenario"] or DEFAULT_SCENARIOS),
        repeat=(o["repeat_old"] or o["suite_repeats"]) if explicit_repeats or not suite
        else suite.repeat,
        on_timeout=_value(o["on_timeout"]), reference=o["reference"],
        reference_engine_args=list(o["reference_engine_arg"] or []),
        reference_drop_args=list(o["reference_drop_arg"] or []), logprobs=o["logprobs"],
        golden_model=o["golden_model"], control_engine_args=list(o["control_engine_arg"] or []),
        control_drop_args=list(o["control_drop_arg"] or []),
        control_profile=str(control_profile) if control_profile else None,
        reference_cache_state=_value(o["reference_cache_state"]),
        confirm_runs=o["confirm_runs"], confirm_runs_given="confirm_runs" in given,
        api=_value(o.get("api", "both")),
        parallel_engines=parse_parallel(o.get("parallel_engines", 1)),
        timeouts=Timeouts(o["connect_timeout"], o["first_token_timeout"],
                          o["between_tokens_timeout"], o["request_timeout"]))


def _value(choice: Any) -> Any:
    """An Enum choice's value (the CLI's choices are str Enums), else the value itself."""
    return getattr(choice, "value", choice)


@dataclass
class StressConfig:
    """Resolved options of one ``ple-harness stress`` run (see ``ple-harness stress --help``).

    :meth:`validate` checks the options that depend on each other; :func:`run_stress` calls it
    before anything is read or started.
    """

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
    reference_engine_args: list[str] = field(default_factory=list)  # appended to the engine's
    reference_drop_args: list[str] = field(default_factory=list)  # flags removed from them
    repeat: int = 1
    logprobs: int = 2
    near_tie_nats: float | None = None  # None: derived from the serving dtype (divergence.py)
    golden: bool = True  # classify divergences with the golden model when one can be built
    golden_model: str | None = None  # model folder for the golden model (default: the served one)
    control_engine_args: list[str] = field(default_factory=list)  # appended to the engine's args
    engine_probe: bool = True  # measure the engine first (pleharness.engine_probe)
    control_drop_args: list[str] = field(default_factory=list)  # flags removed from them
    control_profile: str | None = None  # or: the control's own engine profile (args and env)
    strict: bool = False
    reference_cache_state: str = "warm"
    confirm_runs: int = DEFAULT_CONFIRM_RUNS  # replays of each reproducer the run writes (pleharness.reproduce)
    confirm_runs_given: bool = False  # --confirm-runs was on the command line
    parallel_engines: int | None = 1  # confirmation engines side by side (None: auto)
    # --api: endpoint of load requests whose prompt has a message form (pleharness.run.api);
    # `stress` defaults to both, other commands that build a StressConfig keep completions
    api: str = "completions"

    @property
    def reference_mode(self) -> str:
        """solo | engine | manifest | golden (``--reference manifest:PATH`` gives manifest)."""
        return self.reference.split(":", 1)[0]

    @property
    def control(self) -> bool:
        """Whether a control run is asked for (any --control-* option)."""
        return bool(self.control_engine_args or self.control_drop_args or self.control_profile)

    def validate(self) -> None:
        """Raise UsageError (naming the option) for a malformed value or a combination that
        cannot run; nothing has been read or started yet."""
        mode = self.reference_mode
        for bad, msg in (
            (self.on_timeout not in ("continue", "abort"),
             f"--on-timeout {self.on_timeout!r}: expected continue or abort"),
            (self.repeat < 1, "--suite-repeats must be >= 1"),
            (self.confirm_runs < 0, f"--confirm-runs {self.confirm_runs}: expected 0 (skip) or "
                                    "more replays"),
            (self.api not in ("completions", "chat", "both"),
             f"--api {self.api!r}: expected completions, chat or both"),
            (self.reference_cache_state not in ("cold", "warm"),
             f"--reference-cache-state {self.reference_cache_state!r}: expected cold or warm"),
            (mode not in REFERENCE_MODES,
             f"--reference {self.reference!r}: expected solo, engine, golden or manifest:PATH"),
            (mode == "golden" and not self.golden,
             "--reference golden needs the golden model (drop --no-golden)"),
            (mode == "engine" and self.url is not None,
             "--reference engine needs a launched engine (not --url)"),
            (self.control and self.url is not None,
             "--control-engine-arg / --control-drop-arg / --control-profile need a launched "
             "engine (not --url): the harness launches the control"),
            (self.golden_model is not None and not Path(self.golden_model).is_dir(),
             f"--golden-model {self.golden_model}: not a model folder (checked before the "
             "engine, so that a typo does not cost an engine start)"),
        ):
            if bad:
                raise UsageError(msg)

    def target(self, console: Console) -> Target:
        """Resolve the engine target (:func:`pleharness.engine.session.resolve_target`); raises
        UsageError when the model, the engine's Python or the URL is not usable."""
        return resolve_target(url=self.url, model=self.model, python=self.engine_python,
                              tp=self.tp, engine_args=self.engine_args,
                              engine_env=self.engine_env, served_name=self.served_model_name,
                              host=self.host, port=self.port, api_key=self.api_key,
                              start_timeout_s=self.start_timeout_s, log=console.print)
