import json, sys
from pathlib import Path
def refs(p):
    m = json.loads(Path(p).read_text())
    return {(r["prompt_hash"], r["max_tokens"]): r for r in m.get("references", []) if r.get("source") == "solo"}
for run in sys.argv[1:]:
    t, c = refs(f"{run}/manifest.json"), refs(f"{run}/control-manifest.json")
    pairs = []
    for k, rt in t.items():
        rc = c.get(k)
        if not rc or rt.get("output_hash") != rc.get("output_hash"): continue
        for a, b in zip(rt.get("margins") or [], rc.get("margins") or []):
            if a is not None and b is not None: pairs.append((b, abs(a - b)))
    print(run, len(pairs), "positions")
    for lo, hi in ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 99)):
        ds = sorted(d for m, d in pairs if lo <= m < hi)
        if ds:
            q = lambda f: ds[min(len(ds) - 1, int(f * len(ds)))]
            print(f"  control margin {lo:>2}-{hi:<2}: n={len(ds):5d} median {q(.5):.3f} p99 {q(.99):.3f} max {ds[-1]:.3f}")
