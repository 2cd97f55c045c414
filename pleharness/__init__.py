"""ple-harness: validation and stress-test harness for patched vLLM inference engines."""

import subprocess
from pathlib import Path

# the command's start, for every job's time stamps (pleharness.timeline.COMMAND_STARTED)
from . import timeline  # noqa: F401

__version__ = "0.1.0"


def source_commit() -> str | None:
    """The commit this package runs from: asked from git when the package sits at the top of a
    git checkout (a clone, or an editable install; ``-dirty`` when a tracked file differs from
    the commit), else the commit recorded in ``BUILD_COMMIT`` when its wheel was built
    (``hatch_build.py``), else None (a build without git)."""
    here = Path(__file__).resolve().parent
    root = here.parent
    if (root / ".git").exists() and (root / "pyproject.toml").exists():
        def git(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=30)
        try:
            head = git("rev-parse", "--short=12", "HEAD")
            if head.returncode == 0:
                dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
                return head.stdout.strip() + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return (here / "BUILD_COMMIT").read_text().strip() or None
    except OSError:
        return None


def version_line() -> str:
    """What ``ple-harness --version`` prints: ``ple-harness 0.1.0 (commit 275566c1a2b3)``, or
    the version alone when no commit is known."""
    commit = source_commit()
    return f"ple-harness {__version__}" + (f" (commit {commit})" if commit else "")
