"""Run a per-rank entry point under a launcher, or on N local processes when started plainly.

Examples and benchmarks should work both as ``torchrun --nproc_per_node 2 -m module``
(or under ``launchers/local_cluster.py``) and as a bare ``python -m module``: with
``RANK`` in the environment the launcher has placed this process; otherwise this
spawns ``nproc`` processes on loopback with a free port.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _run(fn: Callable[[Any], None], args: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        fn(args)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, fn: Callable[[Any], None], args: Any) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _run(fn, args)


def run_ranks(fn: Callable[[Any], None], args: Any, nproc: int) -> None:
    """Call ``fn(args)`` on every rank of a gloo process group (launched or spawned)."""
    if "RANK" in os.environ:
        _run(fn, args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(nproc, port, fn, args), nprocs=nproc)
