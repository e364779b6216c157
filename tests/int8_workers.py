"""Worker bodies for the int8 and streaming tests (run on real gloo processes).

Each returns plain tensors and numbers; the assertions live in the test files.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.func import functional_call

from tests import workloads as W

NUMEL, BLOCK = 1000, 64  # 1000 divides by neither 3 ranks nor 64-element blocks


def _contribution(rank: int, round_: int = 0) -> torch.Tensor:
    """A rank's buffer with magnitudes that differ by block (so the scales differ)."""
    g = torch.Generator().manual_seed(100 * rank + round_)
    return torch.randn(NUMEL, generator=g) * torch.randn(NUMEL, generator=g).exp()


def _group_checks(coll, members: int) -> dict:
    """Int8 reduce-scatter against fp32 and the exact sum; error feedback; the all-gather helper."""
    from ds_acco.comm.int8_collectives import Int8ReduceScatter, ShardAllGather

    rank = coll.rank
    rs = Int8ReduceScatter(NUMEL, members, block_size=BLOCK)
    chunk = rs.chunk
    everyone = [_contribution(r) for r in range(members)]  # what every rank contributes (for the bound)
    x = everyone[rank]

    sent0 = coll.wire.sent
    out = torch.empty(chunk)
    rs(coll, out, x)
    int8_bytes = coll.wire.sent - sent0

    padded = torch.zeros(chunk * members)
    padded[:NUMEL] = x
    fp32_out = torch.empty(chunk)
    sent0 = coll.wire.sent
    coll.reduce_scatter_sum(fp32_out, padded)
    fp32_bytes = coll.wire.sent - sent0

    # Error feedback: the same input every round (correlated gradients), 8 rounds.
    plain_rs, ef_rs = rs, Int8ReduceScatter(NUMEL, members, block_size=BLOCK, error_feedback=True)
    acc_plain, acc_ef = torch.zeros(chunk), torch.zeros(chunk)
    for _ in range(8):
        acc_plain += plain_rs(coll, torch.empty(chunk), x)
        acc_ef += ef_rs(coll, torch.empty(chunk), x)

    # int4 (acco's estimates): what each rank's quantisation lost, reduce-scattered in fp32, completes the sum
    rs4 = Int8ReduceScatter(NUMEL, members, block_size=BLOCK, bits=4)
    lost = torch.empty(NUMEL)
    sent0 = coll.wire.sent
    int4_out = rs4(coll, torch.empty(chunk), x, residual_out=lost)
    int4_bytes = coll.wire.sent - sent0
    padded_lost = torch.zeros(chunk * members)
    padded_lost[:NUMEL] = lost
    lost_sum = torch.empty(chunk)
    coll.reduce_scatter_sum(lost_sum, padded_lost)

    gathered = {}
    shard = torch.linspace(-1, 1, 37) * (rank + 1)
    for wire in ("fp32", "bf16", "int8"):
        ag = ShardAllGather(37, members, wire, block_size=16)
        full = torch.empty(37 * members)
        sent0 = coll.wire.sent
        ag(coll, full, shard)
        gathered[wire] = {"full": full, "bytes": coll.wire.sent - sent0, "expected": ag.bytes_per_call}
    return {
        "rank": rank, "chunk": chunk, "everyone": everyone, "int8": out, "fp32": fp32_out,
        "int8_bytes": int8_bytes, "fp32_bytes": fp32_bytes, "bytes_per_call": rs.bytes_per_call,
        "ef_rounds": 8, "acc_plain": acc_plain, "acc_ef": acc_ef, "gathered": gathered,
        "int4": int4_out, "int4_bytes": int4_bytes, "int4_bytes_per_call": rs4.bytes_per_call, "int4_lost": lost,
        "int4_lost_sum": lost_sum,
    }


def collective_checks(rank: int, world: int) -> dict:
    """On 3 ranks: the checks on a 2-rank subgroup (ranks 0, 1), then on all 3."""
    from ds_acco.comm.collectives import RoundCollectives

    torch.set_num_threads(1)
    results = {}
    pair = dist.new_group(ranks=[0, 1])  # every rank takes part in new_group, members or not
    if rank < 2:
        results[2] = _group_checks(RoundCollectives(pair, 60.0), 2)
    else:
        dist.new_group(ranks=[0, 1], timeout=timedelta(seconds=60.0))  # matches RoundCollectives' own new_group
    results[world] = _group_checks(RoundCollectives(None, 60.0), world)
    return results


def int8_training(rank: int, world: int, *, G: int, steps: int, fp32_steps: int) -> dict:
    """The tiny acco job with int8 and int8 + error feedback gradient rounds, and a short
    fp32 run for its bytes (its trajectory is the reference's, tested in test_exactness)."""
    base = {"mode": "acco", "policy": "fixed"}
    runs = {
        "fp32": (base, fp32_steps),
        "int8": (dict(base, comm_quantization="int8"), steps),
        "int8_ef": (dict(base, comm_quantization="int8", error_feedback=True), steps),
    }
    return {name: W.train_with_engine(rank, world, config=cfg, G=G, steps=n) for name, (cfg, n) in runs.items()}


# ---------------------------------------------------------------- streaming
INNER_LR = 0.02


def make_inner_optimizer(params):
    return torch.optim.AdamW(params, lr=INNER_LR)


def streaming_grad_fn(model):
    """``grad_fn(worker, k, params)`` over ``model.parameters()`` order, for the reference."""
    names = [n for n, _ in model.named_parameters()]

    def grad_fn(worker, k, params):
        x, y = W.batch(worker, k)
        ps = [p.detach().requires_grad_(True) for p in params]
        loss = W.loss_fn(functional_call(model, dict(zip(names, ps)), (x,)), y)
        return torch.autograd.grad(loss, ps)

    return grad_fn


def train_streaming(rank: int, world: int, *, config: dict, steps: int) -> dict:
    """``steps`` inner steps of the tiny model under ds_acco.streaming; θ_i after each step."""
    from ds_acco import streaming

    torch.manual_seed(rank)  # replicas start different: the engine must broadcast rank 0's θ_0
    model = W.make_model(seed=rank)
    engine = streaming.build(model, torch.optim.AdamW, {"lr": INNER_LR}, config=config)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    fragments = [[index[id(p)] for p in f.params] for f in engine.fragments]
    schedule = [engine.fragment_at(s) for s in range(1, steps + 1)]
    trajectory = []
    try:
        for k in range(steps):
            x, y = W.batch(rank, k)
            W.loss_fn(model(x), y).backward()
            engine.inner_optimizer.step()
            engine.inner_optimizer.zero_grad(set_to_none=True)
            engine.after_inner_step()
            trajectory.append([p.detach().clone() for p in model.parameters()])
        engine.finish()
    finally:
        engine.close()
    records = [(r.step, r.fragment, r.applied_step, r.bytes_sent) for r in engine.telemetry.records]
    return {"trajectory": trajectory, "fragments": fragments, "schedule": schedule, "records": records,
            "summary": engine.summary(), "piece_bytes": engine.coll.piece_bytes}


def streaming_runs(rank: int, world: int, *, configs: dict, steps: int) -> dict:
    """Several streaming configs one after another in the same processes."""
    torch.set_num_threads(1)
    return {name: train_streaming(rank, world, config=cfg, steps=steps) for name, cfg in configs.items()}


# ---------------------------------------------------------------- one job for every test
WORLD = 3
TRAIN_STEPS, TRAIN_G = 10, 4
STREAM_STEPS = 12


def _streaming(**block) -> dict:
    return {"mode": "streaming", "streaming": block}


STREAM_CONFIGS = {
    # plain DiLoCo: one fragment, blocking, θ_i ← θ_g, fp32 both ways
    "diloco": _streaming(fragments=1, sync_every=3, overlap_steps=0, alpha=0.0, quantize="none",
                         all_gather_dtype="fp32"),
    # two fragments, merged one inner step after launch, fp32 both ways
    "fragments": _streaming(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5, quantize="none",
                            all_gather_dtype="fp32"),
    # the same schedule with int8 pseudo-gradients and a bf16 all-gather (the defaults)
    "int8": _streaming(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5),
}


def everything(rank: int, world: int) -> dict:
    """Every distributed check of test_int8.py and test_streaming.py in one 3-rank job
    (starting processes is most of the cost on a shared 2-core machine)."""
    torch.set_num_threads(1)
    return {
        "collectives": collective_checks(rank, world),
        "training": int8_training(rank, world, G=TRAIN_G, steps=TRAIN_STEPS, fp32_steps=2),
        "streaming": streaming_runs(rank, world, configs=STREAM_CONFIGS, steps=STREAM_STEPS),
    }


@functools.lru_cache(maxsize=1)
def shared_run() -> tuple:
    """Run :func:`everything` once per pytest process; both test modules read its results."""
    from tests.dist_harness import run_distributed

    return tuple(run_distributed(everything, WORLD, timeout=240))
