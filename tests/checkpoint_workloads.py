"""Checkpoint round trips and refusals on real engines, for tests/test_checkpoint_verify.py and the launch
scripts: DeepSpeed engines trained to a save, the FSDP front end's damaged copies (the damage itself:
tests/checkpoint_damage.py), the finite check, the agreement time-out, stock FSDP2, flush order and hashing in
ranges shared over the ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import torch
import torch.distributed as dist

from ds_acco.checkpoint.manifest import MANIFEST
from ds_acco.errors import CheckpointError
from tests import ds_workloads as D
from tests.checkpoint_damage import damage_cases, make_copies, overwrite_at, refusals, states_equal
from tests import workloads as W

ACCO = D.ds_config(4, {"mode": "acco", "policy": "fixed", "warmup_steps": 1}, clip=0.5, scheduler=True)
STREAMING = dict(D.ds_config(1, {"mode": "streaming", "streaming": {"fragments": 2, "sync_every": 4,
                                                                      "overlap_steps": 1}}, clip=0.5),
                 zero_optimization={"stage": 0})
SAVES, STEPS = (6, 14), 8  # micro-batches of the saves (the last with a round in flight), optimizer steps in all
MODEL = "mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
ROUND = "acco_round_state_dp_rank_{r}.pt"
STREAM = "acco_streaming_state_dp_rank_{r}.pt"


# ------------------------------------------------------------------ DeepSpeed engines
def engine_of(config, stock=False):
    import deepspeed

    import ds_acco

    model = W.make_model()
    init = deepspeed.initialize if stock else ds_acco.initialize
    return init(model=model, model_parameters=W.param_groups(model), config=config)[0]


def train(engine, k, steps, trajectory, save=None):
    """Micro-batches from ``k`` until ``steps`` optimizer steps; ``save=(dir, ks)`` saves at micro-batches ``ks``."""
    while engine.global_steps < steps:
        if save is not None and k in save[1]:
            engine.save_checkpoint(save[0], client_state={"k": k, "trajectory": list(trajectory)})
        x, y = W.batch(engine.global_rank, k)
        k += 1
        before = engine.global_steps
        engine.backward(W.loss_fn(engine(x), y))
        engine.step()
        if engine.global_steps > before:
            trajectory.append([p.detach().clone() for p in W.ordered_params(engine.module)])
    return trajectory


def resume_is_exact(engine, ckpt, full, steps=STEPS):
    """Load ``ckpt`` (latest) into ``engine``, train to the end: the steps after the save equal ``full``'s."""
    _, client = engine.load_checkpoint(ckpt)
    done = engine.global_steps
    resumed = train(engine, client["k"], steps, [])
    engine.destroy()
    return len(resumed) == len(full) - done > 0 and all(
        torch.equal(x, y) for s, t in zip(resumed, full[done:]) for x, y in zip(s, t))


# ------------------------------------------------------------------ FSDP front end
FSDP_FILES = [".metadata", "__0_0.distcp", "__1_0.distcp"]


def fsdp_job(rank, world, *, out, steps=6, saves=(6, 14)) -> dict:
    """Save the FSDP front end's checkpoint twice while training on; on 2 ranks try every damaged
    copy of the last one on a fresh trainer; then resume the intact one (fixed policy) and compare."""
    from tests import fsdp_workloads as F

    R = F.RESUME
    root = os.path.join(out, "fsdp")
    model, acco = F.build(world, R["config"], R["G"], R["clip"], R["schedule"])
    trajectory, k = [], 0
    for i, at in enumerate(saves):
        trajectory, k = F.train(rank, model, acco, steps, k, trajectory, save_at=at,
                                ckpt=os.path.join(root, f"tag{i}"))
    full, _ = F.train(rank, model, acco, steps, k, trajectory)
    acco.close()
    manifest = sorted(os.listdir(os.path.join(root, f"tag{len(saves) - 1}")))

    model, acco = F.build(world, R["config"], R["G"], R["clip"], R["schedule"])
    seen = {}
    if world == 2:
        cases = damage_cases(FSDP_FILES, latest=False)
        dirs = make_copies(root, os.path.join(out, "fsdp_damaged"), cases, tag=f"tag{len(saves) - 1}")
        seen = refusals(acco, {c: os.path.join(d, f"tag{len(saves) - 1}") for c, d in dirs.items()}, cases)
    with counting_finite_sums() as summed_at_load:  # the save found them finite: no sums at the load
        extra = acco.load_checkpoint(os.path.join(root, f"tag{len(saves) - 1}"))
    resumed, _ = F.train(rank, model, acco, steps, extra["k"], extra["trajectory"])
    acco.close()
    with open(os.path.join(root, f"tag{len(saves) - 1}", MANIFEST)) as f:
        finite_at_save = json.load(f)["finite_at_save"]
    return {"cases": seen, "files": manifest, "exact_resume": states_equal(resumed, full), "finite_at_save": finite_at_save,
            "summed_at_load": summed_at_load[0]}


# ------------------------------------------------------------------ DeepSpeed front end, any world size
def deepspeed_round_trip(rank, world) -> dict:
    """Save (with a round in flight), train on; a fresh engine verifies, loads and must match."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = [tmp]
        dist.broadcast_object_list(ckpt, src=0)
        a = engine_of(ACCO)
        full = train(a, 0, 6, [], save=(ckpt[0], (10,)))
        a.destroy()
        tag = open(os.path.join(ckpt[0], "latest")).read().strip()
        with open(os.path.join(ckpt[0], tag, MANIFEST)) as f:
            manifest = json.load(f)
        listed, finite_at_save = sorted(manifest["files"]), manifest["finite_at_save"]
        with counting_finite_sums() as summed_at_load:
            exact = resume_is_exact(engine_of(ACCO), ckpt[0], full, steps=6)
        # a moment that is inf at the save: recorded, and the load (which must then sum) refuses it
        b = engine_of(ACCO)
        train(b, 0, 2, [])
        if rank == world - 1:
            next(iter(b.optimizer.optimizer.state.values()))["exp_avg_sq"][3] = float("inf")
        with counting_finite_sums() as bad_sums:
            b.save_checkpoint(ckpt[0], tag="nan")  # next to the good tag
            latest_after_bad = open(os.path.join(ckpt[0], "latest")).read().strip()
            with open(os.path.join(ckpt[0], "nan", MANIFEST)) as f:
                bad_finite_at_save = json.load(f)["finite_at_save"]
            try:
                b.load_checkpoint(ckpt[0], tag="nan")
                refusal = None
            except CheckpointError as exc:
                refusal = str(exc)
        b.destroy()
        dist.barrier()
    return {"exact_resume": exact, "listed": listed, "finite_at_save": finite_at_save,
            "summed_at_load": summed_at_load[0], "bad_finite_at_save": bad_finite_at_save, "bad_refusal": refusal,
            "bad_sums": bad_sums[0], "good_tag": tag, "latest_after_bad": latest_after_bad}


@contextlib.contextmanager
def counting_finite_sums():
    """Within the block, count the calls of the finite check's sums in this process (``[n]``)."""
    from ds_acco.checkpoint import verify as checkpoint_verify

    count, real = [0], checkpoint_verify._non_finite

    def counted(named):
        count[0] += 1
        return real(named)

    checkpoint_verify._non_finite = counted
    try:
        yield count
    finally:
        checkpoint_verify._non_finite = real


def finite_check_job(rank, world) -> dict:
    """Rank 1's loaded moment holds a NaN (or an inf): every rank must refuse, with the same message."""
    from ds_acco.checkpoint.verify import refuse_unless_finite

    out = {}
    for bad in (float("nan"), float("inf")):
        moment = torch.ones(1000)
        if rank == 1:
            moment[517] = bad
        try:
            refuse_unless_finite("/ckpt/global_step7", [("master", torch.zeros(10)), ("exp_avg_sq", moment)])
            out[str(bad)] = "loaded"
        except CheckpointError as exc:
            out[str(bad)] = str(exc)
    refuse_unless_finite("/ckpt/global_step7", [("master", torch.zeros(10))])  # finite: no error
    return out


def agreement_timeout_job(rank, world, *, folder) -> dict:
    """Rank 0 verifies, rank 1 never joins: rank 0's background agreement must fail within the verification
    group's time-out (1 s), as a CheckpointError in the main thread that names acco.timeout_s."""
    import time

    from ds_acco.checkpoint.gate import PendingVerdict, VerificationGroup
    from ds_acco.checkpoint.verify import verify_for_load

    owner = VerificationGroup(None, 1.0)
    group = owner.get()
    t0, message = time.perf_counter(), None
    if rank == 0:
        pending = PendingVerdict(lambda: verify_for_load(folder, reads=[], ours=True, salvage=False, group=group),
                                 folder, 1.0)
        try:
            pending.verdict()
        except CheckpointError as exc:
            message = str(exc)
    seconds = time.perf_counter() - t0
    dist.barrier()
    owner.destroy()
    return {"message": message, "seconds": seconds}


def stock_fsdp2_job(rank, world, *, out) -> dict:
    """Stock FSDP2 + AdamW trains 2 steps and saves with DCP as torch's recipe does (a Stateful ``app``
    holding ``model`` and ``optim``; no ds_acco anywhere); a fresh ACCO trainer loads it and trains on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    from tests import fsdp_workloads as F
    from tests.log_capture import ds_acco_lines

    class App(Stateful):
        def __init__(self, model, opt):
            self.model, self.opt = model, opt

        def state_dict(self):
            model_sd, optim_sd = get_state_dict(self.model, self.opt)
            return {"model": model_sd, "optim": optim_sd}

        def load_state_dict(self, state_dict):
            raise NotImplementedError("saved only")

    ckpt = os.path.join(out, "stock_fsdp2")
    trajectory, model, opt = F.stock_fsdp(rank, world, G=2, steps=2, keep=True)
    dcp.save({"app": App(model, opt)}, checkpoint_id=ckpt)

    with ds_acco_lines() as captured:
        R = F.RESUME
        model, acco = F.build(world, R["config"], R["G"], R["clip"], R["schedule"])
        acco.load_checkpoint(ckpt)
    loaded = {"commits": acco.commits, "params_equal": states_equal([F._full(model)], [trajectory[-1]])}
    losses, k = [], 0
    while acco.commits < loaded["commits"] + 2:
        x, y = W.batch(rank, k)
        k += 1
        loss = W.loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        acco.after_micro_batch()
    acco.close()
    # the same checkpoint into ds_acco's stock front end ("enabled": false)
    model, stock = F.build(world, dict(R["config"], enabled=False), R["G"], R["clip"], R["schedule"])
    stock.load_checkpoint(ckpt)
    disabled = {"commits": stock.commits, "params_equal": states_equal([F._full_sharded(model)], [trajectory[-1]])}
    return dict(loaded, warnings=captured, losses=losses, files=sorted(os.listdir(ckpt)), disabled=disabled)


def flush_order_job(rank, world, *, folder) -> dict:
    """Write three files, hand them to a FileFinisher (fsync on) and write the manifest, recording the order of
    every fsync (by path) and of the manifest's rename; then the same with fsync off."""
    from ds_acco.checkpoint import manifest as checkpoint_manifest
    from ds_acco.checkpoint.files import FileFinisher
    from ds_acco.checkpoint.manifest import range_digests, write_manifest

    events: list = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), folder)))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.relpath(dst, folder)))
        return real_replace(src, dst)

    out = {}
    for durable in (True, False):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(os.path.join(folder, "sub"))
        events.clear()
        os.fsync, os.replace = fsync, replace
        try:
            finisher = FileFinisher(folder, durable)
            for name, size in (("a.pt", 3 << 20), ("sub/b.pt", 1000), ("c.pt", 0)):
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(os.urandom(size))
                finisher.add(os.path.join(folder, name))
            hashed = finisher.finish()
            write_manifest(folder, writer="test", tag="t", hashed=hashed, fsync=durable)
        finally:
            os.fsync, os.replace = real_fsync, real_replace
        manifest, bad = checkpoint_manifest.read_manifest(folder)
        out[durable] = {"events": list(events), "bad": bad,
                        "digests_match": all(manifest["files"][n]["digests"] == range_digests(os.path.join(folder, n))
                                             for n in ("a.pt", "sub/b.pt", "c.pt")),
                        "hashed": sorted(hashed)}
    return out


# ------------------------------------------------------------------ hashing in ranges, shared out
def range_share_job(rank, world, *, folder) -> dict:
    """Files hashed in 1 MiB ranges: a file every rank reads is split over the ranks; a damaged range that
    another rank hashed still refuses on every rank, by file and byte range; a format-1 manifest (one
    whole-file digest per file, as ds_acco wrote before ranges) verifies and refuses the same way."""
    from ds_acco.checkpoint import manifest as M
    from ds_acco.checkpoint.verify import verify_for_load

    hashed: list = []
    real_ranges, real_size = M.range_digests, M.RANGE_BYTES

    def logged(path, indices=None, algorithm=M.HASH, range_bytes=M.RANGE_BYTES):
        out = real_ranges(path, indices, algorithm, range_bytes)
        size = os.path.getsize(path)
        for i in (range(M.range_count(size, range_bytes)) if indices is None else indices):
            hashed.append((os.path.basename(path), i, min(range_bytes, size - i * range_bytes)))
        return out

    def load() -> str | None:
        hashed.clear()
        try:
            verify_for_load(folder, reads=["shared.bin", f"own{rank}.bin"], ours=True, salvage=False)
            return None
        except CheckpointError as exc:
            return str(exc)

    M.range_digests, M.RANGE_BYTES = logged, 1 << 20
    out: dict = {}
    try:
        if rank == 0:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "shared.bin"), "wb") as f:
                f.write(os.urandom((5 << 20) + 10))
        dist.barrier()
        with open(os.path.join(folder, f"own{rank}.bin"), "wb") as f:
            f.write(os.urandom(2 << 20))
        dist.barrier()
        M.write_manifest(folder, writer="test", tag="t", claim=[f"own{rank}.bin"])
        out["saved_units"] = sorted(hashed)
        out["intact"] = load()
        out["load_units"] = sorted(hashed)
        units = [None] * world
        dist.all_gather_object(units, out["load_units"])
        victim = next(u for u in units[-1] if u[0] == "shared.bin")  # a range the last rank hashed
        path = os.path.join(folder, "shared.bin")
        dist.barrier()
        if rank == 0:
            overwrite_at(path, victim[1] * (1 << 20) + 7)
        dist.barrier()
        out["victim"], out["damaged"] = victim, load()
        dist.barrier()
        if rank == 0:
            overwrite_at(path, victim[1] * (1 << 20) + 7)  # XOR again: intact
            manifest, _ = M.read_manifest(folder)
            manifest["format"] = 1
            for name, entry in manifest["files"].items():
                manifest["files"][name] = {"size": entry["size"], "digest": M.file_digest(os.path.join(folder, name))}
            del manifest["finite_at_save"]
            with open(os.path.join(folder, MANIFEST), "w") as f:
                json.dump(dict(manifest, seal=M._seal(manifest)), f)
        dist.barrier()
        out["format1_intact"] = load()
        dist.barrier()
        if rank == 0:
            overwrite_at(os.path.join(folder, "own1.bin"), 1000)
        dist.barrier()
        out["format1_damaged"] = load()
    finally:
        M.range_digests, M.RANGE_BYTES = real_ranges, real_size
    return out
