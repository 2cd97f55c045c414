"""Golden reference: the same weights run by an independent implementation (transformers, float32,
CPU), to answer "is this output plausible at all?" without trusting vLLM.

:class:`GoldenModel` owns a worker process (``worker.py`` beside this file, run by a Python that has
torch and transformers: the engine's Python for a vLLM installation; the harness itself never
imports torch). It serves two questions:

- ``generate(prompt, max_tokens)``: the greedy continuation and per-position top-k logprobs
  (``--reference golden`` uses it as the reference of every prompt);
- ``score(prompt, prefix, tokens)``: teacher forcing: the golden logprobs of ``tokens`` as the next
  token after prompt + prefix (used to classify a divergence; see :mod:`pleharness.divergence`).

The worker starts lazily (on the first question), so a clean run that never diverges never pays
for it. :func:`golden_problem` is the size guard: a model whose float32 weights would not fit in
half of the machine's available memory is refused with a clear message.

Errors: :class:`GoldenError` (a :class:`pleharness.errors.HarnessError`) when the worker
cannot start or answers an error.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.launch import private_file
from ..engine.side_by_side import mem_available_bytes as available_memory_bytes
from ..engine.side_by_side import model_bytes
from ..errors import HarnessError

WORKER = Path(__file__).with_name("worker.py")
TOP_K = 5  # golden top-k kept per position (membership test of the near-tie rule)
_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}


class GoldenError(HarnessError):
    """The golden worker could not start, or answered with an error."""


@dataclass
class GoldenOutput:
    """Greedy continuation of one prompt: ``ids`` (max_tokens IDs) and ``top`` (per position, the
    top-k ``(token id, logprob in nats)`` pairs, best first)."""

    ids: list[int]
    top: list[list[tuple[int, float]]] = field(default_factory=list)

    def margins(self) -> list[float | None]:
        """Per position, top-1 minus top-2 logprob (nats)."""
        return [round(t[0][1] - t[1][1], 6) if len(t) >= 2 else None for t in self.top]


def weights_bytes(model_dir: Path) -> int:
    """Total size in bytes of the weight files (``*.safetensors``, ``*.bin``) in ``model_dir``
    (:func:`pleharness.engine.side_by_side.model_bytes`; 0 without any)."""
    return model_bytes(model_dir) or 0


def golden_problem(model_dir: str | Path | None) -> str | None:
    """Why a golden model cannot be built from ``model_dir`` here, or None when it can.

    Checks: a local folder with config.json and weight files; the float32 copy (weight bytes x
    4 / bytes per stored parameter, from config.json ``torch_dtype``) fits in half of MemAvailable.
    """
    if model_dir is None:
        return "no local model folder (attached engine without a model path; see --golden-model)"
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        return f"{d} is not a local Hugging Face model folder (no config.json)"
    size = weights_bytes(d)
    if size == 0:
        return f"{d} holds no *.safetensors or *.bin weights"
    try:
        cfg = json.loads((d / "config.json").read_text())
        dt = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").replace("torch.", "")
    except (OSError, ValueError):
        dt = "float32"
    need = size * 4 // _BYTES.get(dt, 2)
    avail = available_memory_bytes()
    if avail is not None and need > avail // 2:
        return (f"the model is too big for a float32 golden copy on this machine: about "
                f"{need / 2**30:.1f} GiB needed, {avail / 2**30:.1f} GiB available (the guard "
                "allows half); run the golden reference on a larger machine or use "
                "--reference solo/engine")
    return None


READY_TIMEOUT_S = 600.0  # loading a large model's weights on a CPU takes minutes, not hours


class GoldenModel:
    """A lazily started transformers worker for one model folder (thread-safe; a context manager).
    ``ready_timeout_s``: how long :meth:`start` waits for the worker's ready line.

    Args:
        model_dir: local Hugging Face model folder.
        python: interpreter with torch and transformers (the engine's).
        log_path: where the worker's stderr goes (None: discarded).
    """

    def __init__(self, model_dir: str | Path, python: str, log_path: Path | None = None):
        self.model_dir = str(model_dir)
        self.python = python
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.ready_timeout_s = READY_TIMEOUT_S
        self._lock = threading.Lock()
        self._cache: dict[tuple, GoldenOutput] = {}

    def start(self) -> None:
        """Start the worker and wait for its ready line. Raises GoldenError."""
        problem = golden_problem(self.model_dir)
        if problem:
            raise GoldenError(f"golden reference unavailable: {problem}")
        if self.log_path:
            err = private_file(self.log_path, "ab")  # 0600, like every run output
        else:
            err = subprocess.DEVNULL
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "TOKENIZERS_PARALLELISM": "false"}
        try:
            self.proc = subprocess.Popen([self.python, str(WORKER), self.model_dir],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env)
        except OSError as exc:
            raise GoldenError(f"golden worker could not start with {self.python}: {exc}") from None
        finally:
            if self.log_path:
                err.close()
        where = f" (see {self.log_path})" if self.log_path else ""
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()),
                                  name="golden-ready", daemon=True)
        reader.start()
        reader.join(self.ready_timeout_s)
        if reader.is_alive():  # no ready line: stop it (its stdout closes, the reader ends)
            self.proc.kill()
            self.proc.wait()
            raise GoldenError(f"golden worker printed no ready line within "
                              f"{self.ready_timeout_s:.0f} s{where}; is {self.python} a Python "
                              "with torch and transformers?")
        line = box[0] if box else ""
        if not line:
            code = self.proc.wait()
            raise GoldenError(f"golden worker exited with code {code} before it was ready{where}; "
                              f"it needs torch and transformers in {self.python}")
        try:
            self.info = json.loads(line)
            if not isinstance(self.info, dict) or not self.info.get("ready"):
                raise ValueError("no ready key")
        except ValueError:
            self.proc.kill()
            self.proc.wait()
            raise GoldenError(f"golden worker printed {line.strip()[:120]!r} instead of its ready "
                              f"line{where}; is {self.python} a Python with torch and "
                              "transformers?") from None

    def _ask(self, req: dict) -> dict:
        with self._lock:
            if self.proc is None:
                self.start()
            assert self.proc is not None and self.proc.stdin and self.proc.stdout
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (OSError, ValueError) as exc:
                raise GoldenError(f"golden worker failed: {exc}") from None
            if not line:
                raise GoldenError(f"golden worker exited (code {self.proc.poll()})")
            ans = json.loads(line)
            if "error" in ans:
                raise GoldenError(f"golden worker: {ans['error']}")
            return ans

    def generate(self, prompt: list[int], max_tokens: int, top_k: int = TOP_K) -> GoldenOutput:
        """Greedy continuation of ``prompt`` (``max_tokens`` IDs, EOS ignored) with top-k
        logprobs per position; cached per (prompt, max_tokens, top_k)."""
        key = (tuple(prompt), max_tokens, top_k)
        if key not in self._cache:
            ans = self._ask({"op": "generate", "prompt": list(prompt), "max_tokens": max_tokens,
                             "top_k": top_k})
            self._cache[key] = GoldenOutput(
                ids=[int(i) for i in ans["ids"]],
                top=[[(int(a), float(b)) for a, b in t] for t in ans["top"]])
        return self._cache[key]

    def score(self, prompt: list[int], prefix: list[int], tokens: list[int],
              top_k: int = TOP_K) -> tuple[dict[int, float], list[tuple[int, float]]]:
        """Teacher forcing: ({token: golden logprob}, golden top-k) for the next token after
        ``prompt + prefix``; logprobs in nats."""
        ans = self._ask({"op": "score", "prompt": list(prompt), "prefix": list(prefix),
                         "tokens": list(tokens), "top_k": top_k})
        return ({int(k): float(v) for k, v in ans["logprobs"].items()},
                [(int(a), float(b)) for a, b in ans["top"]])

    def force(self, prompt: list[int], tokens: list[int]) -> list[tuple[float, int, float]]:
        """Teacher-force a whole continuation: per token of ``tokens`` (after ``prompt``),
        (golden logprob of that token, golden top-1 id, golden logprob of the top-1), nats.
        Raises GoldenError."""
        if not tokens:
            return []
        ans = self._ask({"op": "force", "prompt": list(prompt), "tokens": list(tokens)})
        return [(float(a), int(b), float(c)) for a, b, c in ans["forced"]]

    def close(self) -> None:
        """Stop the worker (closing its stdin ends it; killed after 10 s)."""
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            p.stdin.close()
            p.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
            p.wait()

    def __enter__(self) -> "GoldenModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
