"""SIGTERM to one rank under the real ``deepspeed`` launcher (tests/test_preemption.py).

``--phase stop``: rank 1 sends itself SIGTERM (what SLURM or Kubernetes sends) at micro-batch
``--at``, while a round is in flight, or rank 0 does in the middle of a checkpoint save (``--during-save``).
Every rank must stop at the same round boundary, save to ``acco.preemption.checkpoint_dir``, and
exit with ``acco.preemption.exit_code``; each rank notes where it stopped in ``<out>/stop<r>.json``.
``--phase resume``: load that checkpoint, train to the end, and compare with a run never stopped. Under the adaptive
policy (``acco_adaptive``: rank 1 a slower worker, so the ranks contribute different micro-batch counts) no run
repeats another's timing: the resume compares what it loaded with what each rank held when it stopped, and the
ranks' parameters at the end with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import deepspeed
import torch
import torch.distributed as dist

from ds_acco.comm.stop_signal import AccoPreempted
from tests import workloads as W
from tests import ds_workloads as D
from tests.checkpoint_workloads import ACCO, STREAMING, engine_of, train

# streaming: a fragment round every 2 steps (sync_every 4, 2 fragments); auto_streaming: 3 sync steps, then the
# same streaming schedule in a ZeRO-1 job
STEPS = {"acco": 6, "streaming": 12, "auto_streaming": 10, "acco_adaptive": 6}
AUTO_STREAMING = D.ds_config(4, {"mode": "auto", "auto": {"measure_steps": 3, "streaming": True},
                                 "streaming": {"fragments": 2, "sync_every": 4, "overlap_steps": 1}},
                             clip=0.5, scheduler=True)
ADAPTIVE = D.ds_config(4, {"mode": "acco", "policy": "adaptive", "warmup_steps": 1}, clip=0.5, scheduler=True)
SLOW_S = 0.02  # rank 1's extra seconds per micro-batch under the adaptive policy


def config(front: str, out: str) -> dict:
    if front == "auto_streaming":  # auto must switch at its first choice, whatever this machine measures (and not
        from ds_acco.rounds import auto_mode  # before the first round, which with any rate a probe gives would)

        auto_mode.STREAMING_HINT = 0.0
        auto_mode.AutoMode.look_first = lambda self: False
    base = {"acco": ACCO, "streaming": STREAMING, "auto_streaming": AUTO_STREAMING, "acco_adaptive": ADAPTIVE}[front]
    return dict(base, acco=dict(base["acco"], preemption={"checkpoint_dir": os.path.join(out, "preempted")},
                                timeout_s=30))


def stop_phase(front: str, out: str, at: int, during_save: bool) -> None:
    rank = dist.get_rank()
    engine = engine_of(config(front, out))
    if during_save and rank == 0:  # the rank that writes DeepSpeed's model file (stage 0 and ZeRO-1)
        real = engine.checkpoint_engine.save

        def save(state_dict, path, *args, **kwargs):  # SIGTERM arrives while the save writes its files
            os.kill(os.getpid(), signal.SIGTERM)
            return real(state_dict, path, *args, **kwargs)

        engine.checkpoint_engine.save = save
    k, t0 = 0, None
    try:
        while engine.global_steps < STEPS[front]:
            if k == at:
                if during_save:
                    engine.save_checkpoint(os.path.join(out, "regular"))
                elif rank == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                t0 = time.monotonic()
            if front == "acco_adaptive" and rank == 1:
                time.sleep(SLOW_S)
            x, y = W.batch(rank, k)
            engine.backward(W.loss_fn(engine(x), y))
            engine.step()
            k += 1
    except AccoPreempted as exc:
        if front == "acco_adaptive":  # what this rank held at the stop, for the resume to compare
            torch.save({"masters": D.full_masters(engine), "compute": _compute(engine)},
                       os.path.join(out, f"held{rank}.pt"))
        with open(os.path.join(out, f"stop{rank}.json"), "w") as f:
            json.dump({"code": exc.code, "steps": engine.global_steps, "micro_batches": k,
                       "seconds_after_signal": time.monotonic() - t0}, f)
        raise
    print("TRAINING FINISHED WITHOUT A STOP", flush=True)


def _compute(engine) -> dict:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def resume_adaptive(out: str) -> None:
    rank = dist.get_rank()
    engine = engine_of(config("acco_adaptive", out))
    engine.load_checkpoint(os.path.join(out, "preempted"))
    resumed_from = engine.global_steps
    held = torch.load(os.path.join(out, f"held{rank}.pt"))
    loaded = {"masters": D.full_masters(engine), "compute": _compute(engine)}
    same = [torch.equal(loaded[key][n], held[key][n]) for key in held for n in held[key]]
    last = train(engine, engine.acco.micro_batches, STEPS["acco_adaptive"], [])[-1]
    engine.finish()
    final = [p.detach().clone() for p in W.ordered_params(engine.module)]
    rank0 = [p.clone() for p in final]
    for t in rank0:
        dist.broadcast(t, 0)
    same += [torch.equal(a, b) for a, b in zip(final, rank0)]
    masters = D.full_masters(engine)
    same += [torch.equal(masters[n], p) for n, p in _compute(engine).items()]
    engine.destroy()
    with open(os.path.join(out, f"resume{rank}.json"), "w") as f:
        json.dump({"resumed_from": resumed_from, "equal": all(same), "checks": len(same), "steps": len(last)}, f)


def resume_phase(front: str, out: str) -> None:
    if front == "acco_adaptive":
        return resume_adaptive(out)
    rank = dist.get_rank()
    a = engine_of(config(front, out))
    full = train(a, 0, STEPS[front], [])[-1]
    a.destroy()
    engine = engine_of(config(front, out))
    engine.load_checkpoint(os.path.join(out, "preempted"))
    resumed_from = engine.global_steps
    # the data position: micro-batches this rank computed (the round state keeps it; streaming: one per step)
    k = engine.global_steps if front == "streaming" else engine.acco.micro_batches
    if front == "auto_streaming":
        assert engine.acco.mode == "streaming", engine.acco.mode
    last = train(engine, k, STEPS[front], [])[-1]
    engine.destroy()
    with open(os.path.join(out, f"resume{rank}.json"), "w") as f:
        json.dump({"resumed_from": resumed_from, "k": k, "equal": all(torch.equal(a, b) for a, b in zip(full, last)),
                   "max_diff": max(float((a - b).abs().max()) for a, b in zip(full, last))}, f)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["stop", "resume"], required=True)
    p.add_argument("--front", choices=list(STEPS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--at", type=int, default=9)
    p.add_argument("--during-save", action="store_true")
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    if args.phase == "stop":
        stop_phase(args.front, args.out, args.at, args.during_save)
    else:
        resume_phase(args.front, args.out)


if __name__ == "__main__":
    sys.exit(main())
