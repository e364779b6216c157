"""SIGTERM to one rank of an FSDP2 ACCO job under ``torchrun`` (tests/test_preemption.py): the scenario is
tests/preempt_workers.py's ``fsdp_stop``; here ``AccoPreempted`` ends each worker with exit status 143, which
torchrun reports. Each rank notes where it stopped in ``<out>/fsdp_stop<r>.json``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from tests import preempt_workers as P


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    P.fsdp_stop(args.out)
    print("TRAINING FINISHED WITHOUT A STOP", flush=True)


if __name__ == "__main__":
    sys.exit(main())
