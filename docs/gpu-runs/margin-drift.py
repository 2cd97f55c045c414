#!/usr/bin/env python3
"""How far two configurations' top-1/top-2 margins differ before their answers split, from a kept
run folder (manifest.json with requests.jsonl beside it): for every solo answer under test that
differs from its control's (records with ``control_answer``), the largest |margin under test -
control margin| at the positions before the split, and the control's margin at the split.

Evidence for the differential's cross-configuration envelope (pleharness/differential.py,
``cross_envelope``), which the harness measures on the requests both configurations answered
alike; a run kept before that measurement existed (GPU run u) still shows the scale on the
requests that split. Usage: ``margin-drift.py RUN_DIR [RUN_DIR ...]``."""
import gzip
import json
import sys
from pathlib import Path


def records(run: Path):
    f = run / "requests.jsonl"
    opener = (lambda: gzip.open(f.with_suffix(".jsonl.gz"), "rt")) if not f.exists() else \
        (lambda: open(f))
    with opener() as fh:
        for line in fh:
            yield json.loads(line)


def main() -> int:
    for arg in sys.argv[1:]:
        run = Path(arg)
        m = json.loads((run / "manifest.json").read_text())
        refs = {(r["prompt_hash"], r["max_tokens"]): r for r in m["references"]
                if r.get("source") == "solo"}
        pre_all, rows = [], []
        for q in records(run):
            ca, d = q.get("control_answer"), q.get("differential")
            if not ca or not d:
                continue
            ref = refs.get((q["prompt_hash"], q["max_tokens"]))
            tm, cm, pos = (ref or {}).get("margins"), ca.get("margins"), d["position"]
            pre = [abs(a - b) for a, b in zip((tm or [])[:pos], (cm or [])[:pos])
                   if a is not None and b is not None]
            pre_all += pre
            rows.append((q["id"], pos, d.get("margin_nats"), max(pre) if pre else None))
        print(f"{run}: {len(rows)} answer(s) differ from the control's; margin difference before "
              f"the split: largest {max(pre_all) if pre_all else None} nats over {len(pre_all)} "
              "positions")
        for rid, pos, margin, pre in sorted(rows, key=lambda x: -(x[2] or 0)):
            print(f"  {rid}: split at {pos}, control margin {margin} nats, margins apart before "
                  f"it by up to {pre} nats")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
