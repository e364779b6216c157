"""A tiny deterministic job shared by the exactness tests and the reference.

Two parameter groups (weights with weight decay, biases without) whose sizes
(35 and 8 elements) divide by neither 2 nor 3 ranks at once, so shard padding
is exercised. Worker ``w``'s ``k``-th micro-batch is a pure function of
``(w, k)``, so the distributed run and the single-process reference see the
same data in the same order.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.func import functional_call

IN, HID, OUT, BATCH = 4, 5, 3, 4


def make_model(seed: int = 0, hid: int = HID) -> nn.Module:
    """``hid``: a wider hidden layer where a test needs a round's bytes to count on a shaped link."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, hid), nn.Tanh(), nn.Linear(hid, OUT))


def batch(worker: int, k: int):
    g = torch.Generator().manual_seed(1_000_003 * worker + k)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.randn(BATCH, OUT, generator=g)
    return x, y


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def param_groups(model: nn.Module) -> list[dict]:
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}]


def ordered_params(model: nn.Module) -> list[torch.Tensor]:
    """Parameters in param-group order (weights, then biases)."""
    return [p for g in param_groups(model) for p in g["params"]]


def make_reference_optimizer(params):
    n_w = 2  # two weight matrices come first in ordered_params
    return torch.optim.AdamW([{"params": params[:n_w], "weight_decay": 0.1},
                              {"params": params[n_w:], "weight_decay": 0.0}], lr=0.02)


OPT_KWARGS = {"lr": 0.02}


def decay_schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.3 * s))


def reference_grad_fn(model: nn.Module):
    names = [n for n, _ in sorted(model.named_parameters(), key=lambda kv: not kv[0].endswith("weight"))]

    def grad_fn(worker, k, params):
        x, y = batch(worker, k)
        ps = [p.detach().requires_grad_(True) for p in params]
        loss = loss_fn(functional_call(model, dict(zip(names, ps)), (x,)), y)
        return torch.autograd.grad(loss, ps)

    return grad_fn


def train_with_engine(rank, world, *, config, G, steps, clip=0.0, schedule=False,
                      slow_rank=None, slow_s=0.0, dtype=torch.float32, save_at=None, ckpt_dir=None,
                      resume=False, poison=None, device="cpu"):
    """Train the tiny job with ds_acco.plain; return θ after each commit and the round records."""
    from ds_acco import plain

    model = make_model().to(device=device, dtype=dtype)
    engine = plain.build(param_groups(model), torch.optim.AdamW, OPT_KWARGS, config=config,
                         gradient_accumulation_steps=G, clip_grad_norm=clip,
                         lr_scheduler=decay_schedule if schedule else None)
    trajectory, k, grads_bound = [], 0, []
    if resume:
        state = torch.load(f"{ckpt_dir}/rank{rank}.pt", weights_only=False)
        plain.load_state_dict(engine, state["engine"])
        k, trajectory = state["k"], state["trajectory"]
    try:
        while engine.commits < steps:
            if save_at is not None and k == save_at:
                torch.save({"engine": plain.state_dict(engine), "k": k, "trajectory": list(trajectory)},
                           f"{ckpt_dir}/rank{rank}.pt")
                break
            x, y = batch(rank, k)
            x, y = x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)
            k += 1
            if slow_rank == rank:
                time.sleep(slow_s)
            loss = loss_fn(model(x), y)
            if poison is not None and (rank, k - 1) == tuple(poison):
                loss = loss * float("nan")
            loss.backward()
            before = engine.commits
            engine.after_micro_batch()
            if engine.commits > before:
                trajectory.append([p.detach().float().cpu().clone() for p in ordered_params(model)])
                grads_bound = [p.grad is not None for p in ordered_params(model)]
    finally:
        engine.close()  # drains the round in flight, so its counts are recorded too
    records = [r.counts for r in engine.telemetry.records]
    kinds = [r.kind for r in engine.telemetry.records]
    summary = engine.telemetry.summary()
    skipped = [r.skipped for r in engine.telemetry.records]
    return {"grads_bound": grads_bound, "trajectory": trajectory, "counts": records, "kinds": kinds, "summary": summary, "micro_batches": k,
            "skipped": skipped}
