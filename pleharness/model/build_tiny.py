"""Build the embedded default model: a tiny, trained Llama-architecture model.

Run as a standalone script by the engine's Python (it needs torch, transformers and tokenizers,
which a vLLM installation carries; the harness itself does not import them)::

    python build_tiny.py OUT_DIR

It writes a Hugging Face model folder (config.json, safetensors weights, tokenizer.json,
tokenizer_config.json with a chat template, generation_config.json) into OUT_DIR.

What the model is for: parity checks are only meaningful when greedy decoding is not at the mercy of
near ties, and reference-free checks need answers that are known in advance. The model is therefore
trained (deterministic seed, about five minutes on 2 CPU cores, once: the result is cached) on two chat tasks:

- "Reply with OK."              -> "OK" then EOS
- "Count from 1 to N." (N<=MAX_COUNT) -> " 1 2 ... N" then EOS (in practice it keeps counting
  past N rather than stopping; checks read the first N numbers)

with a random number of single-token filler tokens (" ") inserted just before the generation-prompt
tail, exactly as the harness's exact-length prompt builder does, so that padded prompts of any length
up to MAX_LEN tokens keep answering correctly.

Architecture: LlamaForCausalLM, hidden 256, 4 attention heads of dimension 64 (the CPU attention
backend of vLLM refuses head dimension 16), 4 KV heads (divisible by tensor-parallel sizes 1, 2, 4),
2 layers, float32 weights, max_position_embeddings MAX_LEN. Tokenizer: byte-level BPE trained with
`tokenizers` on a generated corpus; every number " 1" ... " MAX_COUNT" is a single token (checked).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

BUILD_VERSION = 3  # bump when anything below changes: the cache key includes it
MAX_LEN = 1024
MAX_COUNT = 320
VOCAB_SIZE = 1024
SEED = 1234
TRAIN_STEPS = int(os.environ.get("PLE_TINY_TRAIN_STEPS", "400"))

SPECIALS = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = (
    "reply with ok please count from to the a and of in is it that this for on are as with be at "
    "one two three number numbers answer question hello world model engine token tokens test check "
    "what how why when where who which short long prompt decode prefill cache block chunk graph"
).split()


def corpus(rng: random.Random) -> list[str]:
    lines = []
    for _ in range(60):
        lines.append(" ".join(str(i) for i in range(1, MAX_COUNT + 1)))
    for _ in range(400):
        lines.append("Reply with OK. Count from 1 to %d." % rng.randint(1, MAX_COUNT))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + ".")
    lines.append("OK ok Ok " * 50)
    return lines


def build_tokenizer(out: str, rng: random.Random):
    # lazy: tokenizers, transformers: only a rebuild of the model needs them
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=MAX_LEN)
    fast.chat_template = CHAT_TEMPLATE
    for n in range(1, MAX_COUNT + 1):
        ids = fast.encode(" %d" % n, add_special_tokens=False)
        if len(ids) != 1:
            raise SystemExit(f"tokenizer: ' {n}' is {len(ids)} tokens; raise VOCAB_SIZE")
    if len(fast.encode(" ", add_special_tokens=False)) != 1:
        raise SystemExit("tokenizer: filler ' ' is not one token")
    fast.save_pretrained(out)
    return fast


def chat_ids(tok, user: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                   tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def example(tok, rng: random.Random, filler: int, tail: int = 4):
    """One training sequence: (input ids, loss mask)."""
    if rng.random() < 0.35:
        user, answer = "Reply with OK.", tok.encode("OK", add_special_tokens=False)
    else:
        u = rng.random()
        n = rng.randint(1, 24) if u < 0.4 else rng.randint(1, MAX_COUNT) if u < 0.8 else MAX_COUNT
        user = "Count from 1 to %d." % n
        answer = [tok.convert_tokens_to_ids("Ġ%d" % i) for i in range(1, n + 1)]
    prompt = chat_ids(tok, user)
    room = max(0, MAX_LEN - len(prompt) - len(answer) - 1)
    u = rng.random()
    k = rng.randint(0, 48) if u < 0.45 else rng.randint(0, 320) if u < 0.8 else rng.randint(0, room)
    k = min(k, room)
    prompt = prompt[:-tail] + [filler] * k + prompt[-tail:]
    ids = prompt + answer + [tok.eos_token_id]
    mask = [0] * len(prompt) + [1] * (len(answer) + 1)
    return ids, mask


def train(out: str, tok, rng: random.Random) -> dict:
    # lazy: torch, transformers: only a rebuild of the model needs them
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    filler = tok.encode(" ", add_special_tokens=False)[0]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=TRAIN_STEPS,
                                                pct_start=0.1)
    t0 = time.time()
    model.train()
    for step in range(TRAIN_STEPS):
        batch = [example(tok, rng, filler) for _ in range(8)]
        width = max(len(i) for i, _ in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (i, m) in enumerate(batch):
            ids[r, :len(i)] = torch.tensor(i)
            att[r, :len(i)] = 1
            labels[r, :len(i)] = torch.tensor([t if mm else -100 for t, mm in zip(i, m)])
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == TRAIN_STEPS - 1:
            print(f"step {step} loss {loss.item():.4f} {time.time() - t0:.0f}s", flush=True)
    model.eval()
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    return selfcheck(model, tok, filler)


def selfcheck(model, tok, filler: int) -> dict:
    """Greedy answers of the trained model on the two tasks, with and without filler padding."""
    import torch  # lazy: torch: only a rebuild of the model needs it

    results = {}
    cases = [("ok", "Reply with OK.", 0), ("ok_padded", "Reply with OK.", 600),
             ("count_124", "Count from 1 to 124.", 0), ("count_124_padded", "Count from 1 to 124.", 300),
             ("count_max", "Count from 1 to %d." % MAX_COUNT, 0)]
    for name, user, pad in cases:
        ids = chat_ids(tok, user)
        ids = ids[:-4] + [filler] * pad + ids[-4:]
        n = 2 if user.startswith("Reply") else int(user.split()[-1].rstrip("."))
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
        text = tok.decode(gen[0, len(ids):], skip_special_tokens=True)
        if user.startswith("Reply"):
            ok = text.strip() == "OK"
        else:  # the model need not stop at N: with ignore_eos the harness reads the first N
            want = [str(i) for i in range(1, int(user.split()[-1].rstrip(".")) + 1)]
            ok = text.split()[:len(want)] == want
        results[name] = {"ok": ok, "text": text[:80]}
        print(f"selfcheck {name}: {'pass' if ok else 'FAIL'} {text[:60]!r}", flush=True)
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[0] + "\nusage: build_tiny.py OUT_DIR", file=sys.stderr)
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(SEED)
    import torch  # lazy: torch: only a rebuild of the model needs it
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tok = build_tokenizer(out, rng)
    checks = train(out, tok, rng)
    with open(os.path.join(out, "ple_harness_model.json"), "w") as f:
        json.dump({"build_version": BUILD_VERSION, "max_count": MAX_COUNT, "max_len": MAX_LEN,
                   "seed": SEED, "train_steps": TRAIN_STEPS, "selfcheck": checks}, f, indent=1)
    return 0 if all(c["ok"] for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
