"""Where the time to the loss at 25 Mbit/s comes from, per seed: the validation losses around the target
(sync low-bit's early target, as in step1/repeats_r25_six_seeds.json; a run reaches it at the interpolated
time its validation loss, every 5 steps, first falls to target x 1.001), with their times (the slowest
rank's clock). Streaming by hand: step2/r25_<seed> (seeds 1-4), step1/r25_<seed> (5-6); auto with
streaming: step1/r25_<seed>. Then each run's seconds per step between the validations at steps 5 and 35,
and how far auto trails streaming by hand at those two validations.

    python bench_results/ttl_auto_first_choice_seeds1-6/crossing.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.report.time_to_loss import TOLERANCE, seconds_to, val_time_points  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
summary = list(json.load(open(os.path.join(HERE, "step1", "repeats_r25_six_seeds.json")))["summary"].values())[0]


def run(folder, config):
    for r in json.load(open(os.path.join(HERE, folder, "results.json")))["runs"]:
        if r["config"] == config:
            return r
    raise KeyError(config)


def around(r, target):
    """The validations just before and at the crossing: (step, seconds, loss)."""
    pts = [(c["step"], c.get("val_train_s") or c["train_s"], c["val_loss"]) for c in r["curve"]
           if c.get("val_loss") is not None]
    i = next((k for k, p in enumerate(pts) if p[2] <= target), len(pts))
    return pts[max(0, i - 1):i + 1]


def fmt(pts):
    return "; ".join(f"step {s}: {v:.3f} at {t:.1f} s" for s, t, v in pts)


print("| seed | target | streaming by hand: validations around it | s | auto with streaming | s |")
print("|---|---|---|---|---|---|")
for seed, target in zip(summary["seeds"], summary["early_target"]):
    reach = target * (1 + TOLERANCE)
    hand = run(f"step2/r25_{seed}" if seed <= 4 else f"step1/r25_{seed}", "streaming_int8")
    auto = run(f"step1/r25_{seed}", "auto_lowbit_int4_streaming")
    sh, sa = (seconds_to(val_time_points(r), reach) for r in (hand, auto))
    print(f"| {seed} | {reach:.3f} | {fmt(around(hand, reach))} | {sh:.1f} | {fmt(around(auto, reach))} | {sa:.1f} |")


def at(r, step):
    return next(c.get("val_train_s") or c["train_s"] for c in r["curve"] if c["step"] == step and c.get("val_loss"))


print()
print("| seed | s/step 5-35, by hand | s/step 5-35, auto | auto's lag at step 5 | at step 35 |")
print("|---|---|---|---|---|")
rates, lags = [], []
for seed in summary["seeds"]:
    hand = run(f"step2/r25_{seed}" if seed <= 4 else f"step1/r25_{seed}", "streaming_int8")
    auto = run(f"step1/r25_{seed}", "auto_lowbit_int4_streaming")
    h, a = [(at(r, 35) - at(r, 5)) / 30 for r in (hand, auto)]
    rates.append((h, a))
    lags.append(at(auto, 5) - at(hand, 5))
    print(f"| {seed} | {h:.3f} | {a:.3f} | {lags[-1]:.2f} s | {at(auto, 35) - at(hand, 35):.2f} s |")
med = lambda xs: sorted(xs)[len(xs) // 2] if len(xs) % 2 else sum(sorted(xs)[len(xs) // 2 - 1:len(xs) // 2 + 1]) / 2
print(f"| median | {med([h for h, _ in rates]):.3f} | {med([a for _, a in rates]):.3f} | {med(lags):.2f} s | |")
