"""SIGTERM to one rank under the real ``deepspeed`` launcher (tests/test_preemption.py): the scenario is
tests/preempt_workers.py's ``stop``; here ``AccoPreempted`` ends the process, so the launcher's exit status is
the ranks' ``acco.preemption.exit_code``. Each rank notes where it stopped in ``<out>/stop<r>.json``.
"""

from __future__ import annotations

import argparse
import sys

import deepspeed
import torch

from tests import preempt_workers as P
from tests.forced_streaming import forced_streaming


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--front", choices=list(P.STEPS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--at", type=int, default=9)
    p.add_argument("--during-save", action="store_true")
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    with forced_streaming(args.front == "auto_streaming"):  # auto switches at its first choice
        P.stop(args.front, args.out, args.at, args.during_save, [])
    print("TRAINING FINISHED WITHOUT A STOP", flush=True)


if __name__ == "__main__":
    sys.exit(main())
