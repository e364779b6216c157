"""The start-up line of a round-engine job: what it runs, so a user can tell ACCO from stock at a glance."""

from __future__ import annotations

from ds_acco.config.names import Mode, Policy
from ds_acco.numerics.dtypes import dtype_name, resolve_dtype

from .auto.choice import half_candidates


def _per_kind(estimate: str, commit: str) -> str:
    return commit if estimate == commit else f"{estimate} (estimates), {commit} (commits)"


def startup_fields(engine) -> dict:
    """Mode, policy, sizes and wire dtypes of a :class:`~ds_acco.rounds.engine.RoundEngine`."""
    cfg = engine.config
    compute = engine.groups[0].flat.dtype
    accum = resolve_dtype(cfg.grad_accum_dtype, compute, "acco.grad_accum_dtype")
    if cfg.comm_quantization == "int8":
        reduce_scatter = f"int8(block {cfg.quantization_block_size})"
    else:
        reduce_scatter = dtype_name(resolve_dtype(cfg.comm_dtype, accum, "acco.comm_dtype"))
    if cfg.estimate_quantization == "int4":
        reduce_scatter = _per_kind("int4", reduce_scatter)
    q = cfg.all_gather_quantization
    commit_ag = "int8 delta" if q == "int8" else dtype_name(compute)
    estimate_ag = "int4 delta" if cfg.estimate_quantization == "int4" else "int8 delta" if q != "none" else commit_ag
    if cfg.mode == Mode.AUTO and cfg.policy == Policy.FIXED:
        per_round = f"{engine.G}(sync)|{cfg.quota(engine.G)}(acco)"
    elif cfg.mode == Mode.SYNC or cfg.policy == Policy.FIXED:
        per_round = str(engine.G if cfg.mode == Mode.SYNC else cfg.quota(engine.G))
    else:
        cap = cfg.max_micro_batches_per_round
        per_round = f"adaptive(>=1{'' if cap is None else f',<={cap}'},nominal {cfg.quota(engine.G)})"
        G = engine.G
        sync_half, acco_half = half_candidates(cfg, G) if cfg.mode == Mode.AUTO else (False, False)
        sync = f"{G}{f'|{G // 2}' if sync_half else ''}(sync)"
        if cfg.policy == Policy.AUTO:
            fixed = f"{cfg.quota(G)}{f'|{G // 4}' if acco_half else ''}(acco fixed)"
            per_round = f"{sync}|{fixed}|{per_round}"
        elif cfg.mode == Mode.AUTO:
            per_round = f"{sync}|{per_round}"
    return {
        "mode": cfg.mode, "policy": cfg.policy, "world_size": engine.world_size,
        "gradient_accumulation_steps": engine.G, "micro_batches_per_round": per_round,
        "warmup_steps": cfg.warmup_steps, "grad_accum_dtype": dtype_name(accum),
        "reduce_scatter": reduce_scatter, "param_all_gather": _per_kind(estimate_ag, commit_ag),
        "lr_schedule": "by tokens" if engine.lr_clock.by_tokens else "per commit",
    }
