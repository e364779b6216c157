"""Auto with streaming (the look before the first round, 126b30f) against streaming by hand at 25 Mbit/s, per seed,
from whole sweeps of sync low-bit, streaming_int8 and auto_lowbit_int4_streaming run one seed after another on the
same machine (``r25_<seed>/``). Each run's seconds to the loss come from ``repeats.json`` (``python -m benchmarks
repeats``: sync low-bit's early target, the same rule as BENCHMARKS.md's tables); then the validations at the
same step (35) and the seconds per step between steps 5 and 35, and how far auto trails streaming by hand at step 5.

    python bench_results/ttl_auto_probe_seeds1-6/compare.py [FOLDER]   (default: this folder)
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.report.time_to_loss import TOLERANCE, seconds_to, val_time_points  # noqa: E402

HERE = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
HAND, AUTO = "streaming_int8", "auto_lowbit_int4_streaming"
summary = list(json.load(open(os.path.join(HERE, "repeats.json")))["summary"].values())[0]


def run(seed, config):
    for r in json.load(open(os.path.join(HERE, f"r25_{seed}", "results.json")))["runs"]:
        if r["config"] == config:
            return r
    raise KeyError(config)


def at(r, step):
    return next(c.get("val_train_s") or c["train_s"] for c in r["curve"] if c["step"] == step and c.get("val_loss"))


def first_line(seed):
    log = os.path.join(HERE, f"r25_{seed}", "runs", f"time_to_loss-{AUTO}-25mbit-2h-real", "host0.log")
    return next((line.strip() for line in open(log) if line.startswith("ds_acco auto")), "")


print("| seed | target | s to it: by hand | auto | auto / by hand | s at step 35: by hand | auto | s/step 5-35: by hand"
      " | auto | auto's lag at step 5 | auto's look |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
cols = {k: [] for k in ("sh", "sa", "h35", "a35", "rh", "ra", "lag")}
for seed, target in zip(summary["seeds"], summary["early_target"]):
    reach = target * (1 + TOLERANCE)
    hand, auto = run(seed, HAND), run(seed, AUTO)
    sh, sa = (seconds_to(val_time_points(r), reach) for r in (hand, auto))
    h35, a35 = at(hand, 35), at(auto, 35)
    rh, ra = [(at(r, 35) - at(r, 5)) / 30 for r in (hand, auto)]
    lag = at(auto, 5) - at(hand, 5)
    for k, v in zip(cols, (sh, sa, h35, a35, rh, ra, lag)):
        cols[k].append(v)
    look = first_line(seed)
    where = "before the first round" if "before the first round" in look else look[14:27]
    runs = "streaming" if "runs streaming" in look else "not streaming"
    print(f"| {seed} | {reach:.3f} | {sh:.1f} | {sa:.1f} | {sa / sh:.3f} | {h35:.1f} | {a35:.1f} | {rh:.3f} | {ra:.3f} "
          f"| {lag:.2f} s | {where}: {runs} |")
m = {k: statistics.median(v) for k, v in cols.items()}
print(f"| median | | {m['sh']:.1f} | {m['sa']:.1f} | **{m['sa'] / m['sh']:.3f}** | {m['h35']:.1f} | {m['a35']:.1f} "
      f"| {m['rh']:.3f} | {m['ra']:.3f} | {m['lag']:.2f} s | |")
print(f"\nspread (max - min): by hand {max(cols['sh']) - min(cols['sh']):.1f} s, auto "
      f"{max(cols['sa']) - min(cols['sa']):.1f} s; same step (35): auto/by hand {m['a35'] / m['h35']:.3f} on the medians")
