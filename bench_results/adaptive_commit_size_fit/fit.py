"""Micro-batches an adaptive round commits per worker against the round's length in micro-batches (x).

Reads the per-round telemetry (telemetry.jsonl.rank*) of acco adaptive runs: record X's compute_s is
the time from swap X-1 to swap X, while round X was in flight; what the rank computed then is its
count in record X+1. x = round X's wire time (round_s less its count all-gather) over the median
compute per micro-batch with a round in flight. Prints, per run, rank and round kind, the mean count
against x + 0.5 (ds_acco.rounds.auto_mode.LANDING) and against rounding x up.

    python bench_results/adaptive_commit_size_fit/fit.py bench_results/adaptive_commit_size_fit/*/
"""
import glob
import json
import math
import os
import statistics as st
import sys

for run in sys.argv[1:]:
    for path in sorted(glob.glob(os.path.join(run, "telemetry.jsonl.rank*"))):
        rank = int(path.rsplit("rank", 1)[1])
        recs = [json.loads(line) for line in open(path)]
        rows = {}
        for a, b in zip(recs, recs[1:]):
            if a["mode"] != "acco" or b["mode"] != "acco" or a["index"] < 6:  # past the first acco rounds
                continue
            n = b["counts"][rank]
            wire = a["round_s"] - a["stage_s"].get("count all-gather", 0.0)
            rows.setdefault(a["kind"], []).append((n, wire, a["compute_s"] / n))
        for kind, v in sorted(rows.items()):
            n = st.mean(r[0] for r in v)
            x = st.median(r[1] for r in v) / st.median(r[2] for r in v)
            print(f"{os.path.basename(os.path.normpath(run))} rank {rank} {kind:8s} rounds {len(v):3d}  x {x:4.2f}  "
                  f"committed {n:4.2f}  x+0.5 {x + 0.5:4.2f}  ceil {math.ceil(x)}")
