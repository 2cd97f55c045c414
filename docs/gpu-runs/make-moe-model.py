"""A random-weight mixture-of-experts model (Mixtral architecture: 8 experts, 2 per token) with the
embedded model's tokenizer and chat template, in bfloat16, torch.manual_seed(0): the setting where
expert-routing flips make half-precision numerics move logprobs by a nat under batching (issues 32
and 47). ``--lm-head-scale S`` multiplies the output projection by S so that the logits are as
sharp as a trained model's (issue 47: a random model's logits are nearly flat, so every flip is a
near tie and nothing is ever hard); the script prints what the scale gives, measured in float32 on
64 random prompts: the top-1 logit's distance from the median logit and the top-1/top-2 margin.

    python3 docs/gpu-runs/make-moe-model.py OUT_DIR [--lm-head-scale S] [--max-position 4096]

How S was chosen (issue 47, docs/gpu-runs/README.md): a trained LLM's top logit stands tens of
nats above the bulk of the vocabulary, and its greedy top-1/top-2 margins are mostly a few nats
with a tail of near ties. Measured here (float32, 64 random 48-token prompts, their last 16
positions): unscaled, the top-1 is 1.0 nat above the median logit and every margin is below 0.5
nats (median 0.07); S = 12 gives 12 nats and a median margin of 0.85; S = 32 gives 32 nats
(24-49), a median margin of 2.3 nats, 14 % of margins below 0.5 and 19 % above 5: logits tens
of nats apart with both near ties and confident tokens, so the run used S = 32.
"""
import argparse
import shutil
import statistics
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--lm-head-scale", type=float, default=1.0)
ap.add_argument("--max-position", type=int, default=4096)
a = ap.parse_args()
src = Path(__file__).resolve().parents[2] / "pleharness" / "model" / "tiny_llama"
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
cfg = MixtralConfig(vocab_size=793, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                    num_local_experts=8, num_experts_per_tok=2,
                    max_position_embeddings=a.max_position,
                    bos_token_id=0, eos_token_id=1, pad_token_id=5, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, rope_theta=10000.0)
model = MixtralForCausalLM(cfg)
with torch.no_grad():
    model.lm_head.weight.mul_(a.lm_head_scale)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(16, 793, (64, 48), generator=g)
    logits = model(ids).logits[:, -16:, :].reshape(-1, 793).float()
    top2 = logits.topk(2, dim=-1).values
    above = (top2[:, 0] - logits.median(dim=-1).values).tolist()
    lp = torch.log_softmax(logits, -1).topk(2, dim=-1).values
    margin = (lp[:, 0] - lp[:, 1]).tolist()
print(f"lm_head x {a.lm_head_scale:g}: top-1 logit above the median logit: median "
      f"{statistics.median(above):.1f}, min {min(above):.1f}, max {max(above):.1f} nats; "
      f"top-1/top-2 margin: median {statistics.median(margin):.2f}, "
      f"{100 * sum(m < 0.5 for m in margin) / len(margin):.0f} % below 0.5, "
      f"{100 * sum(m > 5 for m in margin) / len(margin):.0f} % above 5 nats")
model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(src / name, out / name)
print(f"random bf16 MoE model in {out}")
