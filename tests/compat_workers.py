"""Checkpoints a release wrote, resumed by this one: the jobs behind tests/data/pre_issue48/ and the test that loads it.

The same functions wrote the files (run once on the code before issue 48's refactor: tests/data/pre_issue48/README.md
says how) and resume from them now, so a resume that is not bit-identical shows a change of format or of
trajectory. Self-contained (its own model, data and configs): the files must keep meaning what they meant.
"""

from __future__ import annotations

import os

import torch
from torch import nn

G, MICRO, SAVE_AT, MICRO_BATCHES = 4, 4, 11, 30
"""Accumulation, micro-batch size, the micro-batch before which the checkpoint is written (a round in flight), and
micro-batches in all."""
PLAIN = {
    # kept estimate, int8 residuals and what an int4 estimate lost, all in the round state
    "lowbit": {"mode": "acco", "warmup_steps": 1, "comm_quantization": "int8", "error_feedback": True,
               "all_gather_quantization": "int8", "estimate_quantization": "int4", "quantization_block_size": 8},
    "dpu": {"mode": "dpu", "warmup_steps": 1},
}
DEEPSPEED = {"mode": "acco", "warmup_steps": 1}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def batch(rank: int, k: int):
    gen = torch.Generator().manual_seed(1000 * rank + k)
    return torch.randn(MICRO, 6, generator=gen), torch.randn(MICRO, 3, generator=gen)


def loss(net, rank: int, k: int) -> torch.Tensor:
    x, y = batch(rank, k)
    return ((net(x) - y) ** 2).mean()


def plain_job(rank, world, *, name: str, folder: str, write: bool) -> list:
    """``write``: train from the start and save before micro-batch :data:`SAVE_AT`; else resume from that file.
    Returns the compute parameters after every swap from the save on, and after ``finish()``."""
    import ds_acco
    from ds_acco import plain

    net = model()
    engine = plain.build(net.parameters(), torch.optim.AdamW, {"lr": 1e-2}, config=PLAIN[name],
                         gradient_accumulation_steps=G, clip_grad_norm=0.5,
                         lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, 0.5))
    path = os.path.join(folder, f"plain_{name}_rank{rank}.pt")
    start = 0 if write else SAVE_AT
    if not write:
        plain.load_state_dict(engine, torch.load(path, map_location="cpu", weights_only=True))
    after = []
    for k in range(start, MICRO_BATCHES):
        if write and k == SAVE_AT:
            torch.save(plain.state_dict(engine), path)
        loss(net, rank, k).backward()
        if engine.after_micro_batch() and k >= SAVE_AT:
            after.append([g.flat.clone() for g in engine.groups])
    engine.finish()
    after.append([g.flat.clone() for g in engine.groups])
    engine.close()
    return [after, ds_acco.__file__]


def ds_config(world: int) -> dict:
    return {
        "train_batch_size": MICRO * G * world, "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": G, "gradient_clipping": 0.5, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.02,
                                                     "warmup_num_steps": 5, "warmup_type": "linear"}},
        "steps_per_print": 10_000, "wall_clock_breakdown": False, "acco": DEEPSPEED,
    }


def deepspeed_job(rank, world, *, folder: str, write: bool) -> list:
    """As :func:`plain_job`, through ``ds_acco.initialize`` and DeepSpeed's ``save_checkpoint``/``load_checkpoint``
    (tag ``pre``); returns the module's parameters after every optimizer step from the save on."""
    import ds_acco

    net = model()
    engine = ds_acco.initialize(model=net, model_parameters=net.parameters(), config=ds_config(world))[0]
    start = 0
    if not write:
        _, client = engine.load_checkpoint(folder, tag="pre")
        start = client["k"]
    after = []
    for k in range(start, MICRO_BATCHES):
        if write and k == SAVE_AT:
            engine.save_checkpoint(folder, tag="pre", client_state={"k": k})
        before = engine.global_steps
        engine.backward(loss(engine, rank, k))
        engine.step()
        if engine.global_steps > before and k >= SAVE_AT:
            after.append([p.detach().clone() for p in engine.module.parameters()])
    engine.finish()
    after.append([p.detach().clone() for p in engine.module.parameters()])
    engine.destroy()
    return [after, ds_acco.__file__]


def write_fixtures(folder: str) -> None:
    """Run every job with ``write=True`` (2 ranks) and keep, beside its checkpoint, each rank's parameters after the
    save (``*.after.pt``): what a resume must reproduce bit for bit."""
    import shutil

    from tests.dist_harness import run_distributed

    os.makedirs(folder, exist_ok=True)
    runs = {f"plain_{name}": run_distributed(plain_job, 2, name=name, folder=folder, write=True) for name in PLAIN}
    runs["deepspeed"] = run_distributed(deepspeed_job, 2, folder=os.path.join(folder, "deepspeed"), write=True)
    for label, got in runs.items():
        for rank, (after, where) in enumerate(got):
            print(label, rank, len(after), "steps after the save, written by", where)
            torch.save(after, os.path.join(folder, f"{label}_rank{rank}.after.pt"))
    for debris in ("zero_to_fp32.py", "zero_to_torch.py", "latest"):  # recovery scripts, tag pointer: not the tag
        path = os.path.join(folder, "deepspeed", debris)
        if os.path.isfile(path):
            os.remove(path)
    shutil.rmtree(os.path.join(folder, "deepspeed", "__pycache__"), ignore_errors=True)
