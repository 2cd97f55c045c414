"""Shared helpers for the benchmark scripts (not a package module: the scripts put this folder on
sys.path when run as ``python benchmarks/NAME.py``).

- :func:`machine`: date, cores, CPU model, load average and other vLLM engines running now.
- :func:`launch_engine`: an :class:`pleharness.engine.launch.EngineServer` for the embedded model.
- :class:`FastDouble`: the engine double of ``_fastdouble.py`` started in its own process.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def other_engines(exclude_pids: set[int] | None = None) -> list[str]:
    """Command lines of running ``vllm.entrypoints`` processes (not ours), as ``pgrep -af`` shows."""
    try:
        r = subprocess.run(["pgrep", "-af", "vllm.entrypoints"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in r.stdout.splitlines():
        pid = int(line.split()[0])
        if pid == os.getpid() or (exclude_pids and pid in exclude_pids) or "pgrep" in line:
            continue
        out.append(line)
    return out


def machine(exclude_pids: set[int] | None = None) -> dict:
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "other_vllm_engines": len(other_engines(exclude_pids)),
        "python": platform.python_version(),
    }


def print_machine(info: dict) -> None:
    print(f"machine: {info['cores']} cores, {info['cpu_model']}; load average "
          f"{' '.join(str(x) for x in info['loadavg'])}; other vLLM engines running: "
          f"{info['other_vllm_engines']}; date {info['date']}")


def launch_engine(log_dir: Path, engine_args: list[str], env: dict[str, str] | None = None,
                  start_timeout_s: float = 600.0):
    """An (unstarted) EngineServer for the embedded model; use it as a context manager."""
    from pleharness.engine.launch import EngineServer, LaunchSpec
    from pleharness.model import SERVED_NAME, ensure_embedded_model

    model = ensure_embedded_model(sys.executable)
    spec = LaunchSpec(model=str(model), python=sys.executable, engine_args=list(engine_args),
                      env=dict(env or {"VLLM_CPU_KVCACHE_SPACE": "1"}),
                      served_model_name=SERVED_NAME)
    return EngineServer(spec, Path(log_dir), start_timeout_s=start_timeout_s)


def vocab_size() -> int:
    from pleharness.model import ensure_embedded_model
    cfg = json.loads((ensure_embedded_model(sys.executable) / "config.json").read_text())
    return int(cfg["vocab_size"])


class FastDouble:
    """``_fastdouble.py`` in a child process (so its CPU time is not the harness's); a context
    manager giving ``.url``. Answers instantly with pre-made SSE token streams."""

    def __init__(self, vocab: int = 600, tokens_per_chunk: int = 1):
        self.vocab = vocab
        self.tokens_per_chunk = tokens_per_chunk
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "FastDouble":
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_fastdouble.py"), "--vocab", str(self.vocab),
             "--tokens-per-chunk", str(self.tokens_per_chunk)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"listening (http://\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"fast double did not start: {line!r}")
        self.url = m.group(1)
        return self

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the double has used so far (from /proc)."""
        try:
            f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def fmt(x, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def now() -> float:
    return time.monotonic()


def wait_quiet(max_wait_s: float, exclude_pids: set[int] | None = None, poll_s: float = 60.0) -> int:
    """Wait (up to ``max_wait_s``) until no other vLLM engine runs; returns how many still run."""
    deadline = time.monotonic() + max_wait_s
    while True:
        busy = other_engines(exclude_pids)
        if not busy or time.monotonic() >= deadline:
            return len(busy)
        print(f"{len(busy)} other vLLM engine(s) running; waiting up to "
              f"{deadline - time.monotonic():.0f} s more", flush=True)
        time.sleep(min(poll_s, max(1.0, deadline - time.monotonic())))
