"""The gradient noise scale, measured from what a round already has: why smaller batches may reach a loss sooner.

``policy: "auto"`` weighs the adaptive policy's smaller commits against the fixed policy's full ones, and batch size
changes how much loss a step buys. The empirical model of McCandlish et al. (2018, "An Empirical Model of Large-Batch
Training") prices a batch ``B`` by ``B_noise = tr(Σ) / |g|²``, the ratio of the per-sample gradient variance to the
squared true gradient: at the rate best for each batch the samples to a loss grow as ``1 + B / B_noise``, and at one
rate for all, as auto runs them, as :func:`ds_acco.rounds.auto.choice.samples_to_loss` says. Seconds to a loss are
then seconds per sample times those samples.

The two figures come from two batch sizes the round already sees: each rank's own accumulator (``b_r`` micro-batches,
its squared norm computed on the communication thread before the reduce-scatter and shared in the count all-gather) and
the reduced mean over all ``B`` micro-batches (its squared norm from the shards, one scalar all-reduce). With
``E|ḡ_b|² = |g|² + tr(Σ)/b``::

    tr(Σ) ≈ (mean_r |ḡ_r|² − |ḡ|²) / (mean_r 1/b_r − 1/B)      |g|² ≈ |ḡ|² − tr(Σ)/B

One round's estimate is noisy (two ranks are two samples), so the numerator and the denominator are averaged separately
over the last rounds, as the paper does. Units are micro-batches: ``B_noise`` is in micro-batches too. Every rank holds
the same gathered and all-reduced values, so every rank computes the same figure.

Noise must not read as a small noise scale. Early in training the per-round ``tr(Σ)`` estimates scatter around a small
mean, and a mean that happens to fall near or below zero would price every smaller batch as free (the estimate clamped
at zero: benchmark logs read 0.0 and 0.05 micro-batches, and auto then preferred the smallest commits whatever they
cost). So the mean ``tr(Σ)`` carries its confidence interval (:data:`Z` standard errors of the window's rounds): where
the interval excludes zero the estimate is used as measured (0.1 micro-batches was measured, and resolved, early in the
benchmark runs); where it does not, ``B_noise`` is not resolved from zero and is priced at the interval's *upper* end,
the largest scale the rounds allow, which credits a smaller batch only with what the measurement supports; and never
below :data:`FLOOR`.
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Sequence

WINDOW = 30
"""Rounds averaged: the noise scale grows as the loss falls, so old rounds are dropped."""
Z = 2.0
"""Standard errors either side of the mean ``tr(Σ)``: about a 95% interval."""
FLOOR = 0.1
"""The smallest ``B_noise`` (micro-batches) an unresolved estimate is priced at: the smallest scale the benchmark
runs resolved. Below it the price of a batch ``B`` of 4-16 micro-batches
(:func:`ds_acco.rounds.auto.choice.samples_to_loss`) is proportional to ``B`` within 3%: pricing the limit per committed
step would choose the same."""


class NoiseScale:
    """Running estimate of ``B_noise`` (micro-batches) from rounds whose mean covers exactly their accumulators."""

    def __init__(self, window: int = WINDOW):
        self._trace: deque = deque(maxlen=window)
        self._signal: deque = deque(maxlen=window)

    def add(self, local_sq: Sequence[float], counts: Sequence[int], global_sq: float) -> None:
        """One round: each rank's squared norm of its accumulated *sum* and its micro-batch count, and the
        squared norm of the reduced *mean* (the same scale: the mean of the sums over all counts)."""
        ranks = [(sq, c) for sq, c in zip(local_sq, counts) if c > 0]
        total = sum(counts)
        if len(ranks) < 2 or total <= 0 or global_sq != global_sq:  # one contributor, or a skipped round
            return
        small = sum(sq / (c * c) for sq, c in ranks) / len(ranks)
        inv_small = sum(1.0 / c for _, c in ranks) / len(ranks)
        inv_big = 1.0 / total
        if inv_small <= inv_big:
            return
        trace = (small - global_sq) / (inv_small - inv_big)
        self._trace.append(trace)
        self._signal.append(global_sq - trace * inv_big)

    def value(self) -> Optional[float]:
        """``B_noise`` in micro-batches, as priced (see the module docstring: the measured estimate where it is
        resolved from zero, else its interval's upper end, at least :data:`FLOOR`); ``inf`` when the true gradient
        is lost in the noise (every batch size buys the same per sample); None before two rounds were measured."""
        summary = self.summary()
        return None if summary is None else summary["value"]

    def summary(self) -> Optional[dict]:
        """The estimate with its confidence: ``value`` (as priced), ``measured`` (the mean's ratio, clamped at
        zero), ``low``/``high`` (the interval's ends, in micro-batches), ``rounds`` and ``resolved`` (the interval
        excludes zero); None before two rounds were measured."""
        n = len(self._trace)
        if n < 2:
            return None
        signal, trace = sum(self._signal) / n, sum(self._trace) / n
        if signal <= 0:
            inf = float("inf")
            return {"value": inf, "measured": inf, "low": inf, "high": inf, "rounds": n, "resolved": True}
        spread = (sum((t - trace) ** 2 for t in self._trace) / (n - 1)) ** 0.5 * Z / n ** 0.5
        low, high = (trace - spread) / signal, (trace + spread) / signal
        measured = max(trace, 0.0) / signal
        resolved = low > 0
        value = measured if resolved else max(high, FLOOR)
        return {"value": value, "measured": measured, "low": max(low, 0.0), "high": max(high, 0.0), "rounds": n,
                "resolved": resolved}
