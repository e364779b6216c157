"""Auto's model of ACCO's delay penalty, checked against the long runs' measured penalty.

Auto charges acco ``acco.auto.acco_step_penalty`` (``p``) times the learning rate over its peak so far
(:meth:`ds_acco.rounds.auto.mode.AutoMode.penalty`): the one-step delay costs in proportion to the step. A long
run measures the penalty cumulatively: acco fixed's tokens to the fair baseline's loss at a point of the run over
sync low-bit's tokens to it (:mod:`benchmarks.report.long_runs.summary`). If each token costs acco ``1 + p f(s)`` tokens
of sync's progress, ``f`` the rate's share of its peak at ``s``, then to the loss sync low-bit reaches after a
share ``x`` of the budget

    penalty(x) = 1 + p * mean(f over [0, x])

which falls as the rate decays. The constant model (``f = 1``: the penalty stays ``1 + p``) is the alternative.
Both are fitted to the measured medians by least squares (one parameter each); the residuals say which holds, the
fitted ``p`` what ``acco_step_penalty`` should be on this bed, the preset's ``p`` what auto assumed. Points inside
the rate's warm-up are shown, not fitted: there the loss falls fastest, so any delay costs most (the real bed's
first measured: ACCO about half again sync's tokens), and auto decides after it, at the rates the fit covers.

Why here and not in ds_acco: the fit reads benchmark files; ds_acco keeps the model itself, and the docs say
what the fit found (docs/long-runs.md).
"""

from __future__ import annotations

import math
from typing import Optional

WHO = "acco_lowbit_int4_fixed"
"""Whose penalty is the delay's alone: acco at sync's batch (adaptive's also holds its smaller commits)."""
STEPS = 2000
"""Points of the numeric mean of ``f`` (the schedule is piecewise linear: exact enough)."""


def rate_share(s: float, warmup: float) -> float:
    """``f(s)``: WarmupDecayLR's rate over its peak so far at a share ``s`` of the budget (1 while it climbs)."""
    if s <= warmup:
        return 1.0
    return max(0.0, (1.0 - s) / (1.0 - warmup)) if warmup < 1 else 0.0


def mean_share(x: float, warmup: float) -> float:
    """The mean of :func:`rate_share` over ``[0, x]`` (midpoint rule)."""
    if x <= 0:
        return 1.0
    n = max(1, int(STEPS * min(x, 1.0)))
    return sum(rate_share((i + 0.5) * x / n, warmup) for i in range(n)) / n


def _fit(xs: list[float], ys: list[float]) -> tuple[Optional[float], Optional[float]]:
    """Least squares of ``y = p x`` through the origin: ``p`` and the root-mean-square residual."""
    den = sum(x * x for x in xs)
    if not xs or den == 0:
        return None, None
    p = sum(x * y for x, y in zip(xs, ys)) / den
    return p, math.sqrt(sum((y - p * x) ** 2 for x, y in zip(xs, ys)) / len(xs))


def check(points: list[tuple[float, float, float]], warmup: float, preset: float) -> Optional[dict]:
    """``points``: ``(checkpoint, sync low-bit's share of the budget to the loss there, measured penalty)``.

    Returns both models' fitted ``p`` and residual (over the points past ``warmup``, the warm-up's share of the
    budget), and per checkpoint the measured penalty beside each model's and the preset's (``preset``: the shipped
    ``acco_step_penalty``, lr-scaled as auto applies it); None without a point past the warm-up.
    """
    points = [(c, x, y) for c, x, y in points if x is not None and y is not None and x > 0]
    fitted = [(x, y) for _, x, y in points if x > warmup]
    if not fitted:
        return None
    excess = [y - 1.0 for _, y in fitted]
    p_lr, rms_lr = _fit([mean_share(x, warmup) for x, _ in fitted], excess)
    p_const, rms_const = _fit([1.0] * len(fitted), excess)
    rows = [{"checkpoint": c, "share": x, "measured": y, "fitted": x > warmup,
             "rate_scaled": 1 + p_lr * mean_share(x, warmup), "constant": 1 + p_const,
             "preset": 1 + preset * mean_share(x, warmup)} for c, x, y in points]
    return {"p_rate_scaled": p_lr, "rms_rate_scaled": rms_lr, "p_constant": p_const, "rms_constant": rms_const,
            "preset": preset, "warmup": warmup, "rows": rows,
            "holds": None if rms_lr is None or rms_const is None else rms_lr <= rms_const}
