"""Waiting for a quiet machine before a measured run, and noticing when it was not quiet during one.

Why: this machine is shared and small; a run measured while another process takes a core says
nothing about ACCO. The 1-minute load average still counts a benchmark run that just ended for a
minute afterwards, so the gate also samples who is runnable right now, leaving out our own runs.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from benchmarks.cluster.cpu_probe import probe_ms


def loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg", encoding="ascii") as f:
        a, b, c = f.read().split()[:3]
    return float(a), float(b), float(c)


def foreign_runnable(sample_s: float = 2.0, interval_s: float = 0.1, exclude_tree: Optional[int] = None) -> float:
    """Mean number of runnable processes over ``sample_s`` that are not this process (or its run).

    The 1-minute load average still counts a benchmark run that just ended for a
    minute afterwards; this says whether *someone else* is using the CPUs right now.
    ``exclude_tree``: a launcher pid whose hosts (each in a session of its own, led by
    a child of the launcher) are ours too.
    """
    me = os.getpid()
    ours = {me}
    if exclude_tree is not None:
        ours.add(exclude_tree)
    n, total = 0, 0
    deadline = time.monotonic() + sample_s
    while time.monotonic() < deadline:
        running = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in ours:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if stat[0] != b"R":
                continue
            if exclude_tree is not None and _is_ours(int(pid), ours, stat):
                continue
            running += 1
        total += running
        n += 1
        time.sleep(interval_s)
    return max(0.0, total / max(n, 1))


def _is_ours(pid: int, ours: set, stat: list) -> bool:
    """True when ``pid`` descends from a pid in ``ours`` (walks parent links; sessions of the hosts)."""
    seen = 0
    ppid = int(stat[1])
    while ppid > 1 and seen < 32:
        if ppid in ours:
            return True
        try:
            with open(f"/proc/{ppid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


class LoadGate:
    """Waits before each run until the machine is quiet, within an overall waiting budget; then times
    :func:`benchmarks.cluster.cpu_probe.probe_ms` (how fast this machine is, for the reports to compare).

    Quiet: the 1-minute load average is below ``max_load``, or (our own just-finished
    run still weighs on the average) fewer than 0.5 foreign threads are runnable.
    """

    def __init__(self, max_load: Optional[float], budget_s: float = 1200.0, poll_s: float = 30.0, log=print):
        self.max_load, self.budget_s, self.poll_s, self.log = max_load, budget_s, poll_s, log
        self.waited_s = 0.0

    def wait(self) -> dict:
        start = time.monotonic()
        if self.max_load is None:  # not gating: just record the load
            return {"loadavg": list(loadavg()), "foreign_runnable": None, "quiet": None, "waited_s": 0.0,
                    "cpu_probe_ms": probe_ms()}
        while True:
            load = loadavg()
            foreign = foreign_runnable()
            quiet = self.max_load is None or load[0] < self.max_load or foreign < 0.5
            spent = self.waited_s + (time.monotonic() - start)
            if quiet or spent >= self.budget_s:
                self.waited_s = spent
                return {"loadavg": list(load), "foreign_runnable": round(foreign, 2), "quiet": quiet,
                        "waited_s": round(time.monotonic() - start, 1), "cpu_probe_ms": probe_ms()}
            self.log(f"[bench] load {load[0]:.2f} (foreign runnable {foreign:.1f}); waiting {self.poll_s:.0f}s "
                     f"(waited {spent:.0f}/{self.budget_s:.0f}s so far)")
            time.sleep(self.poll_s)
