"""The run folder: one fresh folder per run, never reused."""
from __future__ import annotations

import secrets
from datetime import datetime
from pathlib import Path

from ..errors import UsageError
from ..files import private_dir


def new_run_dir(results_dir: Path, run_id: str | None = None) -> tuple[str, Path]:
    """Create a fresh run folder ``results_dir/<run-id>``; never reuses an existing one.

    Raises UsageError when the folder cannot be created or ``run_id`` exists already.
    """
    if run_id is not None and (not run_id or "/" in run_id or run_id in (".", "..")
                               or "\\" in run_id or run_id.startswith(".")
                               or any(not c.isprintable() for c in run_id)):
        raise UsageError(f"--run-id {run_id!r}: a plain folder name is needed (no '/', no "
                         "leading '.', no control characters such as a newline)")
    for what, text in (("results directory", str(results_dir)), ("--run-id", run_id or "")):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{what} {ascii(text)}: holds bytes that are not UTF-8 (the run's "
                             "records name their paths in UTF-8 JSON): use a UTF-8 name") from None
    try:
        private_dir(results_dir)
    except OSError as exc:
        raise UsageError(f"results directory {results_dir} cannot be created: {exc}") from None
    for _ in range(100):
        rid = run_id or datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        d = results_dir / rid
        try:
            d.mkdir(mode=0o700)  # owner only, like every file the run writes (issue 25)
            return rid, d
        except FileExistsError:
            if run_id:
                raise UsageError(f"run folder {d} exists already; results are never "
                                 "overwritten") from None
        except OSError as exc:
            raise UsageError(f"results directory {results_dir} is not writable: {exc}") from None
    raise UsageError(f"could not create a new run folder under {results_dir}")
