"""A random-weight copy of the embedded model (same config and tokenizer, torch.manual_seed(0),
bfloat16): a model whose greedy logits are near-tied everywhere, the setting where numerics
diverge across batch sizes (docs/gpu-runs/README.md, runs d-f).

    python3 docs/gpu-runs/make-random-model.py OUT_DIR
"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, LlamaForCausalLM

src = Path(__file__).resolve().parents[2] / "pleharness" / "model" / "tiny_llama"
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
cfg = AutoConfig.from_pretrained(src)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(src / name, out / name)
print(f"random bf16 model in {out}")
