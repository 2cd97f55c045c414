"""A random-weight mixture-of-experts model (Mixtral architecture: 8 experts, 2 per token) with the
embedded model's tokenizer and chat template, in bfloat16, torch.manual_seed(0): the setting where
expert-routing flips make half-precision numerics diverge from an fp32 golden model by several
nats (issue 32).

    python3 docs/gpu-runs/make-moe-model.py OUT_DIR
"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM

src = Path(__file__).resolve().parents[2] / "pleharness" / "model" / "tiny_llama"
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
cfg = MixtralConfig(vocab_size=793, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                    num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=1024,
                    bos_token_id=0, eos_token_id=1, pad_token_id=5, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, rope_theta=10000.0)
model = MixtralForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(src / name, out / name)
print(f"random bf16 MoE model in {out}")
