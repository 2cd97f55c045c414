"""Hatchling build hook (pyproject.toml ``[tool.hatch.build.targets.wheel.hooks.custom]``): a wheel
built from a git checkout carries the commit it was built from, so that the installed
``ple-harness --version`` names it (issue 51 item 4).

The commit goes into the wheel as ``pleharness/BUILD_COMMIT`` (one line: 12 hex digits, with
``-dirty`` when tracked files differ from the commit); nothing is written into the source tree. No git, or no checkout (a build from an sdist), or an editable install: no file, and
``--version`` prints the version alone (an editable install asks git at run time instead).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

TARGET = "pleharness/BUILD_COMMIT"


def git_commit(root: str) -> str | None:
    """The checkout's HEAD commit at ``root`` (12 hex digits, ``-dirty`` when a tracked file
    differs from it), or None when ``root`` is not the top of a git checkout or git is missing."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=30)
    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return None
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


class CommitHook(BuildHookInterface):
    """Adds ``pleharness/BUILD_COMMIT`` with the build's commit to a (non-editable) wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        """Write the commit into a temporary file and have the wheel include it."""
        if version == "editable":
            return
        commit = git_commit(self.root)
        if commit is None:
            return
        self._tmp = tempfile.mkdtemp(prefix="ple-harness-build-")
        path = Path(self._tmp) / "BUILD_COMMIT"
        path.write_text(commit + "\n")
        build_data["force_include"][str(path)] = TARGET

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        """Remove the temporary file."""
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
