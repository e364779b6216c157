"""Shared by the auto-to-streaming tests (tests/test_auto_streaming.py, the CUDA and first-look tests): the
switch's settings, the reference it must follow, and the optimizer-state exchange the switch makes."""

from __future__ import annotations

import copy

import torch

from ds_acco.reference import ReferenceRun, reference_schedule
from ds_acco.reference.streaming import streaming_reference
from tests import workloads as W

G, COMPUTE_S, SWITCH = 4, 0.05, 6
STREAM = {"fragments": 2, "sync_every": 6, "overlap_steps": 1, "quantize": "none", "all_gather_dtype": "fp32"}
CONFIG = {"mode": "auto", "auto": {"measure_steps": SWITCH, "check_every": 2, "streaming": True}, "streaming": STREAM}
FRAGMENTS = [[0, 2], [1, 3]]  # ordered_params is (w1, w2, b1, b2); the default split is one Linear per fragment


def reference(steps: int, world: int = 2, switch: int = SWITCH, inner_G: int = G):
    """The sync reference for ``switch`` steps of ``G`` micro-batches, then the streaming reference from its state,
    each inner step one mean of ``inner_G`` micro-batches."""
    model = W.make_model()
    run = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer, world)
    sync = reference_schedule(run, ["sync"] * switch, G)
    state = copy.deepcopy(run.opt.state_dict())
    grad = W.reference_grad_fn(model)

    def mean_grad(worker, j, params):  # inner step j: micro-batches switch·G + j·inner_G ... of this worker, a mean
        total = None
        for i in range(inner_G):
            g = grad(worker, switch * G + j * inner_G + i, params)
            total = [t.clone() for t in g] if total is None else [a.add_(b) for a, b in zip(total, g)]
        return [t.mul_(1.0 / inner_G) for t in total]

    def inner(params):
        opt = W.make_reference_optimizer(params)
        opt.load_state_dict(copy.deepcopy(state))  # load_state_dict keeps same-device tensors: one copy each
        return opt

    trace = streaming_reference(run.theta, mean_grad, inner, world, FRAGMENTS, steps - switch, sync_every=STREAM[
        "sync_every"], overlap_steps=STREAM["overlap_steps"], first_step=switch)
    return sync, trace


def phase_state(rank, world, *, all_gather_dtype, piece, device="cpu"):
    """Train three sync steps of a two-layer model, build the phase by hand (pieces of ``piece`` elements) and
    return its inner optimizer's state next to the shard states all-gathered exactly (flat, rank-major)."""
    from ds_acco import plain
    from ds_acco.comm import int8_collectives

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 50), torch.nn.Tanh(), torch.nn.Linear(50, 30)).to(device)
    config = dict(CONFIG, auto=dict(CONFIG["auto"], measure_steps=50), streaming=dict(
        STREAM, all_gather_dtype=all_gather_dtype))
    engine = plain.build(model.parameters(), torch.optim.AdamW, {"lr": 1e-2}, config=config,
                         gradient_accumulation_steps=2, model=model)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(6):
        model(torch.randn(8, 40, generator=gen).to(device) * 10).pow(2).mean().backward()
        engine.after_micro_batch()
    opt, out = engine.shard_optimizer.optimizer, {"want": {}, "got": {}}
    for gi, g in enumerate(engine.groups):
        for key in ("exp_avg", "exp_avg_sq"):
            full = g.layout.new_buffer(g.flat)
            engine.coll.all_gather(full, opt.state[g.master][key].reshape(-1))
            out["want"][gi, key] = full.cpu()
    int8_collectives.LOG_PIECE, saved = piece, int8_collectives.LOG_PIECE
    try:
        phase = engine.streaming_factory(engine.groups, engine.shard_optimizer, config=engine.config,
                                         process_group=engine.coll.group, G=2, clip=0.0, on_stop=lambda: None)
        phase._ready()
    finally:
        int8_collectives.LOG_PIECE = saved
    for gi, g in enumerate(engine.groups):
        for key in ("exp_avg", "exp_avg_sq"):
            full = g.layout.new_buffer(g.flat)
            for p, v in zip(g.params, g.layout.views(full)):
                v.copy_(phase.inner.state[p][key])
            out["got"][gi, key] = full.cpu()
    out["bytes"], out["shard_numel"] = phase.gathered_bytes, [g.layout.shard_numel for g in engine.groups]
    phase.leave()
    engine.close()
    return out


def assert_state_within_one_byte_bounds(r: dict, world: int) -> None:
    """Each block of each rank's shard: second-moment values within the block's log factor (zeros exact, no
    positive value lost), first-moment values within the block's absmax / 254."""
    for (gi, key), want in r["want"].items():
        got, n = r["got"][gi, key], r["shard_numel"][gi]
        for a in (a for row in range(world) for a in range(row * n, (row + 1) * n, 256)):
            end = min(a + 256, (a // n + 1) * n)
            w, g = want[a:end], got[a:end]
            if key == "exp_avg":
                assert float((g - w).abs().max()) <= float(w.abs().max()) / 254 * 1.0001
                continue
            positive = w > 0
            assert torch.equal(g == 0, ~positive)
            if positive.any():
                logs = w[positive].log2()
                factor = 2 ** (float(logs.max() - logs.min()) / 508) * 1.0001
                assert float((g[positive] / w[positive]).max()) <= factor
                assert float((w[positive] / g[positive]).max()) <= factor
        assert not torch.equal(got, want)
