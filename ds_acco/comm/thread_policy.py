"""The round's threads let compute keep the core on a CPU host (Linux's ``SCHED_BATCH``).

Why: on a CPU host a round's threads (the communication thread, and the worker and socket threads gloo starts for the
round's process group) share the cores with forward and backward. Their work is small (a few tens of milliseconds of
CPU a round), but a normal thread that wakes preempts the thread running on its core, and gloo's socket thread wakes
for every few packets that arrive: on the emulated cluster's real-compute bed (one core per host, 100 Mbit/s) the
training thread of an acco step was switched out about eight times as often as in sync low-bit, whose training
thread waits while its round runs. A ``SCHED_BATCH`` thread gets the same share of the core but never preempts on
waking: it runs when the running thread's slice ends. With the round's threads in it, acco's training thread is
switched out less than twice as often as sync's, and the kernel's network time a step halves (each long run records
both: ``preempted_per_step`` and ``softirq_s_per_step`` in its ``results.json``; docs/long-runs.md), and an acco step
took less time in each of three alternated pairs (``bench_results/round_threads_ab/``). An earlier version was
reverted as no faster: its two pairs' ``SCHED_BATCH`` runs had slower sync steps too (the machine, not the policy).

Why only where the round runs on gloo (CPU tensors): a GPU host's compute is not on its cores, and NCCL's threads launch
and watch kernels, whose latency a delayed wake-up would add to. Why by inheritance: a thread takes the policy of the
thread that starts it, and gloo starts its threads inside ``new_group``; so the round's group is created with the
calling thread in ``SCHED_BATCH`` for that call (:func:`threads_started_here_yield`), which reaches exactly that group's
threads and no thread of the user's. The calling (training) thread is put back as it was, and nothing changes where it
was not a normal thread to begin with (a real-time or already demoted job keeps what its owner chose), where the
platform has no such policy, or where the call is refused (a sandbox): the round then only loses this gain.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

logger = logging.getLogger("ds_acco")

BATCH = getattr(os, "SCHED_BATCH", None)
NORMAL = getattr(os, "SCHED_OTHER", None)


def yield_to_compute() -> bool:
    """Put the calling thread in ``SCHED_BATCH`` if it is a normal thread; True only where this call changed it."""
    if BATCH is None or NORMAL is None:
        return False
    try:
        if os.sched_getscheduler(0) != NORMAL:
            return False  # its owner chose its policy
        os.sched_setscheduler(0, BATCH, os.sched_param(0))
        return True
    except OSError as exc:  # a sandbox that refuses the call: the round runs as a normal thread
        logger.debug("ds_acco: the round's thread stays a normal thread (%s)", exc)
        return False


@contextlib.contextmanager
def threads_started_here_yield(enabled: bool = True) -> Iterator[bool]:
    """Threads the calling thread starts inside the block are ``SCHED_BATCH``; the calling thread is put back after.

    Yields whether the block demoted it. It is a normal thread again at the end of the block, whatever the block
    raised (Linux lets any thread go back to ``SCHED_OTHER``)."""
    demoted = enabled and yield_to_compute()
    try:
        yield demoted
    finally:
        if demoted:
            os.sched_setscheduler(0, NORMAL, os.sched_param(0))


def policy_of(tid: int = 0) -> str:
    """``"batch"``, ``"normal"`` or the policy's number, of thread ``tid`` (0: the calling thread): for tests."""
    p = os.sched_getscheduler(tid)
    return "batch" if p == BATCH else "normal" if p == NORMAL else str(p)
