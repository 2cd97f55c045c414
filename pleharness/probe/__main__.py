"""``python -m pleharness.probe [--json PATH] [--quick] [--replays N]``: run the probe standalone.

Exit status: 0 for ok/fallback/unavailable (the probe ran and answered), 1 for failed, 2 for a
usage error (e.g. a --json path that is a folder or cannot be written; checked before the probe
runs where possible).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from ..render.probe import render
from . import run_probe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pleharness.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the result as JSON to this path")
    ap.add_argument("--quick", action="store_true", help="capability and a 100-replay self-test, no timings")
    ap.add_argument("--replays", type=int, default=1000, help="self-test replays per row size (default 1000)")
    args = ap.parse_args(argv)
    if args.json is not None and (str(args.json) in ("", ".") or args.json.is_dir()):
        ap.error(f"--json {str(args.json)!r}: is a folder; expected a file path")
    result = run_probe(selftest=True, timings=not args.quick, replays=100 if args.quick else args.replays)
    render(result, Console())
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            print(f"error: --json {str(args.json)!r}: cannot write: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    return 1 if result["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
