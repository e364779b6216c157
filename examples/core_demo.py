"""Two processes, one round engine, per-round telemetry: the smallest ACCO job.

    torchrun --nproc_per_node 2 -m examples.core_demo --mode acco --policy adaptive
    python -m examples.core_demo            # spawns 2 local processes itself

Each worker trains an MLP on synthetic regression data; ``--compute-ms`` adds
sleep per micro-batch to stand in for a bigger model's forward/backward. Rank 0
logs one line per commit with the micro-batches each rank contributed, the
round time, how long the training thread waited, and the running percentage
of communication hidden behind compute.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="acco", choices=["sync", "dpu", "acco"])
    p.add_argument("--policy", default="adaptive", choices=["fixed", "adaptive"])
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (commits)")
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--width", type=int, default=512, help="MLP width (communication volume grows with its square)")
    p.add_argument("--compute-ms", type=float, default=5.0, help="extra compute time per micro-batch")
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn when not started by a launcher")
    return p.parse_args(argv)


def demo_model(width: int) -> nn.Module:
    """A small MLP regression model, the same on every rank (seed 0 before calling)."""
    return nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))


def worker(args) -> None:
    from ds_acco import plain

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = demo_model(args.width)
    engine = plain.build(model.parameters(), torch.optim.AdamW, {"lr": 1e-3},
                         config={"mode": args.mode, "policy": args.policy, "telemetry": {"log_every": 1}},
                         gradient_accumulation_steps=args.grad_accum)
    gen = torch.Generator().manual_seed(1000 + rank)
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    t0, k = time.perf_counter(), 0
    while engine.commits < args.steps:
        x = torch.randn(64, 32, generator=gen)
        loss = ((model(x) - torch.sin(x @ w_true)) ** 2).mean()
        loss.backward()
        time.sleep(args.compute_ms / 1e3)
        engine.after_micro_batch()
        k += 1
    engine.finish()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        s = engine.telemetry.summary()
        print(f"[demo] mode={args.mode} policy={args.policy}: {args.steps} steps, {k} micro-batches on rank 0 "
              f"in {elapsed:.2f}s; communication hidden {s['comm_hidden_pct']}%; "
              f"{s['bytes_sent'] / 2**20:.1f} MiB sent; last loss {loss.item():.4f}", flush=True)
    engine.close()


def _worker_with_logging(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    worker(args)


def main(argv=None):
    from examples.local_launch import run_ranks

    args = parse_args(argv)
    run_ranks(_worker_with_logging, args, args.nproc)


if __name__ == "__main__":
    main()
