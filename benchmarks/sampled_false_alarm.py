"""False-alarm rate of the ``sampled`` scenario's two-sample test on a clean engine.

Attaches to a running engine (``--url``), draws ``--blocks`` blocks of ``--samples`` solo samples
(one request in flight) and as many blocks drawn ``--concurrency`` at a time, of one prompt (the
scenario's repeated-pattern distribution prompt, where the ngram proposer drafts), with the
scenario's sampling, and runs :func:`pleharness.twosample.permutation_test` on disjoint pairs
of blocks: every solo block against a load block (the scenario's question) and solo blocks
against each other. Prints the p-values and, per level (0.05, 0.01, 0.001 and the scenario's
per-test threshold alpha / 3), how many tests fell at or below it: a clean engine should show
about level x tests (fewer is fine: the test is exact, never anti-conservative).

    PYTHONPATH=. .venv/bin/python benchmarks/sampled_false_alarm.py --url http://127.0.0.1:8000 \\
        --blocks 10 --samples 32 [--no-truncation]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys

import requests

from pleharness.prompts import seeded_prompts
from pleharness.twosample import permutation_test


def sample(url: str, model: str, body: dict) -> list[int]:
    r = requests.post(url + "/v1/completions", json={"model": model, **body}, timeout=300)
    r.raise_for_status()
    return r.json()["choices"][0]["token_ids"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="ple-tiny-llama")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--positions", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=36, help="B + q on cpu-ngram")
    ap.add_argument("--vocab", type=int, default=793)
    ap.add_argument("--no-truncation", action="store_true", help="temperature only")
    ap.add_argument("--alpha", type=float, default=0.001)
    a = ap.parse_args()
    (pat,) = seeded_prompts(20261202, 1, 8, 8, 16, a.vocab)  # the scenario's pattern prompt
    prompt = (list(pat.ids) * (a.prompt_len // 8 + 1))[:a.prompt_len]
    body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 1.0,
            "ignore_eos": True, "return_token_ids": True}
    if not a.no_truncation:
        body.update(top_p=0.95, top_k=20)
    n = a.blocks * a.samples
    solo = [sample(a.url, a.model, body) for _ in range(n)]
    with cf.ThreadPoolExecutor(a.concurrency) as ex:
        load = list(ex.map(lambda _: sample(a.url, a.model, body), range(n)))
    blocks = lambda xs: [xs[i * a.samples:(i + 1) * a.samples] for i in range(a.blocks)]  # noqa
    sb, lb = blocks(solo), blocks(load)
    vs_load = [permutation_test(s, l, a.positions, 20_000, rng_seed=i).p_value
               for i, (s, l) in enumerate(zip(sb, lb))]
    vs_solo = [permutation_test(sb[i], sb[i + 1], a.positions, 20_000, rng_seed=i).p_value
               for i in range(0, a.blocks - 1, 2)]
    levels = [0.05, 0.01, 0.001, a.alpha / 3]
    out = {"samples_per_block": a.samples, "blocks": a.blocks, "sampling": body,
           "p_solo_vs_load": vs_load, "p_solo_vs_solo": vs_solo,
           "at_or_below": {str(x): {"solo_vs_load": sum(p <= x for p in vs_load),
                                    "solo_vs_solo": sum(p <= x for p in vs_solo)}
                           for x in levels}}
    out["sampling"] = {k: v for k, v in body.items() if k != "prompt"}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
