"""The clock that rounds, swaps and ``mode: "auto"``'s figures are stamped with.

Why an option: auto's choices are functions of measured times (compute per micro-batch, a round on the
wire, a step), and an engine built with another clock measures those on it. A simulator or a test passes a
clock whose time it advances, so that the figures are exact and the choices the same on a busy machine as on
an idle one. What bounds or measures the real world stays on real time whatever the clock: round time-outs,
link pacing and the probe (:mod:`ds_acco.comm.link_pacing`), checkpoint timings, the cost of auto's switch.

A clock is any object with ``now()`` (seconds, as the calling thread sees them) and ``waited_for(t)`` (the
calling thread has waited for something stamped ``t`` on this clock: the launch of the round it now runs,
the end of the round it waited for). On the wall clock waiting is time passing, so ``waited_for`` does
nothing; a simulated clock, whose threads each keep their own time, moves the caller's time to ``t`` when
it is behind. Its ``simulated`` is then True: a round's end is a stamp, and whether a round has ended is
whether the asking thread's time has reached it (:meth:`ds_acco.comm.comm_thread.RoundHandle.done`).
"""

from __future__ import annotations

import time
from typing import Callable, Union


class Clock:
    """Time read from ``read`` (default ``time.perf_counter``): the wall clock, where waiting is time passing."""

    simulated = False

    def __init__(self, read: Callable[[], float] = time.perf_counter):
        self._read = read

    def now(self) -> float:
        return self._read()

    def waited_for(self, t: float) -> None:
        """Nothing to do on a clock that passes while a thread waits."""


WALL = Clock()

ClockLike = Union[Clock, Callable[[], float]]
"""What an engine's ``clock=`` takes: a clock object (``now`` and ``waited_for``) or a function returning seconds."""


def as_clock(clock: ClockLike = None) -> Clock:
    """``clock`` as an object with ``now`` and ``waited_for`` (None or ``time.perf_counter``: the wall clock)."""
    if clock is None or clock is time.perf_counter:
        return WALL
    if callable(getattr(clock, "now", None)) and callable(getattr(clock, "waited_for", None)):
        return clock
    if callable(clock):
        return Clock(clock)
    raise TypeError(f"clock: got {clock!r}; expected a function returning seconds, or an object with now() and "
                    "waited_for(t)")
