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
             torch_style_backward=False, save_every=None, kill_in_save=None, single_group=False, poison=None):
    """Return module parameters after each optimizer step (and telemetry counts when ACCO is on)."""
    import deepspeed

    import ds_acco

    model = W.make_model()
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
        extra["loaded_masters"] = _full_masters(engine)
        extra["probe_loss"] = _probe_loss(engine, dtype)
    while engine.global_steps < steps:
        if save_at is not None and k == save_at:
            engine.save_checkpoint(ckpt_dir, client_state={"k": k, "trajectory": trajectory})
            extra["masters"] = _full_masters(engine)
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
        out["summary"] = acco.telemetry.summary()
        out["accum_dtypes"] = sorted({str(dt) for dt in acco.grads.dtypes})
    engine.destroy()
    return out


def _full_masters(engine) -> dict:
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
