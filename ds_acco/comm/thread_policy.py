"""Communication threads that do not preempt compute on wake-up (Linux ``SCHED_BATCH``).

[Note: why the round's threads run as SCHED_BATCH]
On a CPU host a round's threads share the cores with the training thread. gloo's I/O
thread wakes for every burst of packets that arrives (about 8,000 per second at
100 Mbit/s with 1,500-byte frames), and every wake-up of a normal thread may preempt
the training thread on the spot: the benchmark's real-compute bed counted about 2,900
involuntary switches of the training thread per acco step against 230 in sync, and a
micro-batch computed 10-25% slower while a round was in flight. A ``SCHED_BATCH``
thread keeps its fair share of the core but never preempts on wake-up: it runs when
the running thread's slice ends or the core is free, so the kernel's socket buffers
absorb the packets in between and the round still finishes within the compute it
hides behind. Any user may select it for their own threads (no privilege needed).

Threads inherit the policy of the thread that creates them, so the round's process
group is created from a short-lived batch thread: gloo's I/O loop and the process
group's worker threads start there and inherit it; the training thread keeps its
own. Only gloo groups get this (NCCL's threads only wait on the GPU), and only where
the OS offers the policy.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

AVAILABLE = hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH")


def enter_batch_policy() -> bool:
    """Put the calling thread in ``SCHED_BATCH``; False where the OS refuses or lacks it."""
    if not AVAILABLE:
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # 0: the calling thread on Linux
    except OSError:
        return False
    return True


def run_in_batch_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a new thread in ``SCHED_BATCH`` (threads it starts inherit the policy); its result or its
    exception comes back to the caller."""
    out: dict = {}

    def body() -> None:
        enter_batch_policy()
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            out["error"] = exc

    thread = threading.Thread(target=body, name="ds_acco-group-setup")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
