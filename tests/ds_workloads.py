"""DeepSpeed-engine runs of the tiny job in tests/workloads.py (real DeepSpeed, gloo on CPU)."""

from __future__ import annotations

import os

import torch

from tests import workloads as W


def ds_config(G: int, acco: dict | None = None, clip: float = 0.0, dtype: str = "fp32", scheduler: bool = False):
    cfg = {
        "train_micro_batch_size_per_gpu": W.BATCH,
        "gradient_accumulation_steps": G,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "torch_adam": True}},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": 1}
    if scheduler:
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.02,
                                                           "warmup_num_steps": 5, "warmup_type": "linear"}}
    if acco is not None:
        cfg["acco"] = acco
    return cfg


def train_ds(rank, world, *, config, steps, use_ds_acco=True, save_at=None, ckpt_dir=None, resume=False,
             torch_style_backward=False, save_every=None, kill_in_save=None, single_group=False, poison=None,
             hid=W.HID):
    """Return module parameters after each optimizer step (and telemetry counts when ACCO is on); ``hid``: the
    model's hidden width."""
    import deepspeed

    import ds_acco

    model = W.make_model(hid=hid)
    init = ds_acco.initialize if use_ds_acco else deepspeed.initialize
    groups = list(model.parameters()) if single_group else W.param_groups(model)
    engine, _, _, _ = init(model=model, model_parameters=groups, config=config)
    dtype = next(engine.module.parameters()).dtype
    trajectory, k, extra = [], 0, {}
    if resume:
        _, client = engine.load_checkpoint(ckpt_dir)
        k, trajectory = client.get("k", 0), client.get("trajectory", [])
        extra["loaded_params"] = [p.detach().float().clone() for p in W.ordered_params(engine.module)]
        extra["loaded_steps"] = engine.global_steps
        extra["loaded_masters"] = full_masters(engine)
        extra["probe_loss"] = _probe_loss(engine, dtype)
    while engine.global_steps < steps:
        if save_at is not None and k == save_at:
            engine.save_checkpoint(ckpt_dir, client_state={"k": k, "trajectory": trajectory})
            extra["masters"] = full_masters(engine)
            extra["saved_params"] = [p.detach().float().clone() for p in W.ordered_params(engine.module)]
            extra["probe_loss"] = _probe_loss(engine, dtype)
            break
        x, y = W.batch(rank, k)
        k += 1
        loss = W.loss_fn(engine(x.to(dtype)), y.to(dtype))
        if poison is not None and (rank, k - 1) == tuple(poison):
            loss = loss * float("inf")
        before = engine.global_steps
        if torch_style_backward:
            loss.backward()
        else:
            engine.backward(loss)
        engine.step()
        if engine.global_steps > before:
            trajectory.append([p.detach().float().clone() for p in W.ordered_params(engine.module)])
            if save_every and engine.global_steps % save_every == 0:
                saves = extra.setdefault("saves", 0) + 1
                extra["saves"] = saves
                if saves == kill_in_save:
                    _die_after_first_file(engine)
                engine.save_checkpoint(ckpt_dir, client_state={"k": k, "trajectory": trajectory})
    acco = getattr(engine, "acco", None)
    out = {**extra, "trajectory": trajectory, "global_samples": engine.global_samples, "k": k,
           "lr": engine.get_lr()[0], "optimizer": type(engine.optimizer).__name__,
           "skipped_steps": engine.skipped_steps,
           "loss_scale": float(getattr(engine.optimizer, "loss_scale", 1.0))}
    if acco is not None:
        acco.close()
        out["counts"] = [r.counts for r in acco.telemetry.records]
        out["modes"] = [r.mode for r in acco.telemetry.records if r.kind == "commit"]
        out["summary"] = acco.telemetry.summary()
        out["accum_dtypes"] = sorted({str(dt) for dt in acco.grads.dtypes})
        out["choices"] = acco.auto.choices if acco.auto is not None else []
    engine.destroy()
    return out


def full_masters(engine) -> dict:
    """name -> full fp32 master value, gathered from every rank's ZeRO-1 partition."""
    import torch.distributed as dist

    opt = engine.optimizer
    names = {id(p): n for n, p in engine.module.named_parameters()}
    out = {}
    for i, part in enumerate(opt.single_partition_of_fp32_groups):
        full = torch.empty(part.numel() * dist.get_world_size(), dtype=torch.float32)
        dist.all_gather_into_tensor(full, part.detach().float().contiguous())
        for p, off in zip(opt.round_robin_bit16_groups[i], opt.round_robin_bit16_offsets[i]):
            out[names[id(p)]] = full[off:off + p.numel()].view(p.shape).clone()
    return out


def _die_after_first_file(engine) -> None:
    """Make this process SIGKILL itself right after the checkpoint's first file is written."""
    import signal

    real_save = engine.checkpoint_engine.save

    def save_then_die(*a, **kw):
        real_save(*a, **kw)
        os.kill(os.getpid(), signal.SIGKILL)

    engine.checkpoint_engine.save = save_then_die


def _probe_loss(engine, dtype) -> float:
    x, y = W.batch(99, 0)
    with torch.no_grad():
        return float(W.loss_fn(engine.module(x.to(dtype)), y.to(dtype)))


def _ds_engine(config):
    import ds_acco

    model = W.make_model()
    engine, _, _, _ = ds_acco.initialize(model=model, model_parameters=W.param_groups(model), config=config)
    return engine


def _micro_batch(engine, rank, k) -> None:
    x, y = W.batch(rank, k)
    engine.backward(W.loss_fn(engine(x), y))
    engine.step()


def _zero_to_fp32(ckpt: str) -> dict:
    """What DeepSpeed's zero_to_fp32 reads from a checkpoint, detached (results cross a process boundary)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return {k: v.detach().clone() for k, v in get_fp32_state_dict_from_zero_checkpoint(ckpt).items()}


def exports_after_loop(rank, world, *, configs, micro_batches, ckpt_root):
    """For each config and loop length: ``module.state_dict()`` and ``save_16bit_model`` right after the
    loop (no finish), then a checkpoint; every rank reads the checkpoint back with zero_to_fp32."""
    import torch.distributed as dist

    out = []
    for name, config in configs.items():
        for m in micro_batches:
            engine = _ds_engine(config)
            for k in range(m):
                _micro_batch(engine, rank, k)
            in_flight = engine.acco._inflight.kind if engine.acco.in_flight else None
            exported = {k: v.clone() for k, v in engine.module.state_dict().items()}
            found = engine.acco.committed_buffers()  # which buffers the export read (for a failure's message)
            path = "all-gathered masters" if found is None else (
                "compute buffers" if found[0] is engine.acco.groups[0].flat else "landing buffers")
            path += f", round {engine.acco._round_index}, in flight {engine.acco._inflight and engine.acco._inflight.kind}"
            compute = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
            ckpt = os.path.join(ckpt_root, f"{name}_{m}")
            engine.save_16bit_model(ckpt, "model16.bin")
            engine.save_checkpoint(ckpt)
            dist.barrier()
            row = {"config": name, "micro_batches": m, "in_flight": in_flight, "exported": exported,
                   "compute": compute, "path": path}
            row["zero_to_fp32"] = _zero_to_fp32(ckpt)  # every rank reads it: each export is checked
            row["model16"] = torch.load(os.path.join(ckpt, "model16.bin"), map_location="cpu")
            engine.acco.close()
            engine.destroy()
            out.append(row)
    return out


def export_after_a_rank_ran_ahead(rank, world, *, config, micro_batches, ckpt_dir):
    """Rank 0 runs one micro-batch more than the others, then every rank exports, evaluates on the committed
    parameters, saves and finishes.

    With ``max_micro_batches_per_round: 1`` every micro-batch ends the round in flight and launches the
    next, so after ``micro_batches`` every rank has the same round in flight (a commit after an odd count,
    an estimate after an even one); rank 0's extra micro-batch swaps it in and launches the next, and the
    others swap theirs in inside the export (the catch-up)."""
    import torch.distributed as dist

    engine = _ds_engine(config)
    for k in range(micro_batches + (rank == 0)):
        _micro_batch(engine, rank, k)
    acco = engine.acco
    before = (acco._round_index, acco._inflight.kind if acco.in_flight else None)
    exported = {k: v.clone() for k, v in engine.module.state_dict().items()}
    after = (acco._round_index, acco._inflight.kind if acco.in_flight else None)
    masters = full_masters(engine)
    with engine.committed_parameters(), torch.no_grad():
        evaluated = engine.module(W.batch(99, 0)[0]).clone()
    engine.save_checkpoint(ckpt_dir)
    dist.barrier()
    engine.finish()
    out = {"before": before, "after": after, "exported": exported, "masters": masters, "evaluated": evaluated,
           "finished": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
           "finished_masters": full_masters(engine), "steps": engine.global_steps}
    if rank == 0:
        out["zero_to_fp32"] = _zero_to_fp32(ckpt_dir)
    acco.close()
    engine.destroy()
    return out


def trajectory_with_exports(rank, world, *, config, steps, export_every, ckpt_dir):
    """Parameters after each commit of a run that exports every ``export_every`` micro-batches
    (state_dict, a checkpoint, an evaluation on the committed parameters), and of one that never does."""
    runs = {}
    for label, every in (("plain", None), ("exports", export_every)):
        engine = _ds_engine(config)
        trajectory, k = [], 0
        while engine.global_steps < steps:
            before = engine.global_steps
            _micro_batch(engine, rank, k)
            k += 1
            if engine.global_steps > before:
                trajectory.append([p.detach().clone() for p in W.ordered_params(engine.module)])
            if every and k % every == 0:
                engine.module.state_dict()
                engine.save_checkpoint(ckpt_dir)
                with engine.committed_parameters(), torch.no_grad():
                    engine.module(W.batch(99, 0)[0])
        runs[label] = trajectory
        engine.acco.close()
        engine.destroy()
    return runs


def adaptive_schedule(rank, world, *, config, steps):
    """``steps * G`` micro-batches per rank under the adaptive policy, then finish(): scheduler advances,
    committed micro-batches and the final learning rate."""
    engine = _ds_engine(config)
    G = engine.gradient_accumulation_steps()
    start = engine.lr_scheduler.last_batch_iteration
    for k in range(steps * G):
        _micro_batch(engine, rank, k)
    engine.finish()
    records = list(engine.acco.telemetry.records)
    out = {"advances": engine.lr_scheduler.last_batch_iteration - start, "lr": engine.get_lr()[0],
           "committed": sum(sum(r.counts) for r in records), "summary": engine.acco.telemetry.summary(), "G": G}
    engine.acco.close()
    engine.destroy()
    return out
