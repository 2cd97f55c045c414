"""Is the golden reference the same on another machine? Prints, for the embedded model, the
verified weights digest and the SHA256 of the golden (transformers, float32, CPU) greedy output of
the transitions prompts, plus the smallest top-1/top-2 margin seen per prompt.

Run the same command on two machines and compare the lines (e.g. here and on the lent GPU
machine, whose CPU and torch differ)::

    python benchmarks/golden_crosscheck.py [--prompts 16] [--max-tokens 32]

Needs torch and transformers in this Python. Prints one line per prompt and a digest of all.
"""
from __future__ import annotations

import argparse
import hashlib
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pleharness.golden import GoldenModel  # noqa: E402
from pleharness.model import SHIPPED_DIR, WEIGHTS_SHA256, ensure_embedded_model  # noqa: E402
from pleharness.parity import token_hash  # noqa: E402
from pleharness.prompts import seeded_prompts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    ensure_embedded_model()
    import torch
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"machine: {cpu}; torch {torch.__version__}; weights {WEIGHTS_SHA256} verified")
    half = a.prompts // 2
    prompts = seeded_prompts(20261129, half, 5, 300, 16, 793) + \
        seeded_prompts(20261130, a.prompts - half, 5, 300, 16, 793)
    t0 = time.monotonic()
    all_h = hashlib.sha256()
    with GoldenModel(SHIPPED_DIR, sys.executable) as g:
        for p in prompts:
            out = g.generate(list(p.ids), a.max_tokens)
            h = token_hash(out.ids)
            all_h.update(h.encode())
            print(f"len {len(p.ids):4d} output {h[:16]} min margin {min(out.margins()):.4f} nats")
    print(f"all outputs digest {all_h.hexdigest()[:16]} ({len(prompts)} prompts, "
          f"{time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
