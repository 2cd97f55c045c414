#!/usr/bin/env python3
"""The command line before and after a refactor of its options (issue 50 item 4): every
command's ``--help``, and for many command lines the configuration each job would be given (the
job replaced by a dump of its arguments), stdout, stderr and exit code. Starts no engine.

Usage::

    .venv/bin/python scripts/cli_check.py run OUT        # about 2 minutes on 2 cores
    .venv/bin/python scripts/cli_check.py compare BEFORE AFTER

``compare`` exits 1 when any file differs; the facts job's log folder name (a timestamp) is
left out, and ``run`` writes the checkout's path as CHECKOUT (a before and an after checkout
compare equal). Runs with the checkout it stands in.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T = os.path.join(tempfile.gettempdir(), "ple-cli-check")  # the same path in both runs
U = "http://127.0.0.1:9"
COMMANDS = ["", "stress", "fuzz", "selftest", "facts", "explain", "confirm", "compare", "report",
            "scenarios", "probe", "build-model"]
# stress, fuzz, selftest and facts: configs built, warnings, usage errors (exit 2)
CASES = [
    ["stress"],
    ["stress", "--engine-profile", "cpu-ngram", "--engine-arg=--max-num-seqs=8", "--engine-env", "FOO=1",
     "--tp", "2", "--port", "8123", "--host", "0.0.0.0", "--start-timeout", "30", "--model", "/tmp/m",
     "--engine-python", sys.executable, "--served-model-name", "srv"],
    ["stress", "--engine-profile", "cpu-ngram", "--control-engine-arg=--enforce-eager",
     "--control-drop-arg=--speculative-config"],
    ["stress", "--scenario", "boundary", "--scenario", "pairs", "--ladder", "4,1", "--repeats", "2",
     "--max-tokens", "5", "--suite-repeats", "3", "--api", "chat", "--logprobs", "5"],
    ["stress", "--suite", "premerge"],
    ["stress", "--suite", "premerge", "--control-engine-python", sys.executable],
    ["stress", "--suite", "nightly"],
    ["stress", "--suite", "selftest", "--suite-repeats", "2"],
    ["stress", "--suite", "selftest", "--repeat", "2"],
    ["stress", "--url", U, "--block-size", "16", "--chunk-size", "256", "--num-speculative-tokens", "3",
     "--max-num-seqs", "4", "--max-model-len", "1024", "--vocab-size", "100", "--dtype", "bfloat16",
     "--served-model-name", "x", "--api-key-env", "OPTS_KEY"],
    ["stress", "--url", U, "--tp", "2", "--engine-arg=--a", "--control-profile", "cpu-ngram"],
    ["stress", "--block-size", "16", "--dtype", "float16"],
    ["stress", "--ladder", "4,,1"],
    ["stress", "--url", U, "--dtype", "foo"],
    ["stress", "--reference", "engine", "--reference-engine-arg=--enforce-eager",
     "--reference-drop-arg=--x", "--reference-cache-state", "cold", "--golden-model", "/tmp/g",
     "--confirm-runs", "0", "--parallel-engines", "2", "--near-tie-nats", "0.3", "--strict",
     "--no-golden", "--numerics-from", "self", "--on-timeout", "abort", "--connect-timeout", "1",
     "--first-token-timeout", "2", "--between-tokens-timeout", "3", "--request-timeout", "4",
     "--results-dir", T + "/res", "--run-id", "r1", "--no-engine-probe", "--compile-cache", T + "/cc"],
    ["stress", "--repeat", "2"],
    ["stress", "--repeat", "2", "--suite-repeats", "3"],
    ["stress", "--suite", "premerge", "--scenario", "boundary"],
    ["stress", "--control-profile", "cpu-ngram"],
    ["stress", "--url", U, "--reference", "engine"],
    ["stress", "--reference-engine-arg=--x", "--reference-drop-arg=--y"],
    ["stress", "--engine-arg=--a", "--engine-arg=--a", "--control-drop-arg=--b", "--control-drop-arg=--b"],
    ["stress", "--engine-arg=--a b"],
    ["stress", "--results-dir", ""],
    ["stress", "--results-dir", " "],
    ["stress", "--numerics-from", "/nonexistent"],
    ["stress", "--control-engine-python", "/nonexistent"],
    ["stress", "--api-key-env", "sk-abc123"],
    ["stress", "--api-key-env", "OPTS_UNSET"],
    ["stress", "--parallel-engines", "auto"],
    ["stress", "--parallel-engines", "x"],
    ["stress", "--engine-profile", "nonexist"],
    ["stress", "--url", "ftp://x"],
    ["stress", "--engine-env", "BAD"],
    ["stress", "--compile-cache", T + "/cc", "--engine-env", "VLLM_CACHE_ROOT=/elsewhere"],
    ["stress", "--model", ""],
    ["fuzz"],
    ["fuzz", "--max-examples", "5", "--seed", "7", "--max-drawn-tokens", "4", "--no-shrink",
     "--request-timeout", "30", "--confirm-runs", "1", "--parallel-engines", "2", "--engine-profile",
     "cpu-ngram", "--near-tie-nats", "0.2", "--strict", "--no-golden", "--no-engine-probe",
     "--results-dir", T + "/res", "--run-id", "f1", "--numerics-from", "self", "--compile-cache", T + "/cc"],
    ["fuzz", "--url", U, "--block-size", "16", "--parallel-engines", "2"],
    ["fuzz", "--max-tokens", "4"],
    ["fuzz", "--max-tokens", "4", "--max-drawn-tokens", "3"],
    ["fuzz", "--url", U, "--block-size", "32", "--chunk-size", "256", "--api-key-env", "OPTS_KEY"],
    ["fuzz", "--max-examples", "0"],
    ["fuzz", "--block-size", "32"],
    ["selftest"],
    ["selftest", "--suite", "default", "--fault", "flip_under_load", "--engine-profile", "cpu-ngram",
     "--run-id", "s1", "--results-dir", T + "/res", "--tp", "2"],
    ["selftest", "--scenario", "boundary", "--url", U, "--block-size", "16"],
    ["selftest", "--suite", ""],
    ["selftest", "--suite", "premerge", "--scenario", "x"],
    ["selftest", "--fault", "oov_id", "--fault", "oov_id"],
    ["selftest", "--url", U, "--engine-arg=--x"],
    ["facts", "--url", U],
    ["facts", "--engine-profile", "cpu-ngram", "--tp", "2", "--results-dir", T + "/res"],
    ["facts", "--url", U, "--model", "/m"],
    ["facts", "--url", U, "--results-dir", ""],
    ["facts", "--engine-arg=--a b"],
    ["facts", "--url", U, "--api-key-env", "OPTS_KEY", "--served-model-name", "n"],
    ["explain", "/nonexistent"],
    ["confirm", "/nonexistent"],
]
# run in a child per case: each job replaced by a dump of its arguments (consoles left out)
WRAP = r'''
import dataclasses
import json
import sys


def ser(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: ser(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): ser(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [ser(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return f"{type(x).__name__}:{x}"


def dump(name):
    def job(*args, **kw):
        shown = {"args": [ser(v) for v in args if type(v).__name__ != "Console"],
                 "kw": {n: ser(v) for n, v in kw.items() if type(v).__name__ != "Console"}}
        print("JOB " + name + " " + json.dumps(shown, sort_keys=True, indent=1))
        return 0
    return job


import pleharness.cli as cli
import pleharness.cli.facts
import pleharness.cli.fuzz
import pleharness.cli.selftest
import pleharness.cli.stress

pleharness.cli.stress.run_stress = dump("stress")
pleharness.cli.fuzz.run_fuzz = dump("fuzz")
pleharness.cli.selftest.run_selftest = dump("selftest")
pleharness.cli.facts.run_facts = dump("facts")
sys.argv = ["ple-harness"] + sys.argv[1:]
cli.run()
'''


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.makedirs(T, exist_ok=True)
    env = {**os.environ, "COLUMNS": "200", "OPTS_KEY": "secret-key-1",
           "PYTHONPATH": str(ROOT)}
    env.pop("OPTS_UNSET", None)
    results = []
    for i, args in enumerate(CASES):
        r = subprocess.run([sys.executable, "-c", WRAP, *args], capture_output=True, text=True,
                           env=env, cwd=T)
        results.append({"i": i, "args": args, "rc": r.returncode,  # two checkouts alike
                        "stdout": r.stdout.replace(str(ROOT), "CHECKOUT"),
                        "stderr": r.stderr.replace(str(ROOT), "CHECKOUT")})
        print(i, r.returncode, " ".join(args)[:100], flush=True)
    (out / "cases.json").write_text(json.dumps(results, indent=1))
    for cmd in COMMANDS:
        r = subprocess.run([sys.executable, "-m", "pleharness", *([cmd] if cmd else []),
                            "--help"], capture_output=True, text=True, env=env, cwd=T)
        (out / f"help-{cmd or 'main'}.txt").write_text(
            f"rc {r.returncode}\n{r.stdout}\n--stderr--\n{r.stderr}")


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    bad = 0
    for name in names:
        a, b = ((d / name).read_text() if (d / name).exists() else None for d in (before, after))
        if a is not None and b is not None:
            a, b = (re.sub(r"facts-\d{8}-\d{6}", "facts-TIME", x) for x in (a, b))
        if a != b:
            bad += 1
            print(f"differs: {name}")
    print(f"{len(names)} file(s) compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
