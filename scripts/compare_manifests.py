#!/usr/bin/env python3
"""Compare two results manifests field by field, except what differs between any two runs.

Usage: ``python scripts/compare_manifests.py BEFORE/manifest.json AFTER/manifest.json``

For a behaviour-preserving change (a refactor): run the same command before and after it and
compare. Left out: timings (``*_s``, ``*_at``, throughput, ``tok_per_s``), run ids and paths
(``run_id``, ``invocation``, ``url``, ``command``, ``launch.python``, the checkout's folder
in paths), the harness's git commit,
the engine's port, the environment block except GPU facts, the compile cache each engine start
found (its size, cold or warm), and what is random by design: the
outputs of unseeded sampled requests (temperature > 0, no seed: hash, IDs, text, length,
finish reason, logprobs) and the two-sample
statistics of kind ``sampled`` (its table and its ``sampled_distribution`` phase checks' details;
their statuses are compared). Everything else (statuses,
verdicts, phases, requests' token hashes and checks, references, facts, tables, summary counts)
must be equal. A schema-2 manifest's records are read from its JSON Lines file (``requests_file``,
the first ``requests_count`` lines) and compared as ``requests`` like a schema-1 manifest's inline
records; ``schema_version``, ``requests_file`` and ``requests_count`` are where records are kept,
not what a run did, and are left out. Prints one line per difference (the dotted path, then before -> after); exit 0
when there are none, 1 otherwise, 2 for bad input.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

# dotted-path patterns (regular expressions on the whole path) left out of the comparison
IGNORED = [
    r".*_s", r".*_at", r".*_s_median", r".*tok_per_s", r".*throughput.*",
    r"run_id", r"invocation(\..*)?", r"harness\.git_commit", r"(job\.)?exit_code_?",
    r"engine\.(url|command|launch\.python|ready_s)(\..*)?",
    r"engine\.(reference_engine|control_engine)\.(command|ready_s|launch\.python)(\..*)?",
    r"environment\.(platform|harness_python|engine_python)",
    r"summary\.headline", r"run_options\.golden_classifier", r"run_options\.golden_log",
    r"requests\.\d+\.(id|latency_s|ttft_s)", r"log_tail(\..*)?",
    r"facts\..*\.(source_detail)",
    r"(phases\.\d+|summary)\.engaged\.in_flight_peak",  # from the client's clock
    # the engine probe draws its prompts from a fresh seed each run (engine_probe.prompt_seed):
    # its prompts and their hashes differ by design; its verdicts (the properties) are compared
    r"engine_probe\.prompt_seed", r"engine_probe\.evidence(\..*)?",
    # how many requests the probe needed depends on its prompts (where repeats first diverge)
    r"engine_probe\.requests", r".*s_per_example",
    # the two-sample statistics of unseeded samples (kind sampled): random by design
    r"tables\.sampled_distribution\.\d+\.(statistic|p_value|detail)",
    # the compile cache of the machine, as each engine start found and left it
    r"timeline\.engine_starts\.\d+\.(compile_cache|cache|cache_bytes|cache_written_bytes"
    r"|cache_reload_failure)",
]
_IGNORED = re.compile("|".join(f"(?:{p})" for p in IGNORED))
_VOLATILE_TEXT = re.compile(r"/\S*?/(?=(pleharness|scenarios|profiles|tests)/)"
                            r"|https?://[\w.]+:\d+|/\S+/(?=engine\.log)|/tmp/\S+"
                            r"|client-seen decode position \d+|\d+(\.\d+)? ?s\b"
                            # where the probe's random prompts first diverge on repeat
                            r"|diverged at position \d+"
                            # a disconnect's abandoned request may finish before it is cut
                            r"|finished normally \d+ of")


def _norm(x: Any) -> Any:
    """Strings lose URLs with ports, temporary paths, the run folder of an engine log, the
    client-seen decode position of an insert (streaming speed), durations (e.g. in notes) and
    the folder of the checkout (``/work/a/pleharness/...`` and ``/work/b/pleharness/...`` compare equal)."""
    return _VOLATILE_TEXT.sub("<volatile>", x) if isinstance(x, str) else x


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Differences between two JSON values as 'path: before -> after' lines (paths dotted,
    list items by index), skipping paths in IGNORED."""
    if path and _IGNORED.fullmatch(path):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                if not _IGNORED.fullmatch(p):
                    out.append(f"{p}: {'<missing>' if k not in a else repr(a[k])[:80]} -> "
                               f"{'<missing>' if k not in b else repr(b[k])[:80]}")
                continue
            out += diff(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items -> {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}.{i}")]
    if isinstance(a, float) and isinstance(b, float) and a == b:
        return []
    if _norm(a) != _norm(b):
        return [f"{path}: {repr(a)[:80]} -> {repr(b)[:80]}"]
    return []


# what a request's output is; random by design for an unseeded sample
SAMPLED_OUTPUT = ("output_hash", "output_ids", "output_text", "output_len", "completion_tokens",
                  "finish_reason", "logprobs", "top_logprobs")


def _unseeded_sample(record: Any) -> bool:
    """A sampled request without a seed (temperature > 0): its output is random by design, so
    its output (:data:`SAMPLED_OUTPUT`: hash, IDs, text, length, finish reason, logprobs) is
    left out (its checks and status are still compared)."""
    return isinstance(record, dict) and (record.get("temperature") or 0) > 0 \
        and record.get("seed") is None


def _local(x: Any, folders: list[tuple[str, str]]) -> Any:
    """``x`` with every string's run folders named by role (``folders``: (absolute path, name),
    the longest first) and the value after ``--port`` in a command list hidden."""
    if isinstance(x, dict):
        return {k: _local(v, folders) for k, v in x.items()}
    if isinstance(x, list):
        return [("<port>" if i and x[i - 1] == "--port" else _local(v, folders))
                for i, v in enumerate(x)]
    if isinstance(x, str):
        for path, name in folders:  # a whole folder name: /r/after is no part of /r/after1
            x = re.sub(re.escape(path) + r"(?![\w.-])", name, x)
    return x


def load(path: str) -> dict:
    """A manifest (or explain.json) as JSON, its records inline (``requests``) whatever the
    schema version, the output hashes of unseeded samples left out, the folders it was written
    in (its own and its parent: the run and results folders) and engine ports hidden.
    Raises OSError / ValueError for an unreadable file."""
    here = Path(path).resolve().parent
    folders = [(str(d), f"<folder-{i}>") for i, d in enumerate([here, here.parent])
               if len(d.parts) > 2]
    data = _local(json.loads(Path(path).read_text()), folders)
    name = data.pop("requests_file", None)
    count = data.pop("requests_count", None)
    data.pop("schema_version", None)
    if name:
        lines = (Path(path).parent / name).read_text().splitlines()
        data["requests"] = [json.loads(x) for x in lines[:count]]
    for r in data.get("requests") or []:
        if _unseeded_sample(r):
            for k in SAMPLED_OUTPUT:
                r.pop(k, None)
    for ph in data.get("phases") or []:  # the same two-sample statistics, as phase checks
        for c in ph.get("checks") or []:
            if c.get("name") == "sampled_distribution":
                c.pop("detail", None)
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        before, after = (load(p) for p in argv)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lines = diff(before, after)
    for line in lines:
        print(line)
    print(f"{len(lines)} difference(s) outside timings, ids and paths")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
