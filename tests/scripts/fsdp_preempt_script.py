"""SIGTERM to one rank of an FSDP2 ACCO job under ``torchrun`` (tests/test_preemption.py).

``--phase stop``: rank 1 sends itself SIGTERM at micro-batch 9 (a round in flight); every rank must
stop at the same round boundary, save to ``acco.preemption.checkpoint_dir`` and exit 143, each noting
where in ``<out>/fsdp_stop<r>.json``. ``--phase resume``: load it, train on, compare with a run never stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from ds_acco.comm.stop_signal import AccoPreempted
from tests import workloads as W
from tests.fsdp_workloads import build, train

STEPS, G = 6, 4


def config(out: str) -> dict:
    return {"backend": "fsdp", "mode": "acco", "timeout_s": 30,
            "preemption": {"checkpoint_dir": os.path.join(out, "fsdp_preempted")}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["stop", "resume"], required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.phase == "stop":
        model, acco = build(world, config(args.out), G)
        k, t0 = 0, None
        try:
            while acco.commits < STEPS:
                if k == 9:
                    if rank == 1:
                        os.kill(os.getpid(), signal.SIGTERM)
                    t0 = time.monotonic()
                x, y = W.batch(rank, k)
                k += 1
                W.loss_fn(model(x), y).backward()
                acco.after_micro_batch()
        except AccoPreempted as exc:
            with open(os.path.join(args.out, f"fsdp_stop{rank}.json"), "w") as f:
                json.dump({"code": exc.code, "steps": acco.commits, "micro_batches": k,
                           "seconds_after_signal": time.monotonic() - t0}, f)
            raise
        print("TRAINING FINISHED WITHOUT A STOP", flush=True)
        return
    model, acco = build(world, config(args.out), G)
    full = train(rank, model, acco, STEPS)[0][-1]
    acco.close()
    model, acco = build(world, config(args.out), G)
    acco.load_checkpoint(os.path.join(args.out, "fsdp_preempted"))
    resumed_from, k = acco.commits, acco.engine.micro_batches
    last = train(rank, model, acco, STEPS, k)[0][-1]
    acco.close()
    with open(os.path.join(args.out, f"fsdp_resume{rank}.json"), "w") as f:
        json.dump({"resumed_from": resumed_from, "k": k, "equal": all(torch.equal(a, b) for a, b in zip(full, last))},
                  f)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
