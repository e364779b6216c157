"""The round's threads run as SCHED_BATCH on gloo (ds_acco.comm.thread_policy): two real gloo ranks, the
engine built twice, with ``comm_scheduling`` "batch" (the default) and "normal"."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from tests import workloads as W
from tests.dist_harness import run_distributed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")

SCHED_BATCH = 3


def _policies() -> dict[int, int]:
    """Every thread of this process: its scheduling policy (field 41 of /proc/<pid>/task/<tid>/stat)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # a thread that just ended
            continue
        out[int(tid)] = int(fields[41 - 3])  # fields after "pid (comm)" start at field 3
    return out


def _threads_of_an_engine(rank: int, world: int, scheduling: str) -> dict:
    from ds_acco import plain

    torch.set_num_threads(1)
    before = _policies()
    model = W.make_model()
    engine = plain.build(W.param_groups(model), torch.optim.AdamW, W.OPT_KWARGS, gradient_accumulation_steps=2,
                         config={"mode": "acco", "comm_scheduling": scheduling})
    try:
        for k in range(8):  # rounds run, so every thread the group starts lazily has started
            x, y = W.batch(rank, k)
            W.loss_fn(model(x), y).backward()
            engine.after_micro_batch()
        after = _policies()
        comm = engine._comm._thread.native_id
    finally:
        engine.close()
    new = {tid: p for tid, p in after.items() if tid not in before}
    return {"new": new, "comm": after.get(comm), "main": after[threading.main_thread().native_id],
            "committed": engine.commits}


@pytest.mark.parametrize("scheduling", ["batch", "normal"])
def test_round_threads_never_preempt_compute_unless_asked(scheduling):
    for got in run_distributed(_threads_of_an_engine, 2, scheduling):
        assert got["committed"] >= 3
        assert got["main"] == 0  # the training thread keeps the OS default
        batch = [tid for tid, p in got["new"].items() if p == SCHED_BATCH]
        if scheduling == "batch":
            assert got["comm"] == SCHED_BATCH
            assert len(batch) >= 2, got["new"]  # the comm thread and gloo's own threads, which inherit it
        else:
            assert got["comm"] == 0 and not batch, got["new"]
