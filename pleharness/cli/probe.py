"""``ple-harness probe``: the GPU pre-flight probe (:mod:`pleharness.probe`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from .. import files
from ..errors import ExitCode, UsageError
from ..files import private_dir, write_private
from ..probe import run_probe
from ..render.probe import render
from . import Command, app, console, err_console


def write_json_result(path: Path, result: dict, flag: str = "--json") -> None:
    """Write the probe result; an OS error is a usage error naming the flag (exit 2)."""
    try:
        private_dir(path.parent)
        write_private(path, json.dumps(result, indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"{flag} {str(path)!r}: cannot write: {exc.strerror or exc}") from None


@app.command(cls=Command, epilog=(
    "Example: ple-harness probe --json probe.json\n\n"
    "It needs PyTorch with CUDA: where the harness's environment has none, run "
    "PYTHONPATH=CHECKOUT /opt/vllm/bin/python -m pleharness.probe (docs/gpu-quickstart.md)."))
def probe(
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the result as JSON "
                                                      "to this path.")] = None,
    quick: Annotated[bool, typer.Option(help="Capability and a 100-replay self-test; no "
                                        "timings.")] = False,
    replays: Annotated[int, typer.Option(min=1, help="Self-test replays per row size.")] = 1000,
):
    """GPU pre-flight: can this GPU defer PLE rows inside CUDA graphs (stream memops)?

    Exit 0 when the probe answered (ok, fallback: synchronous, or unavailable: no GPU / no CUDA),
    1 when the self-test failed, 2 for a --json path that cannot be written.
    """
    if json_path is not None:
        files.check_json_path(json_path)
    result = run_probe(selftest=True, timings=not quick, replays=100 if quick else replays)
    render(result, console)
    if result.get("status") == "unavailable" and "PyTorch" in str(result.get("reason")):
        here = Path(__file__).resolve().parent.parent.parent
        err_console.print(
            f"note: the probe runs in this Python ({escape(sys.executable)}), which has no "
            "usable PyTorch (a pip install of ple-harness needs none). Run it with the engine's "
            f"Python, where PyTorch and CUDA are: PYTHONPATH={escape(str(here))} "
            "ENGINE_PYTHON -m pleharness.probe")
    if json_path:
        write_json_result(json_path, result)
    raise typer.Exit(ExitCode.FAIL if result.get("status") == "failed" else ExitCode.OK)
