"""Damaged checkpoints under the real ``deepspeed`` launcher: every case refused on every rank, by name.

One launch checks many damaged copies (each launch costs 15-30 s of CI): every rank
builds one engine that has not trained yet and calls its real ``load_checkpoint`` on
each damaged copy in turn; each must raise ``CheckpointError`` naming the damaged file
before the engine steps. The same engine then resumes the intact checkpoint and must
reproduce the uninterrupted run bit for bit (fixed policy). The salvage switch, the
stock ZeRO-1 WARNING, the streaming mode's checkpoints and hostile files (tests/trust_workloads.py)
are checked in the same launch.
Each rank writes what it saw to ``<out>/rank<r>.json``. Last, every rank loads the copy
with rank 1's round state damaged *without* catching anything: the job must exit
non-zero on every rank (each rank notes its error in ``<out>/rank<r>.err`` first).
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import deepspeed
import torch
import torch.distributed as dist

from ds_acco.errors import CheckpointError
from tests.checkpoint_damage import damage_cases, empty, make_copies, refusals
from tests.checkpoint_workloads import (ACCO, MODEL, OPTIM, ROUND, SAVES, STEPS, STREAM, STREAMING,
                                        counting_finite_sums, engine_of, resume_is_exact, train)
from tests.trust_workloads import hostile_scenarios


class Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


# ------------------------------------------------------------------ scenarios
def acco_scenarios(out, log):
    ckpt = os.path.join(out, "acco")
    a = engine_of(ACCO)
    full = train(a, 0, STEPS, [], save=(ckpt, SAVES))
    a.destroy()
    names = [MODEL, OPTIM.format(r=0), OPTIM.format(r=1), ROUND.format(r=0), ROUND.format(r=1)]
    cases = damage_cases(names)
    cases[f"empty {ROUND.format(r=0)}"] = (ROUND.format(r=0), ROUND.format(r=0), empty)
    dirs = make_copies(ckpt, os.path.join(out, "acco_damaged"), cases)

    b = engine_of(ACCO)
    seen = refusals(b, dirs, cases)
    with counting_finite_sums() as summed_at_load:  # the save found them finite: no sums at the load
        exact = resume_is_exact(b, ckpt, full)  # the intact one, on the engine that refused all of the above

    # salvage: rank 0's round state overwritten -> dropped, named in the WARNING, training goes on
    salvage_cfg = dict(ACCO, acco=dict(ACCO["acco"], checkpoint={"salvage": True}))
    c = engine_of(salvage_cfg)
    del log.lines[:]
    c.load_checkpoint(dirs[f"overwrite {ROUND.format(r=0)}"])
    salvaged = train(c, 0, c.global_steps + 1, [])
    salvage = {"warnings": list(log.lines), "trained": len(salvaged) == 1 and
               all(torch.isfinite(p).all() for p in salvaged[-1])}
    c.destroy()

    # a checkpoint no ds_acco run wrote: loads, with one WARNING
    stock_dir = os.path.join(out, "stock")
    s = engine_of({k: v for k, v in ACCO.items() if k != "acco"}, stock=True)
    train(s, 0, 2, [])
    s.save_checkpoint(stock_dir)
    s.destroy()
    d = engine_of(ACCO)
    del log.lines[:]
    d.load_checkpoint(stock_dir)
    stock = {"warnings": list(log.lines), "steps": d.global_steps}
    d.destroy()
    return {"cases": seen, "exact_resume": exact, "summed_at_load": summed_at_load[0], "salvage": salvage, "stock": stock,
            "refuse_dir": dirs[f"overwrite {ROUND.format(r=1)}"]}


def streaming_scenarios(out):
    ckpt = os.path.join(out, "streaming")
    a = engine_of(STREAMING)
    full = train(a, 0, STEPS, [], save=(ckpt, (3, 5)))
    a.destroy()
    cases = damage_cases([MODEL, STREAM.format(r=0), STREAM.format(r=1)])
    dirs = make_copies(ckpt, os.path.join(out, "streaming_damaged"), cases)
    b = engine_of(STREAMING)
    seen = refusals(b, dirs, cases)
    with counting_finite_sums() as summed_at_load:  # the save found them finite: no sums at the load
        exact = resume_is_exact(b, ckpt, full)
    return {"cases": seen, "exact_resume": exact, "summed_at_load": summed_at_load[0]}


def refuse(path, out, rank):
    """Load a damaged checkpoint without catching: this process must end here, non-zero."""
    engine = engine_of(ACCO)
    try:
        engine.load_checkpoint(path)
    except CheckpointError as exc:
        with open(os.path.join(out, f"rank{rank}.err"), "w") as f:
            f.write(str(exc))
        raise
    print("TRAINING STARTED", flush=True)
    train(engine, 0, STEPS, [])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    log = Captured()
    logging.getLogger("ds_acco").addHandler(log)
    acco = acco_scenarios(args.out, log)
    result = {"acco": acco, "streaming": streaming_scenarios(args.out), "trust": hostile_scenarios(args.out)}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    refuse(acco["refuse_dir"], args.out, rank)


if __name__ == "__main__":
    main()
