"""Golden-reference worker: greedy continuations and teacher-forced logprobs with transformers.

Run by a Python that has torch and transformers (the engine's, for a vLLM installation)::

    python .../pleharness/golden/worker.py MODEL_DIR

It loads MODEL_DIR with ``AutoModelForCausalLM`` in float32 on the CPU and answers one JSON
request per line on stdin with one JSON line on stdout (protocol: :mod:`pleharness.golden`):

- ``{"op": "generate", "prompt": [ids], "max_tokens": n, "top_k": k}`` -> ``{"ids": [n ids],
  "top": [[[id, logprob], ...k, sorted], ... per position]}``: greedy decoding (argmax over the full
  vocabulary at every step, EOS included and ignored, like vLLM's ``temperature=0`` with
  ``ignore_eos``), logprobs = log_softmax of the float32 logits (nats).
- ``{"op": "score", "prompt": [ids], "prefix": [ids], "tokens": [ids], "top_k": k}`` ->
  ``{"logprobs": {id: logprob}, "top": [[id, logprob], ...]}``: teacher forcing: the distribution
  of the next token after prompt + prefix.
- ``{"op": "force", "prompt": [ids], "tokens": [ids]}`` -> ``{"forced": [[lp of tokens[i], top-1
  id, lp of top-1], ... per token]}``: a whole continuation teacher-forced in one pass (the
  half-precision noise floor, :func:`pleharness.divergence.noise_floor`).

The approach follows vLLM's own model tests (tests/models/utils.py ``check_outputs_equal`` /
``check_logprobs_close``: transformers as the independent implementation, greedy, top-k logprobs).
Errors are answered as ``{"error": "..."}``; the worker exits at end of input.
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python worker.py MODEL_DIR", file=sys.stderr)
        return 2
    # lazy: torch, transformers: only the golden model's worker process loads them
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(argv[1], torch_dtype=torch.float32)
    model.eval()
    out = sys.stdout
    out.write(json.dumps({"ready": True, "vocab_size": int(model.config.vocab_size),
                          "torch": torch.__version__}) + "\n")
    out.flush()

    def top(logits, k):
        lp = torch.log_softmax(logits.float(), dim=-1)
        v, i = torch.topk(lp, min(k, lp.shape[-1]))
        return lp, [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            k = int(req.get("top_k", 5))
            if req["op"] == "generate":
                ids = torch.tensor([req["prompt"]], dtype=torch.long)
                res = model(input_ids=ids, use_cache=True)
                past, logits = res.past_key_values, res.logits[0, -1]
                gen, tops = [], []
                for _ in range(int(req["max_tokens"])):
                    _, t = top(logits, k)
                    nxt = int(torch.argmax(logits).item())
                    gen.append(nxt)
                    tops.append(t)
                    if len(gen) == int(req["max_tokens"]):
                        break
                    res = model(input_ids=torch.tensor([[nxt]]), past_key_values=past,
                                use_cache=True)
                    past, logits = res.past_key_values, res.logits[0, -1]
                ans = {"ids": gen, "top": tops}
            elif req["op"] == "score":
                ids = torch.tensor([list(req["prompt"]) + list(req["prefix"])], dtype=torch.long)
                lp, t = top(model(input_ids=ids).logits[0, -1], k)
                ans = {"logprobs": {str(int(x)): float(lp[int(x)]) for x in req["tokens"]
                                    if 0 <= int(x) < lp.shape[-1]}, "top": t}
            elif req["op"] == "force":
                prompt, cont = list(req["prompt"]), list(req["tokens"])
                ids = torch.tensor([prompt + cont], dtype=torch.long)
                lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                rows = lp[len(prompt) - 1: len(prompt) - 1 + len(cont)]
                best = torch.max(rows, dim=-1)
                ans = {"forced": [[float(rows[i, t]), int(best.indices[i]), float(best.values[i])]
                                  for i, t in enumerate(cont)]}
            else:
                ans = {"error": f"unknown op {req.get('op')!r}"}
        except Exception as exc:  # noqa: BLE001 - answered, the worker keeps serving
            ans = {"error": f"{exc.__class__.__name__}: {exc}"}
        out.write(json.dumps(ans) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
