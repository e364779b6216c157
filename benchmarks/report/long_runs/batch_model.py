"""Auto's price of a batch, checked against what the long runs measured: half-batch sync's tokens to each loss.

Auto prices a candidate's batch with the gradient noise scale it measures
(:func:`ds_acco.rounds.auto.choice.samples_to_loss`): at a fixed learning rate, since auto changes the batch and keeps
the rate. The long runs hold the check: sync low-bit at half the batch and at the bed's batch run the same rounds
but for the batch, so half-batch sync's delay penalty (its tokens to the baseline's loss over sync low-bit's) is
what halving the batch bought, and auto's runs of the same bed logged the noise scale along the run (each choice's
line in ``host0.log``). Each model's prediction of that ratio at a share ``x`` of the budget is its samples to a
loss at the half batch over at the full one, summed over ``[0, x]`` at the noise scale and the rate of each point:

* **fixed rate** (auto's): ``samples_to_loss(B, B_noise, rate, B₀)``;
* **best rate**: McCandlish et al.'s ``B + B_noise``, where each batch runs at the rate best for it (auto's model
  before: it credited a larger commit with more than the runs measured).

No parameter is fitted: the residual says which model holds. Points inside the warm-up are shown, not compared
(there the loss falls too fast for a ratio of tokens to resolve the batch). Why here and not in ds_acco: it reads
benchmark files; ds_acco keeps the model, and docs/long-runs.md shows this check.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from typing import Optional

from ds_acco.rounds.auto.choice import samples_to_loss

from .penalty_model import rate_share

HALF, FULL = "sync_lowbit_half", "sync_lowbit"
"""Whose ratio is the batch's alone: the same rounds at half the batch and at the bed's."""
LINE = re.compile(r"ds_acco auto at step (\d+):.*?gradient noise scale (\d[0-9.e+-]*|inf|nan) micro-batches")
"""A choice's line (:func:`ds_acco.rounds.auto.choice._line`): its commit and the noise scale it priced."""
STEPS = 400
"""Points of the sum over ``[0, x]``."""


def noise_curve(log_path: str, curve: list[dict], budget: Optional[float]) -> list[tuple[float, float]]:
    """``(share of the token budget, noise scale)`` at each of auto's choices in ``log_path``; empty without the log,
    its choices or a budget (``curve``: the run's ``step``/``tokens`` points)."""
    if not budget or not os.path.exists(log_path):
        return []
    tokens = {p["step"]: p["tokens"] for p in curve or [] if p.get("tokens") is not None}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = []
    for m in LINE.finditer(text):
        step, noise = int(m.group(1)), float(m.group(2))
        if step in tokens and math.isfinite(noise):
            out.append((tokens[step] / budget, noise))
    return out


def noise_at(curves: list[list[tuple[float, float]]], share: float) -> Optional[float]:
    """The median over runs of each run's latest noise scale at or before ``share`` (its first before any)."""
    values = []
    for c in curves:
        if c:
            before = [n for x, n in c if x <= share]
            values.append(before[-1] if before else c[0][1])
    return statistics.median(values) if values else None


def predicted(curves: list, x: float, half: float, full: float, warmup: float, fixed_rate: bool) -> Optional[float]:
    """Half-batch samples over full-batch samples to the loss at a share ``x`` of the budget."""
    if x <= 0 or not any(curves):
        return None
    sums = [0.0, 0.0]
    for i in range(STEPS):
        s = (i + 0.5) * x / STEPS
        noise, rate = noise_at(curves, s), rate_share(s, warmup)
        for k, batch in enumerate((half, full)):
            sums[k] += samples_to_loss(batch, noise, rate, full) if fixed_rate and noise > 0 else batch + noise
    return sums[0] / sums[1]


def check(points: list[tuple[float, Optional[float], Optional[float]]], curves: list, half: float, full: float,
          warmup: float) -> Optional[dict]:
    """``points``: ``(checkpoint, sync low-bit's share of the budget to the loss there, half-batch sync's measured
    ratio)``; ``curves``: auto's noise scale along each of its runs of the bed (:func:`noise_curve`); ``half`` and
    ``full``: the two configs' micro-batches per commit. Both models' predictions per checkpoint and their rms
    residuals past the warm-up; None without a curve or a point past it."""
    points = [(c, x, y) for c, x, y in points if x and y]
    if not any(curves) or not any(x > warmup for _, x, _ in points):
        return None
    rows = [{"checkpoint": c, "share": x, "measured": y, "compared": x > warmup,
             "fixed_rate": predicted(curves, x, half, full, warmup, True),
             "best_rate": predicted(curves, x, half, full, warmup, False),
             "noise": noise_at(curves, x)} for c, x, y in points]

    def rms(field: str) -> float:
        errs = [(r[field] - r["measured"]) ** 2 for r in rows if r["compared"]]
        return math.sqrt(sum(errs) / len(errs))

    out = {"rows": rows, "rms_fixed_rate": rms("fixed_rate"), "rms_best_rate": rms("best_rate"), "runs": len(curves),
           "half": half, "full": full}
    out["holds"] = out["rms_fixed_rate"] <= out["rms_best_rate"]
    return out
