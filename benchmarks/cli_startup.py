"""Start-up cost of the command line: ``ple-harness --help`` of this tree, of another revision.

Issue 34 moved every import of the harness's own modules to the module tops, so ``--help`` now
loads every job (stress, explain, selftest, facts) and what they import; only optional heavy
dependencies (torch, transformers, hypothesis, matplotlib ...) stay lazy. This prints the median
wall time of ``python -m pleharness --help`` (fresh processes, interleaved so a busy machine slows
them alike) for the bare interpreter (``python -c pass``), this tree, and with ``--against REV``
the same command in a git worktree of REV (e.g. a02680a, the last commit with the command line's
lazy imports), and the ratio.

Example: ``.venv/bin/python benchmarks/cli_startup.py --repeats 9 --against a02680a``
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, print_machine  # noqa: E402

HELP = [sys.executable, "-m", "pleharness", "--help"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="fresh processes per case")
    ap.add_argument("--against", metavar="REV", help="also time --help of this git revision")
    a = ap.parse_args()
    print_machine(machine())
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"interpreter": ([sys.executable, "-c", "pass"], ROOT), "this tree": (HELP, ROOT)}
        if a.against:
            wt = Path(tmp) / "rev"
            subprocess.run(["git", "worktree", "add", "--detach", str(wt), a.against], cwd=ROOT,
                           check=True, capture_output=True)
            cases[a.against] = (HELP, wt)
        try:
            times: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(a.repeats):
                for name, (cmd, cwd) in cases.items():
                    t = time.perf_counter()
                    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
                    times[name].append(time.perf_counter() - t)
        finally:
            if a.against:
                subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                               capture_output=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:12s} median {v:.3f} s (min {min(times[k]):.3f}, max {max(times[k]):.3f})")
    if a.against:
        print(f"ratio this tree / {a.against}: {med['this tree'] / med[a.against]:.2f} "
              f"({med['this tree'] - med[a.against]:+.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
