"""Command-line interface (typer). Thin: each command module only parses its options (declared
once, in groups: :mod:`.options`) and calls its job; the options are checked and resolved in
:mod:`pleharness.config`.

Exit codes (:class:`pleharness.errors.ExitCode`): 0 pass; 1 parity/check failure (or a failed
gate); 2 usage error (nothing started); 3 engine failed to start or died; 4 internal harness error
(a bug: one line on stderr, the traceback in a log file); 130 / 143 interrupted (SIGINT /
SIGTERM). :func:`run` maps every exception that leaves a command to its code, in one place.

Streams: machine-readable output (``report --format markdown/junit``, ``build-model``'s path) and
the human reports (tables, verdicts) go to stdout; errors, warnings and notes go to stderr.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback
import typing
from typing import Annotated

import typer
import typer.core
import typer.rich_utils as rich_utils
from rich.console import Console
from rich.markup import escape

from .. import version_line
from ..option_rules import raise_all
from ..errors import ExitCode, HarnessError, write_crash_log
from ..redact import REDACTED, SECRET_NAME, redact_argv

# options whose empty value has its own, more specific usage error
EMPTY_CHECKED_ELSEWHERE = {"--url", "--results-dir", "--run-id", "--ladder", "--plot", "--suite"}


def _takes_float(prm) -> bool:
    """Whether an option's value is a float (typer's type descriptor, or click's type name)."""
    ann = getattr(getattr(prm, "type_descriptor", None), "annotation", None)
    if ann is not None:
        return ann is float or float in typing.get_args(ann)
    return getattr(getattr(prm, "type", None), "name", "") in ("float", "float range")


def empty_option_values(command, args: list[str]) -> list[str]:
    """The options of ``command`` (a click command) given an empty or blank value in ``args``
    (``--model ''``, ``--model=``): an unset variable in a CI job (``--model "$MODEL_DIR"``) must
    not turn into a default (issue 25). Returns one problem line per option; flags that take no
    value, and the options of :data:`EMPTY_CHECKED_ELSEWHERE`, are not looked at. A number
    option given ``nan`` or ``inf`` is refused too (issue 36): no count, time or threshold of the
    harness is infinite, and click would report a range instead of the real problem."""
    takes_value = {}
    floats = set()
    for prm in command.params:
        if getattr(prm, "param_type_name", "") == "option" and not prm.is_flag and not prm.count:
            for name in prm.opts + prm.secondary_opts:
                takes_value[name] = prm.opts[0] if prm.opts else name
            if _takes_float(prm):
                floats.update(prm.opts + prm.secondary_opts)
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
            elif value is not None and flag in floats and value.strip().lower().lstrip("+-") in (
                    "nan", "inf", "infinity"):
                out.append(f"{main} {value!r}: not a finite number")
        i += 1
    return list(dict.fromkeys(out))


class Command(typer.core.TyperCommand):
    """Every command refuses empty option values before anything else (:func:`empty_option_values`)."""

    def parse_args(self, ctx, args):
        problems = empty_option_values(self, list(args))
        if problems:
            raise_all(problems)
        return super().parse_args(ctx, args)


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Validate a patched vLLM engine: launch it (or attach), run scenarios, "
                       "compare every output's token IDs with the same request alone, and write "
                       "a run folder with summary.md and a verdict.\n\n"
                       "Start with: ple-harness stress (the embedded model on the CPU engine), or "
                       "on a GPU: ple-harness stress --engine-profile gpu-dense-bf16.example "
                       "--model /models/dense --engine-python /opt/vllm/bin/python",
                  epilog="Exit codes: 0 pass, 1 parity/check/gate failure, 2 usage error "
                         "(nothing started), 3 engine failed to start or died, 4 internal error, "
                         "130/143 interrupted. ple-harness JOB --help: a job's options, the most "
                         "used first, and an example. Docs: README.md, docs/.")
def _quiet_broken_pipe(self=None) -> None:
    """A closed pipe (``ple-harness ... | head``) ends the program quietly with the shell's
    SIGPIPE convention, 141 (128 + 13), instead of rich's exit 1 (the harness's check-failure
    code); installed on every rich console by :func:`run` (typer's help console included)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # nothing more is flushed into the closed pipe
    raise SystemExit(141)


console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def _version(value: bool):
    if value:
        print(version_line())
        raise typer.Exit(ExitCode.OK)


@app.callback()
def main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print the version and the git commit it was built from, and exit.")] = False):
    """Validation and stress-test harness for patched vLLM engines."""


def warn(text: str) -> None:
    """A warning line on stderr."""
    err_console.print(f"[yellow]warning:[/yellow] {escape(text)}")


def _exit_now_if_requests_hang(code: int) -> None:
    """After an interrupted run, request threads may still wait for an engine that never answers
    (a request cut off before its response headers cannot be woken). Everything is recorded and
    the engine is stopped by then, so exit without joining them (the interpreter would)."""
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
            value = REDACTED if SECRET_NAME.search(argv[i + 1]) else argv[i + 2]
            return (f"hint: engine arguments take the = form: {a} {argv[i + 1]}={value} "
                    f"(or {a} {argv[i + 1]} {a} {value})")
    return None


def redacted_message(text: str, argv: list[str]) -> str:
    """``text`` (a usage error that may quote the command line) with every secret of ``argv``
    redacted as :func:`pleharness.redact.redact_argv` redacts it, also a value click reports as
    an unexpected extra argument (``--engine-arg=--api-key sk-...``)."""
    red = redact_argv(argv)
    for i, (orig, shown) in enumerate(zip(argv, red)):
        if orig != shown:
            text = text.replace(orig, shown)
            if "=" in orig:
                text = text.replace(orig.split("=", 1)[1], REDACTED)
        if i + 1 < len(argv) and SECRET_NAME.search(orig.rsplit("=", 1)[-1]) and \
                orig.rsplit("=", 1)[-1].startswith("-") and "--api-key-env" not in orig:
            text = text.replace(argv[i + 1], REDACTED)  # click's "extra argument" after it
    return text


def _wide_help_when_piped() -> None:
    """``--help`` piped (no terminal, no COLUMNS / TERMINAL_WIDTH set): 120 columns instead of
    rich's 80, at which option names such as ``--reference-engine-arg`` were cut to
    ``--reference-engi…`` (typer's ``rich_utils.MAX_WIDTH`` is its own TERMINAL_WIDTH knob)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"):
        return
    rich_utils.MAX_WIDTH = rich_utils.MAX_WIDTH or 120


def run() -> None:
    """Console entry point, the one exception -> :class:`ExitCode` mapper: a harness error is one
    clear line on stderr with its code; click's usage errors exit 2 (with a hint for engine
    arguments); Ctrl-C before a job owns it 130; an unexpected exception is an internal error
    (exit 4) with its traceback in a log file."""
    _wide_help_when_piped()
    Console.on_broken_pipe = _quiet_broken_pipe  # every console of this process
    try:
        rc = app(standalone_mode=False)
        _exit_now_if_requests_hang(rc if isinstance(rc, int) else ExitCode.OK)
        sys.exit(rc if isinstance(rc, int) else ExitCode.OK)
    except HarnessError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit as exc:
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            sys.exit(141)  # click's own closed-pipe path (EPIPE -> exit 1): the same 141
        raise
    except BrokenPipeError:  # `ple-harness ... | head`: the reader left
        _quiet_broken_pipe()
    except Exception as exc:  # click's usage errors (typer may bundle its own copy of click)
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            if isinstance(getattr(exc, "message", None), str):
                exc.message = redacted_message(exc.message, sys.argv[1:])
            exc.show()
            hint = _usage_hint(exc, sys.argv[1:])
            if hint:
                err_console.print(escape(hint))
            sys.exit(ExitCode.USAGE if exc.exit_code in (1, 2) else exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(ExitCode.SIGINT)
        path = write_crash_log(traceback.format_exc())
        err_console.print(f"[red]internal error:[/red] {escape(type(exc).__name__)}: "
                          f"{escape(str(exc))[:300]} (a ple-harness bug; traceback in "
                          f"{escape(path)})")
        sys.exit(ExitCode.INTERNAL)


# the commands, in the order `ple-harness --help` lists them (each module registers its own):
# the README's table of jobs
from . import (stress, fuzz, confirm, explain, selftest, compare, report, facts,  # noqa: E402,F401,I001
               scenarios, probe, build_model)
