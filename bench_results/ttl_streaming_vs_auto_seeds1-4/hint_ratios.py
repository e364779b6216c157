"""Auto's streaming ratio for each choice line in auto_log_lines.txt: the score of the mode it ran (seconds to a loss,
priced as in ds_acco.rounds.auto_mode.choose) over a step's bare compute priced for a full batch (G = 4, N = 2).
Lines printed before the ratio joined the figures, so it is recomputed from the printed numbers.

    python bench_results/ttl_streaming_vs_auto_seeds1-4/hint_ratios.py
"""
import os
import re

FULL, G = 8.0, 4
ratios = {}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "auto_log_lines.txt")) as f:
    for line in f:
        bed, line = line.split(": ", 1)
        c = float(re.search(r"compute ([\d.]+) ms per micro-batch", line).group(1))
        runs = re.search(r": runs ([a-z ]+?)( \(was|;|$)", line.strip()).group(1)
        noise = float(re.search(r"gradient noise scale ([\d.e+-]+) micro", line).group(1))
        score = float(re.search(rf"{runs} ([\d.]+) micro-batches per step: ([\d.]+) ms", line).group(2))
        bare = G * c * (1 + FULL / noise if noise > 0 else 1.0)
        ratios.setdefault(bed.split("_")[0], []).append(score / bare)
for bed, rs in ratios.items():
    print(f"{bed}: {len(rs)} lines, ratio {min(rs):.2f}-{max(rs):.2f}:", " ".join(f"{r:.2f}" for r in sorted(rs)))
