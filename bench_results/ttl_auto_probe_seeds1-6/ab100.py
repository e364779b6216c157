"""At 100 Mbit/s, where auto's look before the first round starts nothing: what the probe behind step 1 costs.
auto_lowbit_int4_streaming at 88ed44e (no look; the first round probes at its head) and at 126b30f (the look),
alternating on one machine, seeds 1 and 2 (``ab_old_<seed>``, ``ab_new_<seed>``); seconds to sync low-bit's loss
at 75% of the budget in ``r100_<seed>`` (same seed, same session), the slowest rank's clock at steps 1, 3 and 5.

    python bench_results/ttl_auto_probe_seeds1-6/ab100.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.report.time_to_loss import TOLERANCE, seconds_to, val_time_points  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
targets = list(json.load(open(os.path.join(HERE, "r100", "repeats.json")))["summary"].values())[0]["early_target"]


def only_run(folder):
    return json.load(open(os.path.join(HERE, folder, "results.json")))["runs"][0]


def clock(folder, step):
    run = os.path.join(HERE, folder, "runs", "time_to_loss-auto_lowbit_int4_streaming-100mbit-2h-real", "train.jsonl")
    return next(json.loads(line)["train_s"] for line in open(run) if json.loads(line).get("step") == step)


print("| seed | tree | s to the loss | s at step 1 | step 3 | step 5 |")
print("|---|---|---|---|---|---|")
for seed, target in zip((1, 2), targets):
    for tree, folder in (("88ed44e (no look)", f"ab_old_{seed}"), ("126b30f (look)", f"ab_new_{seed}")):
        s = seconds_to(val_time_points(only_run(folder)), target * (1 + TOLERANCE))
        print(f"| {seed} | {tree} | {s:.1f} | " + " | ".join(f"{clock(folder, k):.2f}" for k in (1, 3, 5)) + " |")
