"""Worker bodies for tests/test_lowbit.py (real gloo processes; assertions live in the test file)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from tests import workloads as W

SHARD, BLOCK = 37, 16  # a shard that no block size here divides


def _new_shard(rank: int, base_shard: torch.Tensor) -> torch.Tensor:
    """``base + one small step``, with block magnitudes that differ (so scales differ)."""
    g = torch.Generator().manual_seed(7 + rank)
    step = torch.randn(base_shard.numel(), generator=g) * 1e-3
    step[:BLOCK] *= 100.0  # one coarse block must not coarsen the others
    return base_shard + step


def delta_all_gather_checks(coll) -> dict:
    """Int8DeltaAllGather on edge cases: every block size, zero deltas, non-finite deltas."""
    from ds_acco.comm.int8_collectives import Int8DeltaAllGather

    N, rank = coll.world_size, coll.rank
    base = torch.linspace(-2.0, 2.0, SHARD * N)  # the same on every rank
    new = _new_shard(rank, base.view(N, SHARD)[rank])
    out = {}
    for block in (1, BLOCK, 256):  # tiny, not dividing the shard, larger than the shard
        ag = Int8DeltaAllGather(SHARD, N, block_size=block)
        full = torch.empty_like(base)
        sent0 = coll.wire.sent
        ag(coll, full, base, new)
        out[block] = {"full": full, "bytes": coll.wire.sent - sent0, "expected": ag.bytes_per_call}
    pieces = {}
    for piece in (10 ** 6, 16):  # one all-gather, or pieces of 16, 16 and 5 elements
        ag = Int8DeltaAllGather(SHARD, N, block_size=8, piece_numel=piece)
        pieces[piece] = {"full": ag(coll, torch.empty_like(base), base, new), "count": len(ag.pieces),
                         "bytes": ag.bytes_per_call}
    out["pieces"] = pieces
    bf16_base = base.to(torch.bfloat16)
    bf16_full = torch.empty_like(bf16_base)
    Int8DeltaAllGather(SHARD, N, block_size=BLOCK)(coll, bf16_full, bf16_base, new)
    zero_full = torch.empty_like(base)
    Int8DeltaAllGather(SHARD, N, block_size=BLOCK)(coll, zero_full, base, base.view(N, SHARD)[rank].clone())
    errors = {}
    bad = new.clone()
    if rank == 0:
        bad[3] = float("nan")
        bad[5] = float("inf")
    try:  # only rank 0 raises (before its collective); the others must not block on it
        if rank == 0:
            Int8DeltaAllGather(SHARD, N, block_size=BLOCK)(coll, torch.empty_like(base), base, bad)
    except ValueError as exc:
        errors["nonfinite"] = str(exc)
    try:
        Int8DeltaAllGather(SHARD, N)(coll, base, base, new)
    except ValueError as exc:
        errors["alias"] = str(exc)
    return {"rank": rank, "base": base, "new": new, "by_block": out, "bf16": bf16_full, "zero": zero_full,
            "errors": errors}


def all_to_all_reduce_scatter_checks(coll) -> dict:
    """The gloo reduce-scatter built from all-to-all: one piece and several pieces."""
    from ds_acco.comm import collectives

    N, rank = coll.world_size, coll.rank
    results = {"via_all_to_all": coll.reduce_scatter_via_all_to_all}
    for name, piece in (("one_piece", collectives.MAX_PIECE_NUMEL), ("pieces", 7)):
        saved, collectives.MAX_PIECE_NUMEL = collectives.MAX_PIECE_NUMEL, piece
        try:
            full = torch.arange(N * 40, dtype=torch.float32) * (rank + 1) + rank
            out = torch.empty(40)
            sent0 = coll.wire.sent
            coll.reduce_scatter_sum(out, full)
            results[name] = {"out": out, "bytes": coll.wire.sent - sent0}
        finally:
            collectives.MAX_PIECE_NUMEL = saved
    return results


def paced_collective_checks(coll) -> dict:
    """Collectives cut into the pieces the ranks agreed on (ds_acco.comm.link_pacing) against the expected sums."""
    N, rank = coll.world_size, coll.rank
    votes: list = [None] * N
    dist.all_gather_object(votes, [0, 100, 200, 300][rank % 4])  # rank 0 unmeasured; the smallest limit wins
    coll.adopt_pacing(votes)
    out = {"piece_bytes": coll.piece_bytes}
    full = torch.arange(N * 40, dtype=torch.float32) * (rank + 1) + rank
    calls0, pieces0 = coll.wire.calls, coll.wire.pieces
    rs = coll.reduce_scatter_sum(torch.empty(40), full)
    gathered = torch.full((N * 40,), -1.0)
    gathered[rank * 40:(rank + 1) * 40] = torch.arange(40) + 1000.0 * rank
    coll.all_gather(gathered, gathered[rank * 40:(rank + 1) * 40])
    a2a = coll.all_to_all(torch.empty(N * 40), full)
    out.update(rs=rs, all_gather=gathered, a2a=a2a, calls=coll.wire.calls - calls0,
               pieces=coll.wire.pieces - pieces0, measured=coll.pacer.rate is not None, vote=coll.pacing_vote())
    coll.adopt_pacing([0] * N)
    return out


def probe_checks(coll) -> dict:
    """A group's first large collective times the link on its head and agrees the piece size before the rest."""
    from ds_acco.comm.link_pacing import MIN_PIECE_BYTES, LinkPacer

    N, rank = coll.world_size, coll.rank
    n = LinkPacer.probe_numel(MIN_PIECE_BYTES // ((N - 1) * 4)) + 1000
    full = torch.arange(N * n, dtype=torch.float32) * (rank + 1) + rank
    out = {"n": n}
    for name in ("probe", "after"):
        calls0, pieces0 = coll.wire.calls, coll.wire.pieces
        rs = coll.reduce_scatter_sum(torch.empty(n), full)
        out[name] = {"rs": rs, "calls": coll.wire.calls - calls0, "pieces": coll.wire.pieces - pieces0,
                     "piece_bytes": coll.piece_bytes}
    return out


def train_recording_swaps(rank: int, world: int, *, config: dict, G: int, steps: int, setup=None) -> dict:
    """The tiny job under ds_acco.plain; after every swap: the compute buffers, this rank's
    master shards, the round kind, and the compute buffers the round started from."""
    from ds_acco import plain

    model = W.make_model()
    engine = plain.build(W.param_groups(model), torch.optim.AdamW, W.OPT_KWARGS, config=config,
                         gradient_accumulation_steps=G, lr_scheduler=W.decay_schedule)
    if setup is not None:
        setup(rank, engine)
    swaps, k = [], 0
    pending_base, launched = None, engine._round_index
    # a round launched in the call that swapped (dpu's next step) steps the masters on the communication thread
    # while this thread reads them: the masters the swap landed are the ones just before that launch
    at_launch, launch = [], engine.launch

    def launch_after_a_snapshot(kind, mode):
        at_launch.append([g.master.detach().clone() for g in engine.groups])
        launch(kind, mode)

    engine.launch = launch_after_a_snapshot
    try:
        while engine.commits < steps:
            x, y = W.batch(rank, k)
            k += 1
            W.loss_fn(model(x), y).backward()
            before = [g.flat.clone() for g in engine.groups]
            at_launch.clear()
            if engine.after_micro_batch():
                record = engine.telemetry.records[-1]
                # a sync round launches and swaps within one call; an overlapped one started
                # from the buffers bound when it was launched
                base = before if record.mode == "sync" else pending_base
                later = at_launch[1:] if record.mode == "sync" else at_launch  # a sync round is launched first
                master = later[-1] if later else [g.master.detach().clone() for g in engine.groups]
                swaps.append({"kind": record.kind, "base": base,
                              "flat": [g.flat.clone() for g in engine.groups],
                              "params": [p.detach().clone() for p in W.ordered_params(model)],
                              "master": master})
            if engine._round_index != launched:
                launched = engine._round_index
                pending_base = [g.flat.clone() for g in engine.groups]
        engine.finish()
        final = {"flat": [g.flat.clone() for g in engine.groups],
                 "master": [g.master.detach().clone() for g in engine.groups]}
    finally:
        engine.close()
    summary = engine.telemetry.summary()
    return {"swaps": swaps, "final": final, "summary": summary, "startup": engine.startup_fields(),
            "shard_numels": [g.layout.shard_numel for g in engine.groups],
            "wire": {"calls": engine.coll.wire.calls, "pieces": engine.coll.wire.pieces,
                     "piece_bytes": engine.coll.piece_bytes}}


def pace_rank_one_to_tiny_pieces(rank: int, engine) -> None:
    """Rank 1 reports a link so slow that its pieces are 8 bytes (below the floor: the model is tiny) and
    keeps reporting it; the others measure loopback as usual. The smallest vote must win on every rank."""
    if rank == 1:
        engine.coll.pacer.rate = 8 / engine.coll.pacer.piece_seconds
        engine.coll.pacer.piece_bytes = lambda max_bytes: min(max_bytes, 8)  # whatever latency its probe reads
        engine.coll.pacer.observe = lambda *measured: None


LOWBIT_RUNS = {
    "acco_int8_ag": {"mode": "acco", "all_gather_quantization": "int8", "quantization_block_size": 8},
    "acco_int8_estimate": {"mode": "acco", "all_gather_quantization": "int8_estimate", "quantization_block_size": 8},
    "acco_lowbit": {"mode": "acco", "all_gather_quantization": "int8", "comm_quantization": "int8",
                    "error_feedback": True, "quantization_block_size": 8},
    "dpu_int8_ag": {"mode": "dpu", "all_gather_quantization": "int8", "quantization_block_size": 8},
    "sync_int8_ag": {"mode": "sync", "all_gather_quantization": "int8", "quantization_block_size": 8},
    "acco_fp32": {"mode": "acco"},
    "acco_int4_estimate": {"mode": "acco", "estimate_quantization": "int4", "quantization_block_size": 8},
    "acco_lowbit_int4": {"mode": "acco", "all_gather_quantization": "int8", "comm_quantization": "int8",
                         "error_feedback": True, "estimate_quantization": "int4", "quantization_block_size": 8},
}
STEPS, G, WORLD = 8, 4, 3


def everything(rank: int, world: int) -> dict:
    from ds_acco.comm.collectives import RoundCollectives

    torch.set_num_threads(1)
    coll = RoundCollectives(None, 60.0)
    try:
        out = {"delta": delta_all_gather_checks(coll), "rs": all_to_all_reduce_scatter_checks(coll),
               "paced": paced_collective_checks(coll), "probe": probe_checks(coll)}
    finally:
        coll.destroy()
    out["train"] = {name: train_recording_swaps(rank, world, config=cfg, G=G, steps=STEPS)
                    for name, cfg in LOWBIT_RUNS.items()}
    out["train_paced"] = {name: train_recording_swaps(rank, world, config=LOWBIT_RUNS[name], G=G, steps=STEPS,
                                                      setup=pace_rank_one_to_tiny_pieces)
                          for name in ("acco_fp32", "acco_lowbit")}
    return out


@functools.lru_cache(maxsize=1)
def shared_run() -> tuple:
    from tests.dist_harness import run_distributed

    return tuple(run_distributed(everything, WORLD, timeout=240))
