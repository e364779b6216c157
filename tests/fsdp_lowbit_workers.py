"""Worker functions for tests/test_fsdp_lowbit.py: the FSDP2 front end with low-bit all-gathers and int4 estimates.

One 2-rank job runs every scenario in turn (each with a fresh model, FSDP2 state, engine and process group). After
every swap it records what the rounds produced in the layout they produced it in: each bucket's compute buffer, the
buffer the round started from (the base of its delta) and this rank's master shard, rank-major packed as FSDP2's own
all-gather packs a unit (:mod:`ds_acco.layout.rank_major`), so the test can rebuild every rank's delta.
"""

from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist

from tests import fsdp_workloads as F
from tests import workloads as W

BLOCK = 8
LOWBIT = {"backend": "fsdp", "mode": "acco", "policy": "fixed", "quantization_block_size": BLOCK}
RUNS = {
    # two fully_shard units in two buckets: two packed groups, each its own delta all-gather
    "acco_int8_ag": (dict(LOWBIT, all_gather_quantization="int8"), dict(nested=True, bucket_cap_mb=0)),
    "dpu_int8_ag": (dict(LOWBIT, mode="dpu", all_gather_quantization="int8"), {}),
    "sync_int8_ag": (dict(LOWBIT, mode="sync", all_gather_quantization="int8"), {}),
    "acco_int4_estimate": (dict(LOWBIT, estimate_quantization="int4"), {}),
    "acco_fp32": ({"backend": "fsdp", "mode": "acco", "policy": "fixed"}, {}),
}
EVERYTHING = dict(LOWBIT, warmup_steps=1, comm_quantization="int8", error_feedback=True,
                  all_gather_quantization="int8", estimate_quantization="int4")
RESUME = dict(config=EVERYTHING, G=4, clip=0.5, schedule=True)
STEPS, G, SAVE_AT = 8, 4, 13  # micro-batch 13: mid-step, a round in flight


def _packed(g, flat: torch.Tensor) -> torch.Tensor:
    return g.packing.pack(flat, torch.empty(g.layout.padded_numel, dtype=torch.float32))


def _masters(g) -> torch.Tensor:
    out = torch.empty(g.layout.shard_numel)
    g.read_master(out)
    return out


def train_recording_swaps(rank, world, config, *, steps=STEPS, **build) -> dict:
    """Train ``steps`` commits; after every swap: its kind, the full parameters, and per bucket (rank-major) the
    compute buffer, the base the round started from and this rank's master shard (read while the next round may
    run: they are a commit's only where that round cannot step them, in sync and after acco's commit)."""
    model, acco = F.build(world, config, G, **build)
    engine, swaps, k = acco.engine, [], 0
    base, launched = None, engine._round_index
    try:
        while acco.commits < steps:
            x, y = W.batch(rank, k)
            k += 1
            W.loss_fn(model(x), y).backward()
            before = [_packed(g, g.flat) for g in engine.groups]
            if acco.after_micro_batch():
                record = acco.telemetry.records[-1]
                swaps.append({"kind": record.kind, "params": F._full(model),
                              "base": before if record.mode == "sync" else base,
                              "flat": [_packed(g, g.flat) for g in engine.groups],
                              "master": [_masters(g) for g in engine.groups]})
            if engine._round_index != launched:
                launched, base = engine._round_index, [_packed(g, g.flat) for g in engine.groups]
        acco.finish()
        final = {"flat": [_packed(g, g.flat) for g in engine.groups], "master": [_masters(g) for g in engine.groups]}
        startup = engine.startup_fields()
    finally:
        acco.close()
    return {"swaps": swaps, "final": final, "startup": startup, "buckets": len(engine.groups),
            "bytes_sent": acco.telemetry.summary()["bytes_sent"]}


def resume_job(rank, world, *, steps, save_at=None, ckpt=None, resume=False) -> dict:
    """``RESUME``'s job (every low-bit switch): uninterrupted; stopped at micro-batch ``save_at`` with a checkpoint
    (a round in flight); or resumed from it. Returns the trajectory and the compute parameters at the end."""
    model, acco = F.build(world, RESUME["config"], RESUME["G"], RESUME["clip"], RESUME["schedule"])
    k, trajectory, in_flight = 0, [], None
    try:
        if resume:
            extra = acco.load_checkpoint(ckpt)
            k, trajectory = extra["k"], extra["trajectory"]
        trajectory, k = F.train(rank, model, acco, steps, k, trajectory, save_at, ckpt)
        in_flight = acco.engine.in_flight
        compute = F._full(model)
    finally:
        acco.close()
    return {"trajectory": trajectory, "compute": compute, "in_flight": in_flight}


def _round_state_bytes(folder: str, rank: int) -> tuple[str, int, int]:
    """Where rank ``rank``'s round state (``acco_rank<r>``: its round buffers, residuals and compute shard) lies in
    the DCP files: file, offset, length."""
    from ds_acco.fsdp.restore import safe_reader

    metadata = safe_reader(folder).read_metadata()
    (info,) = [v for k, v in metadata.storage_data.items() if k.fqn == f"acco_rank{rank}"]
    return info.relative_path, info.offset, info.length


def damaged_round_state(rank, world, ckpt: str, out: str) -> dict:
    """A copy of the checkpoint with one byte of rank 1's round state flipped: a fresh trainer's load must fail on
    every rank before anything is read, naming the file."""
    damaged = os.path.join(out, "damaged")
    where = _round_state_bytes(ckpt, 1)
    if rank == 0:
        shutil.copytree(ckpt, damaged)
        name, offset, length = where
        with open(os.path.join(damaged, name), "r+b") as f:
            f.seek(offset + length // 2)
            byte = f.read(1)
            f.seek(offset + length // 2)
            f.write(bytes([byte[0] ^ 0x01]))
    dist.barrier()
    model, acco = F.build(world, RESUME["config"], RESUME["G"], RESUME["clip"], RESUME["schedule"])
    try:
        acco.load_checkpoint(damaged)
        error = None
    except Exception as exc:  # noqa: BLE001 - the message is the result
        error = f"{type(exc).__name__}: {exc}"
    finally:
        acco.close()
    return {"file": where[0], "error": error}


def lowbit_job(rank, world, *, ckpt, out) -> dict:
    """Every scenario on 2 ranks."""
    torch.set_num_threads(1)
    got = {name: train_recording_swaps(rank, world, cfg, **build) for name, (cfg, build) in RUNS.items()}
    got["bf16_int8_ag"] = train_recording_swaps(rank, world, dict(LOWBIT, mode="sync", all_gather_quantization="int8"),
                                                steps=4, mp_policy=_bf16())
    got["full"] = resume_job(rank, world, steps=STEPS)
    got["saved"] = resume_job(rank, world, steps=STEPS, save_at=SAVE_AT, ckpt=ckpt)
    got["resumed"] = resume_job(rank, world, steps=STEPS, ckpt=ckpt, resume=True)
    got["damaged"] = damaged_round_state(rank, world, ckpt, out)
    return got


def _bf16():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
