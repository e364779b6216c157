"""SIGTERM to one rank, as functions every rank runs: on pooled workers (tests/test_preemption.py), or under a
real launcher from tests/scripts/preempt_script.py (``deepspeed``) and fsdp_preempt_script.py (``torchrun``).

``stop``: rank 1 sends itself SIGTERM at micro-batch ``at``, while a round is in flight, or rank 0 does in the
middle of a checkpoint save (``during_save``). Every rank must stop at the same round boundary, save to
``acco.preemption.checkpoint_dir`` and raise ``AccoPreempted`` with ``acco.preemption.exit_code``; each rank notes
where it stopped in ``<out>/stop<r>.json``. ``resume``: load that checkpoint, train to the end, and compare with a
run never stopped. Under the adaptive policy (``acco_adaptive``: rank 1 a slower worker, so the ranks contribute
different micro-batch counts) no run repeats another's timing: the resume compares what it loaded with what each
rank held when it stopped, and the ranks' parameters at the end with each other.

A script lets ``AccoPreempted`` end the process; a pooled job (``*_job``) catches it and then puts back what a
signal and a stop leave process-wide (STOP's flag, the SIGTERM handler, auto's forced switch), so that the
worker's next job starts as a fresh process would; each job reports that state as it found it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist

from ds_acco.comm.stop_signal import STOP
from ds_acco.errors import AccoPreempted
from tests import ds_workloads as D
from tests.forced_streaming import forced_streaming
from tests import fsdp_workloads as F
from tests import workloads as W
from tests.checkpoint_workloads import ACCO, STREAMING, engine_of, train
from tests.log_capture import ds_acco_lines

# streaming: a fragment round every 2 steps (sync_every 4, 2 fragments); auto_streaming: 3 sync steps, then the
# same streaming schedule in a ZeRO-1 job
STEPS = {"acco": 6, "streaming": 12, "auto_streaming": 10, "acco_adaptive": 6}
AUTO_STREAMING = D.ds_config(4, {"mode": "auto", "auto": {"measure_steps": 3, "streaming": True},
                                 "streaming": {"fragments": 2, "sync_every": 4, "overlap_steps": 1}},
                             clip=0.5, scheduler=True)
ADAPTIVE = D.ds_config(4, {"mode": "acco", "policy": "adaptive", "warmup_steps": 1}, clip=0.5, scheduler=True)
SLOW_S = 0.02  # rank 1's extra seconds per micro-batch under the adaptive policy
FSDP_STEPS, FSDP_G, FSDP_AT = 6, 4, 9


def config(front: str, out: str) -> dict:
    base = {"acco": ACCO, "streaming": STREAMING, "auto_streaming": AUTO_STREAMING, "acco_adaptive": ADAPTIVE}[front]
    return dict(base, acco=dict(base["acco"], preemption={"checkpoint_dir": os.path.join(out, "preempted")},
                                timeout_s=30))


# ------------------------------------------------------------------ the scenarios (scripts and pooled jobs)
def stop(front: str, out: str, at: int, during_save: bool, engines: list) -> None:
    """Train until every rank stops; write ``stop<rank>.json`` and let ``AccoPreempted`` through. Returns only when
    training finished without a stop. ``engines`` receives the engine (a pooled job destroys it)."""
    rank = dist.get_rank()
    engine = engine_of(config(front, out))
    engines.append(engine)
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
        _write(out, f"stop{rank}.json", {"code": exc.code, "steps": engine.global_steps, "micro_batches": k,
                                          "seconds_after_signal": time.monotonic() - t0})
        raise


def _compute(engine) -> dict:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _write(out: str, name: str, record: dict) -> None:
    with open(os.path.join(out, name), "w") as f:
        json.dump(record, f)


def resume(front: str, out: str) -> dict:
    if front == "acco_adaptive":
        return _resume_adaptive(out)
    a = engine_of(config(front, out))
    full = train(a, 0, STEPS[front], [])[-1]
    a.destroy()
    engine = engine_of(config(front, out))
    engine.load_checkpoint(os.path.join(out, "preempted"))
    resumed_from = engine.global_steps
    # the data position: micro-batches this rank computed (the round state keeps it; streaming: one per step)
    k = engine.global_steps if front == "streaming" else engine.acco.micro_batches
    running = engine.acco.mode if front == "auto_streaming" else None
    last = train(engine, k, STEPS[front], [])[-1]
    engine.destroy()
    return {"resumed_from": resumed_from, "k": k, "running": running,
            "equal": all(torch.equal(a, b) for a, b in zip(full, last)),
            "max_diff": max(float((a - b).abs().max()) for a, b in zip(full, last))}


def _resume_adaptive(out: str) -> dict:
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
    return {"resumed_from": resumed_from, "equal": all(same), "checks": len(same), "steps": len(last)}


def fsdp_config(out: str) -> dict:
    return {"backend": "fsdp", "mode": "acco", "timeout_s": 30,
            "preemption": {"checkpoint_dir": os.path.join(out, "fsdp_preempted")}}


def fsdp_stop(out: str) -> None:
    """FSDP2 (under ``torchrun``): rank 1 signals itself at micro-batch 9 (a round in flight); ``fsdp_stop<rank>.json``,
    then ``AccoPreempted`` ends the process."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, acco = F.build(world, fsdp_config(out), FSDP_G)
    k, t0 = 0, None
    try:
        while acco.commits < FSDP_STEPS:
            if k == FSDP_AT:
                if rank == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                t0 = time.monotonic()
            x, y = W.batch(rank, k)
            k += 1
            W.loss_fn(model(x), y).backward()
            acco.after_micro_batch()
    except AccoPreempted as exc:
        _write(out, f"fsdp_stop{rank}.json", {"code": exc.code, "steps": acco.commits, "micro_batches": k,
                                               "seconds_after_signal": time.monotonic() - t0})
        raise


def fsdp_resume(out: str) -> dict:
    world = dist.get_world_size()
    rank = dist.get_rank()
    model, acco = F.build(world, fsdp_config(out), FSDP_G)
    full = F.train(rank, model, acco, FSDP_STEPS)[0][-1]
    acco.close()
    model, acco = F.build(world, fsdp_config(out), FSDP_G)
    acco.load_checkpoint(os.path.join(out, "fsdp_preempted"))
    resumed_from, k = acco.commits, acco.engine.micro_batches
    last = F.train(rank, model, acco, FSDP_STEPS, k)[0][-1]
    acco.close()
    return {"resumed_from": resumed_from, "k": k, "equal": all(torch.equal(a, b) for a, b in zip(full, last))}


# ------------------------------------------------------------------ pooled jobs
def _process_state() -> dict:
    """What a stop leaves process-wide, as this job found it: a fresh process has no flag and not ds_acco's
    handler (it is installed when the job's first engine starts)."""
    return {"flag": STOP.requested, "ds_acco_handler": getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
            is STOP}


@contextlib.contextmanager
def _as_a_fresh_process_after(front: str):
    """Run a job, then clear the SIGTERM flag and put back the handler ds_acco's replaced (test code's finally: the
    library installs its handler once per process, as a process should)."""
    try:
        with forced_streaming(front == "auto_streaming"):  # switch at the first choice
            yield
    finally:
        if STOP._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if STOP._previous is None else STOP._previous)
        STOP.requested, STOP._installed, STOP._previous = False, False, None


def stop_job(rank, world, *, front, out, at, during_save=False) -> dict:
    """``stop`` on a pooled worker: what it wrote, the log lines, whether training ran to its end instead."""
    found, engines, finished = _process_state(), [], True
    with _as_a_fresh_process_after(front), ds_acco_lines() as lines:
        try:
            stop(front, out, at, during_save, engines)
        except AccoPreempted:
            finished = False
        finally:
            for engine in engines:  # its round groups, which a stopped process's exit hook would close
                engine.destroy()
    path = os.path.join(out, f"stop{rank}.json")
    record = {}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    return dict(record, finished_without_stop=finished, lines=list(lines), found=found)


def resume_job(rank, world, *, front, out) -> dict:
    found = _process_state()
    with _as_a_fresh_process_after(front):
        got = fsdp_resume(out) if front == "fsdp" else resume(front, out)
    return dict(got, found=found)
