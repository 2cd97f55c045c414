"""``ple-harness build-model``: verify (or rebuild) the embedded model."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ..errors import ExitCode, UsageError
from ..model import WEIGHTS_SHA256, ensure_embedded_model, rebuild
from . import Command, app, err_console


@app.command("build-model", cls=Command, epilog="Example: ple-harness build-model --verify")
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
    """Verify the embedded model's pinned digests and print its path (--verify: retrain and compare).

    The path goes to stdout, notes to stderr; with --verify, also whether its recipe reproduces
    the pinned weights on this machine."""
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
        raise typer.Exit(ExitCode.OK if res["same"] else ExitCode.FAIL)
