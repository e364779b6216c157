"""``mode: "auto"``: run ``sync`` or ``acco``, whichever the measurements say reaches a loss sooner.

Why a model of the step, not a trial of each mode: a few steps' loss says nothing about
which mode trains faster, but the time a step takes is measured exactly, and the two
modes' step times follow from the same two figures. With ``c`` the compute of one
micro-batch (the slowest worker's), ``R`` the time of one round on the wire and ``G``
micro-batches per worker per step:

* ``sync`` computes, then communicates: ``G·c + R`` per step;
* ``acco`` (fixed policy) overlaps two rounds of ``G/2`` micro-batches with their
  communication: ``2·max(G/2·c', R)``, where ``c' = k·c`` is the compute of a micro-batch
  while a round is in flight (the communication thread shares the core on a CPU; ``k`` is
  measured once ``acco`` has run, 1 before);
* ``acco`` (adaptive policy) ends a round when its communication ends, every worker
  contributing what it computed meanwhile: ``2·T`` per ``2·Σ T/c'_r`` micro-batches with
  ``T = max(R, max_r c'_r)``, scaled to ``G`` micro-batches per worker.

The running mode's step is *measured* (wall time between two commits, per ``G·N``
micro-batches committed); only the other mode's is predicted, with the round time scaled by
the *wire factor*: in ``acco`` a round shares the core with compute (its CPU work, ds_acco's
quantisation and sums and the network stack's, competes with the training thread) and takes
longer than the same round in ``sync`` (1.55x on a one-core host at 100 Mbit/s), which the
factor measures across the first switch (1 before). ``acco`` is charged
``auto.acco_step_penalty`` for the extra steps its one-step delay costs to reach the same
loss, and a switch needs a gain of ``auto.switch_margin``. Every rank reports its figures
in the all-gather each round already makes (:mod:`ds_acco.rounds.round_work`), so every
rank computes the same choice from the same integers: no extra collective, no rank that
disagrees. When ``R`` exceeds the whole compute of a step, ``acco`` cannot hide it and
``sync`` wins; when ``R`` is tiny, hiding it is not worth the penalty; between the two,
``acco`` wins.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence

from ds_acco.config import AccoConfig

logger = logging.getLogger("ds_acco")

SYNC, ACCO = "sync", "acco"
FIGURES = 5
"""Integers each rank adds to a round's all-gather: µs per micro-batch without and with a round in
flight, µs per round on the wire in the running mode, µs per nominal step measured in the running mode,
and the wire factor in thousandths (0: not measured yet)."""
_WINDOW = 3  # medians of the last few samples: one slow step (a checkpoint, a GC pause) does not decide


@dataclass
class Choice:
    mode: str
    figures: dict
    line: str


class StepTimer:
    """This rank's figures, fed by the engine at every swap (training thread only)."""

    def __init__(self, G: int, world_size: int):
        self.per_step = G * world_size
        self.compute = {SYNC: deque(maxlen=_WINDOW), ACCO: deque(maxlen=_WINDOW)}
        self.rounds: deque = deque(maxlen=_WINDOW)
        self.steps: deque = deque(maxlen=_WINDOW)
        self.wire_factor = 0.0
        """A round's wire time in ``acco`` over ``sync`` (0: not measured): on a CPU the round shares the
        core with compute in ``acco`` and has it to itself in ``sync`` (1.55x on the real-compute bed at
        100 Mbit/s), so the other mode's round time is the running one's scaled by it. Measured across a
        switch (the old mode's last window against the new mode's first), then kept: a link that changes
        later moves both modes' rounds alike."""
        self._across: Optional[float] = None
        """The old mode's median round just before a switch, until the new mode's first window fills."""
        self._mode = SYNC
        self._mb_since_swap = 0
        self._skip = 1  # the first interval holds start-up (first forward, allocations)
        self._last_commit: Optional[tuple[float, int]] = None

    def micro_batch(self) -> None:
        self._mb_since_swap += 1

    def enter(self, mode: str) -> None:
        """A new mode runs from now: its round and step figures start afresh (not its compute)."""
        if self.rounds and mode != self._mode:
            self._across = statistics.median(self.rounds)
        self._mode = mode
        self.rounds.clear()
        self.steps.clear()
        self._skip = 1
        self._last_commit = None

    def swap(self, *, compute_s: float, round_s: float, committed: Optional[int], now: float) -> None:
        """One swap: ``compute_s`` since the previous swap; ``committed`` is the total of micro-batches
        committed so far when this swap was a commit (None for an estimate)."""
        mbs, self._mb_since_swap = self._mb_since_swap, 0
        if self._skip:
            self._skip -= 1
        else:
            if mbs:
                self.compute[self._mode].append(compute_s / mbs)
            self.rounds.append(round_s)
            if self._across is not None and len(self.rounds) == _WINDOW:
                before, now_s = self._across, statistics.median(self.rounds)
                if before > 0 and now_s > 0:
                    self.wire_factor = now_s / before if self._mode == ACCO else before / now_s
                self._across = None
        if committed is None:
            return
        if self._last_commit is not None:
            t, done = self._last_commit
            if committed > done:
                self.steps.append((now - t) * self.per_step / (committed - done))
        self._last_commit = (now, committed)

    def local(self) -> list[int]:
        def us(xs) -> int:
            return int(round(statistics.median(xs) * 1e6)) if xs else 0
        return [us(self.compute[SYNC]), us(self.compute[ACCO]), us(self.rounds), us(self.steps),
                int(round(self.wire_factor * 1000))]


def choose(figures: Sequence[Sequence[int]], current: str, config: AccoConfig, G: int, step: int) -> Optional[Choice]:
    """The mode to run from ``figures`` (one row of :data:`FIGURES` per rank); None while they do not suffice."""
    N = len(figures)
    c_sync = [r[0] or r[1] for r in figures]  # a job resumed in acco has no sync figure: its acco one bounds it
    c_acco = [r[1] or r[0] * _interference(figures) for r in figures]
    R = max(r[2] for r in figures) / 1e6  # in the running mode
    measured = max(r[3] for r in figures) / 1e6
    wire = max((r[4] for r in figures if len(r) > 4), default=0) / 1e3 or 1.0
    if min(c_sync) <= 0 or measured <= 0:
        return None
    c_sync_s = [c / 1e6 for c in c_sync]
    c_acco_s = [c / 1e6 for c in c_acco]
    auto = config.auto
    if current == SYNC:
        sync_s, acco_s = measured, _predict_acco(c_acco_s, R * wire, G, config)
    else:
        sync_s, acco_s = G * max(c_sync_s) + R / wire, measured
    charged = acco_s * (1.0 + auto.acco_step_penalty)
    if current == SYNC:
        mode = ACCO if charged < sync_s * (1.0 - auto.switch_margin) else SYNC
    else:
        mode = SYNC if sync_s < charged * (1.0 - auto.switch_margin) else ACCO
    k = max(c_acco_s) / max(c_sync_s)
    figs = {"step": step, "compute_ms": 1e3 * max(c_sync_s), "in_flight_factor": k, "round_ms": 1e3 * R,
            "wire_factor": wire,
            "sync_step_ms": 1e3 * sync_s, "acco_step_ms": 1e3 * acco_s, "acco_charged_ms": 1e3 * charged,
            "was": current, "runs": mode, "world_size": N}
    sync_how, acco_how = ("measured", "predicted") if current == SYNC else ("predicted", "measured")
    line = (f"ds_acco auto at step {step}: compute {figs['compute_ms']:.1f} ms per micro-batch (x{k:.2f} with a "
            f"round in flight), round {figs['round_ms']:.1f} ms in {current} "
            f"({f'x{wire:.2f} in acco' if current == SYNC else f'x{1 / wire:.2f} in sync'}); "
            f"per step of {G} micro-batches: sync "
            f"{figs['sync_step_ms']:.1f} ms ({sync_how}), acco {config.policy} {figs['acco_step_ms']:.1f} ms "
            f"({acco_how}; {charged * 1e3:.1f} ms with the {auto.acco_step_penalty:.0%} delay penalty): runs {mode}"
            + ("" if mode == current else f" (was {current})"))
    return Choice(mode, figs, line)


def _interference(figures: Sequence[Sequence[int]]) -> float:
    """``k``: compute per micro-batch with a round in flight over without, from ranks that measured both."""
    ratios = [r[1] / r[0] for r in figures if r[0] > 0 and r[1] > 0]
    return max(ratios) if ratios else 1.0


def _predict_acco(c: Sequence[float], R: float, G: int, config: AccoConfig) -> float:
    if config.policy == "fixed":
        return 2.0 * max(G / 2 * max(c), R)
    T = max(R, max(c))
    cap = config.max_micro_batches_per_round
    counts = [min(max(1.0, T / ci), cap or float("inf")) for ci in c]
    T = max(R, max(n * ci for n, ci in zip(counts, c)))
    return 2.0 * T * (G * len(c)) / (2.0 * sum(counts))


class AutoMode:
    """The engine's side of ``mode: "auto"``: its timer, when a choice is due, and the choices made."""

    def __init__(self, config: AccoConfig, G: int, world_size: int, rank: int):
        self.config, self.G, self.rank = config, G, rank
        self.timer = StepTimer(G, world_size)
        self.first = max(config.warmup_steps, config.auto.measure_steps)
        self.choices: list[dict] = []
        """Every choice's figures, in order (for telemetry, tests and benchmarks)."""

    def due(self, step: int) -> bool:
        """Whether the step that ends with commit ``step`` is one where the mode is chosen."""
        return step >= self.first and (step - self.first) % self.config.auto.check_every == 0

    def decide(self, figures: Optional[list], current: str, step: int) -> str:
        """The mode to run after ``step`` (``current`` while the figures do not suffice); logs the figures."""
        choice = choose(figures, current, self.config, self.G, step) if figures else None
        if choice is None:
            return current
        self.choices.append(choice.figures)
        if self.rank == 0:
            logger.info(choice.line)
        if choice.mode != current:
            self.timer.enter(choice.mode)
        return choice.mode
