#!/usr/bin/env python3
"""The same runs before and after a refactor, then compared (issue 34's done-when).

Usage::

    .venv/bin/python scripts/refactor_check.py run OUT      # the runs, into folder OUT
    .venv/bin/python scripts/refactor_check.py compare BEFORE AFTER

``run`` makes, from the checkout it stands in (about 10 minutes on 2 cores):

- ``default``: ``ple-harness stress`` on the embedded default (the CPU engine it launches);
- ``spec``: stress with a control run, on the engine double ``tests/fakepy/python`` in front of
  one real CPU engine (profiles/cpu-ngram.toml), corrupting every run of a prompt after its first
  two while ``--speculative-config`` is a launch argument (deterministic: ``PLE_FAULT_MODE=load``),
  the control dropping that flag;
- ``spec/explain``: ``ple-harness explain`` of that run (3 tries, 1 confirmation);
- ``fuzz``: fuzz on the same double (always corrupt), with a reproducer confirmed once;
- ``selftest``: ``ple-harness selftest`` attached to that engine (the clean pass and two planted
  classes, flip_under_load and oov_id).

``compare`` runs ``scripts/compare_manifests.py`` on each manifest and on explain.json (the
same left-out fields: timings, ids, paths) and exits 1 when any differs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE_PY = str(ROOT / "tests" / "fakepy" / "python")
PROFILE = "profiles/cpu-ngram.toml"
FILES = ["default/manifest.json", "spec/manifest.json", "spec/control-manifest.json",
         "spec/explain/explain.json", "fuzz/manifest.json", "selftest/selftest.json"]


def cli(*args: str, env: dict[str, str] | None = None) -> int:
    print("+ ple-harness", " ".join(args), flush=True)
    r = subprocess.run([sys.executable, "-m", "pleharness", *args], cwd=ROOT,
                       env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL)
    print(f"  exit {r.returncode}", flush=True)
    return r.returncode


def run(out: Path) -> None:
    from pleharness.engine.launch import EngineServer, LaunchSpec
    from pleharness.model import SERVED_NAME, ensure_embedded_model
    from pleharness.profile import load_profile
    out.mkdir(parents=True, exist_ok=True)
    cli("stress", "--results-dir", str(out), "--run-id", "default")
    prof = load_profile(ROOT / PROFILE)
    spec = LaunchSpec(model=str(ensure_embedded_model()), python=sys.executable,
                      engine_args=list(prof.engine_args), env=dict(prof.env),
                      served_model_name=SERVED_NAME)
    with EngineServer(spec, out / "upstream") as srv:
        env = {"PLE_FAULT_UPSTREAM": srv.url, "PLE_FAULT_MODE": "load",
               "PLE_REAL_PYTHON": sys.executable}
        cli("stress", "--engine-python", FAKE_PY, "--engine-profile", PROFILE, "--scenario",
            "transitions", "--ladder", "4,1", "--repeats", "1", "--results-dir", str(out),
            "--run-id", "spec", "--control-drop-arg=--speculative-config", "--no-golden",
            env={**env, "PLE_FAULT_WHEN": "--speculative-config"})
        cli("explain", str(out / "spec"), "--tries", "3", "--confirm-runs", "1",
            env={**env, "PLE_FAULT_WHEN": "--speculative-config"})
        cli("fuzz", "--engine-python", FAKE_PY, "--engine-profile", PROFILE, "--results-dir",
            str(out), "--run-id", "fuzz", "--max-examples", "8", "--seed", "1",
            "--max-drawn-tokens", "8", "--max-phases", "2", "--max-concurrency", "2",
            "--max-inserts", "0", "--no-golden", "--confirm-runs", "1", "--no-features",
            env={**env, "PLE_FAULT_WHEN": "always"})
        cli("selftest", "--url", srv.url, "--results-dir", str(out), "--run-id", "selftest",
            "--fault", "flip_under_load", "--fault", "oov_id")


def compare(before: Path, after: Path) -> int:
    rc = 0
    for f in FILES:
        a, b = before / f, after / f
        if not a.exists() or not b.exists():
            print(f"{f}: missing ({'before' if not a.exists() else 'after'})")
            rc = 1
            continue
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_manifests.py"),
                            str(a), str(b)], capture_output=True, text=True)
        lines = (r.stdout + r.stderr).strip().splitlines()
        print(f"{f}: {'same' if r.returncode == 0 else f'{len(lines)} difference(s)'}")
        for line in lines[:40] if r.returncode else []:
            print("   ", line)
        rc |= r.returncode != 0
    return rc


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve())
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
