"""Compute and a link that take the times a test sets, on a simulated clock or on real time.

Why simulated: ``mode: "auto"`` chooses from measured times, and on a busy 2-core machine sleeps
overrun by tens of milliseconds, so a test of its choices either waited out long sleeps with loose
bounds or failed now and then. On :class:`SimClock` (the engine's ``clock=``, :mod:`ds_acco.comm.clock`)
the figures are exact functions of the times the test sets, whatever the load, and nothing sleeps.

The model, per process (one rank): each thread keeps its own time. The training thread advances by the
compute of each micro-batch (:meth:`Bed.compute`); a round starts on the communication thread at its launch
stamp, or when the round before it ended; its first collective (the count all-gather) brings every rank to
the latest rank's time, as a collective makes the faster rank wait for the slower (:meth:`SimBed.on_stage`
all-gathers the ranks' times on the round's own group); its reduce-scatter then takes the link's time; a
thread that waits for a round moves to the round's end. The real work (a tiny model on loopback) takes
real milliseconds that count for nothing.

:class:`WallBed` is the same interface on real time (sleeps), for the one end-to-end test on a real link.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import torch
import torch.distributed as dist

from ds_acco.comm.clock import Clock


class SimClock(Clock):
    """A clock whose every thread keeps its own time, from 0. Kept in whole nanoseconds, so that sums are exact: a
    round of 100 ms ends exactly at the end of two micro-batches of 50 ms, never an ulp before or after (which
    would decide whether a micro-batch more goes into an adaptive round)."""

    simulated = True

    def __init__(self):
        super().__init__()
        self._local = threading.local()

    def _ns(self) -> int:
        return getattr(self._local, "ns", 0)

    def now(self) -> float:
        return self._ns() / 1e9

    def advance(self, seconds: float) -> None:
        self._local.ns = self._ns() + round(seconds * 1e9)

    def waited_for(self, t: float) -> None:
        self._local.ns = max(self._ns(), round(t * 1e9))


class Bed:
    """Compute and a link for one engine: :meth:`compute` on the training thread; ``link``, ``[(from_step,
    seconds per round), ...]``, the seconds a round spends on the wire by the optimizer step at its launch
    (fixed at the launch, so a change of link never races a round in flight).

    Build the engine with ``clock=bed.clock`` and ``on_stage=bed.on_stage``, then :meth:`attach` it."""

    clock: Optional[Clock] = None

    def __init__(self, link=()):
        self.link = list(link)
        self.engine = None
        self._link_at: dict[int, float] = {}

    def attach(self, engine) -> None:
        """Note each round's link seconds as it is launched (``engine.submit``: every round goes through it)."""
        self.engine, submit = engine, engine.submit

        def launch(kind, run):
            self._link_at[engine._round_index] = [s for start, s in [(0, 0.0), *self.link]
                                                  if engine.commits >= start][-1]
            return submit(kind, run)

        engine.submit = launch

    def link_of(self, index: int) -> float:
        return self._link_at.get(index, 0.0)

    def compute(self, seconds: float) -> None:
        raise NotImplementedError

    def on_stage(self, index: int, stage: str) -> None:
        raise NotImplementedError


class SimBed(Bed):
    """On :class:`SimClock`: nothing sleeps, every figure is exact."""

    def __init__(self, link=()):
        super().__init__(link)
        self.clock = SimClock()

    def compute(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def on_stage(self, index: int, stage: str) -> None:
        if stage == "count all-gather":  # where a round waits for the slowest rank's launch
            self.clock.waited_for(max(self.ranks_now()))
        elif stage == "reduce-scatter":
            self.clock.advance(self.link_of(index))

    def ranks_now(self) -> list[float]:
        """Every rank's time on this thread, on the round's own group (a round's stage comes on every rank)."""
        coll = self.engine.coll
        mine = torch.tensor([self.clock.now()], dtype=torch.float64, device=self.engine.device)
        every = [torch.empty_like(mine) for _ in range(coll.world_size)]
        dist.all_gather(every, mine, group=coll.group)
        return [float(t) for t in every]


class WallBed(Bed):
    """On real time: compute is a sleep on the training thread, the link a sleep on the communication thread as
    the round enters its reduce-scatter."""

    def compute(self, seconds: float) -> None:
        time.sleep(seconds)

    def on_stage(self, index: int, stage: str) -> None:
        if stage == "reduce-scatter" and self.link_of(index):
            time.sleep(self.link_of(index))


def link(clock: SimClock, rate: float, fixed: float):
    """One piece of a collective on a link of ``rate`` bytes/s whose every piece also waits ``fixed`` seconds,
    on ``clock``: what :meth:`ds_acco.comm.link_pacing.LinkPacer.probe` calls for a piece."""
    return lambda start, n: clock.advance(fixed + n / rate)
