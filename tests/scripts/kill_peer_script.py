"""A torchrun job whose last rank SIGKILLs itself inside a round; the others must fail fast."""

import os
import signal

import torch
import torch.distributed as dist

from ds_acco import plain
from tests import workloads as W

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def on_stage(index, name):
    if rank == world - 1 and index == 3 and name == "reduce-scatter":
        os.kill(os.getpid(), signal.SIGKILL)


model = W.make_model()
engine = plain.build(W.param_groups(model), config={"mode": "acco", "timeout_s": 2}, gradient_accumulation_steps=4,
                     on_stage=on_stage)
for k in range(100_000):
    x, y = W.batch(rank, k)
    W.loss_fn(model(x), y).backward()
    engine.after_micro_batch()
