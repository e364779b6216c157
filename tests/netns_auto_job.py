"""One emulated host's part of a ``mode: "auto"`` test on a shaped link (run by ``launchers/local_cluster.py``).

``python -m tests.netns_auto_job OUT KWARGS_JSON``: the launcher sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``; :func:`tests.auto_workers.train_auto` (the plain front end) runs with the keyword arguments given
(``real_time``: on the wall clock, the link's own time), and its result goes to ``OUT/rank<r>.pt`` for the test to
read.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from tests.auto_workers import train_auto


def main(out: str, kwargs: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        got = train_auto(rank, world, **json.loads(kwargs))
        torch.save(got, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
