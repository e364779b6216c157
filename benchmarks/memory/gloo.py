"""How much memory gloo's CPU collectives allocate for themselves (``python -m benchmarks.memory.gloo``).

The memory benchmark measured more over its analytic model than the model's buffers
explain. On CPU the rounds' collectives are gloo's, and gloo builds
``reduce_scatter_tensor`` and ``all_gather_into_tensor`` out of full-size
temporaries; NCCL works in place. This measures each collective's peak resident
memory above what was resident before it, on two local ranks.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _status_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _measure(rank: int, world: int, numel: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    full, shard = torch.ones(numel), torch.empty(numel // world)
    cases = [("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(shard, full)),
             ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(full, shard)),
             ("all_reduce", lambda: dist.all_reduce(full))]
    for name, run in cases:
        dist.barrier()
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # reset VmHWM to the current resident set
        before = _status_mb("VmRSS")
        run()
        dist.barrier()
        if rank == 0:
            print(f"{name:24s} peak {_status_mb('VmHWM') - before:7.0f} MB above resident "
                  f"(tensor {numel * 4 / 2 ** 20:.0f} MB, {world} ranks)", flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=25_000_000, help="fp32 elements of the full tensor")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, default=29555)
    args = p.parse_args(argv)
    mp.spawn(_measure, args=(args.world_size, args.numel, args.port), nprocs=args.world_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
