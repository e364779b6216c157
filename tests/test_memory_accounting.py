"""The bytes a round engine holds match the analytic memory model (benchmarks/memory/model.py).

Every tensor reachable from the engine (its buffers, the front end's compute
parameters and master shards, the optimizer's state, the lookahead's scratch) is
counted once per storage, after rounds have run in every mode of the model's
configs, so buffers allocated lazily are counted too.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.memory import model as memory
from tests.dist_harness import run_distributed

CASES = {  # memory-model config: (parameter dtype, acco block)
    "sync": (torch.float32, {"mode": "sync"}),
    "dpu": (torch.float32, {"mode": "dpu"}),
    "acco_fixed": (torch.float32, {"mode": "acco"}),
    "acco_bf16": (torch.bfloat16, {"mode": "acco", "grad_accum_dtype": "bf16", "comm_dtype": "bf16"}),
    "acco_bf16_fp32acc": (torch.bfloat16, {"mode": "acco", "grad_accum_dtype": "fp32", "comm_dtype": "bf16"}),
}


def _storages(obj, seen_objs: set, found: dict) -> None:
    """Collect ``{storage pointer: bytes}`` of every tensor reachable from ``obj`` through ds_acco objects."""
    if id(obj) in seen_objs:
        return
    seen_objs.add(id(obj))
    if torch.is_tensor(obj):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        storage = local.untyped_storage()
        found[storage.data_ptr()] = storage.nbytes()
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            _storages(k, seen_objs, found)
            _storages(v, seen_objs, found)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _storages(v, seen_objs, found)
    elif isinstance(obj, torch.optim.Optimizer):
        _storages(obj.state, seen_objs, found)
        _storages(obj.param_groups, seen_objs, found)
    elif type(obj).__module__.startswith("ds_acco") and hasattr(obj, "__dict__"):
        for name, v in vars(obj).items():
            if name not in ("coll", "telemetry", "_comm"):  # process group, records, thread: no buffers
                _storages(v, seen_objs, found)


def held_bytes(engine) -> int:
    found: dict = {}
    _storages(engine, set(), found)
    return sum(found.values())


def _measure(rank, world, *, config_name, dtype, acco, steps):
    from ds_acco import plain

    torch.manual_seed(0)
    model = nn.Linear(64, 48).to(dtype)  # one group: 3120 parameters, padded to a multiple of N
    engine = plain.build([{"params": list(model.parameters()), "weight_decay": 0.1}], torch.optim.AdamW,
                         {"lr": 1e-3}, config=acco, gradient_accumulation_steps=4)
    g = torch.Generator().manual_seed(rank)
    try:
        while engine.commits < steps:
            x = torch.randn(2, 64, generator=g).to(dtype)
            model(x).square().mean().backward()
            engine.after_micro_batch()
        held = held_bytes(engine)  # a round is in flight in dpu and acco: its buffers are all live
    finally:
        engine.close()
    return held, engine.groups[0].layout.padded_numel


def _measure_fsdp(rank, world, *, steps):
    """acco on the FSDP2 front end: one ``fully_shard`` unit, torch AdamW over its DTensor shards."""
    from torch.distributed.device_mesh import init_device_mesh

    from ds_acco.fsdp import acco_fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48))  # one packed unit of 3120 parameters, as above
    acco = acco_fully_shard(model, mesh=init_device_mesh("cpu", (world,)), acco_config={"mode": "acco"},
                            gradient_accumulation_steps=4, optimizer_kwargs={"lr": 1e-3, "weight_decay": 0.1})
    g = torch.Generator().manual_seed(rank)
    try:
        while acco.commits < steps:
            model(torch.randn(2, 64, generator=g)).square().mean().backward()
            acco.after_micro_batch()
        held = held_bytes(acco)  # front end, engine and optimizer; FSDP2's own objects are not walked
    finally:
        acco.close()
    return held, sum(g.layout.padded_numel for g in acco.engine.groups)


def _check(name: str, world: int, held: int, padded: int, **kwargs) -> None:
    analytic = memory.total(name, world, padded, **kwargs)
    assert held == pytest.approx(analytic, rel=0.02), (
        f"{name} {kwargs}: engine holds {held} bytes, model says {analytic:.0f} "
        f"({memory.components(name, world, padded, **kwargs)})")


def test_engine_holds_what_the_memory_model_says():
    world = 2
    for name, (dtype, acco) in CASES.items():
        held, padded = run_distributed(_measure, world, config_name=name, dtype=dtype, acco=acco, steps=3,
                                       timeout=120)[0]
        _check(name, world, held, padded)
    # FSDP2: no lookahead snapshot either (it would be 12 P/N, a quarter of the total here)
    held, padded = run_distributed(_measure_fsdp, world, steps=3, timeout=120)[0]
    _check("acco_fixed", world, held, padded, packed=True)


def _chunked_collectives(rank, world):
    """Chunked cast reduce-scatter and pieced in-place all-gather against the one-shot collectives."""
    import ds_acco.comm.collectives as collectives
    from ds_acco.comm.chunked_cast import ChunkedCastReduceScatter
    from ds_acco.comm.collectives import RoundCollectives

    coll = RoundCollectives(None, 60.0)
    try:
        S = 1001  # shard elements: several ragged chunks and pieces
        g = torch.Generator().manual_seed(rank)
        full = torch.randn(world * S, generator=g)
        want = torch.empty(S, dtype=torch.bfloat16)
        coll.reduce_scatter_sum(want, full.to(torch.bfloat16))
        got = torch.full((S,), float("nan"))
        ChunkedCastReduceScatter(world * S, world, torch.bfloat16, full.device, chunk_elems=300)(coll, got, full)
        same_sum = torch.equal(got, want.float())

        params = torch.full((world * S,), -1.0)
        params[rank * S:(rank + 1) * S] = torch.arange(S) + 10_000.0 * rank
        old = collectives.MAX_PIECE_NUMEL
        collectives.MAX_PIECE_NUMEL = 128
        try:
            coll.all_gather(params, params[rank * S:(rank + 1) * S])  # in place, in pieces
        finally:
            collectives.MAX_PIECE_NUMEL = old
        gathered = all(torch.equal(params[r * S:(r + 1) * S], torch.arange(S) + 10_000.0 * r) for r in range(world))
        return same_sum, gathered
    finally:
        coll.destroy()


def test_chunked_cast_and_pieced_all_gather_equal_the_one_shot_collectives():
    for same_sum, gathered in run_distributed(_chunked_collectives, 3, timeout=120):
        assert same_sum and gathered
