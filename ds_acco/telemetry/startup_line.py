"""The one line rank 0 logs when ACCO takes over a job, whatever the front end.

A user must be able to tell an ACCO run from a stock one without enabling telemetry,
under DeepSpeed's and HF's default logging (neither configures the root logger, so
an INFO line on ``ds_acco`` would otherwise be dropped): the line goes through
:func:`ds_acco.telemetry.ensure_log_output`, which adds a handler only when nobody
configured logging.
"""

from __future__ import annotations

import logging

import torch

from ds_acco.numerics.dtypes import resolve_dtype
from .records import ensure_log_output

logger = logging.getLogger("ds_acco")

_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def announce(front_end: str, rank: int, fields: dict) -> None:
    """Log ``ds_acco: ACCO on (<front end>): k=v ...`` once, on rank 0."""
    if rank != 0:
        return
    ensure_log_output()
    logger.info("ds_acco: ACCO on (%s): %s", front_end, " ".join(f"{k}={v}" for k, v in fields.items()))


def _param_all_gather(quantization: str, compute: torch.dtype) -> str:
    if quantization == "int8":
        return "int8 delta"
    if quantization == "int8_estimate":
        return f"int8 delta (estimates), {_name(compute)} (commits)"
    return _name(compute)


def round_fields(engine) -> dict:
    """What a :class:`~ds_acco.rounds.engine.RoundEngine` job runs: mode, policy, sizes, wire dtypes."""
    cfg = engine.config
    compute = engine.groups[0].flat.dtype
    accum = resolve_dtype(cfg.grad_accum_dtype, compute, "acco.grad_accum_dtype")
    if cfg.comm_quantization == "int8":
        reduce_scatter = f"int8(block {cfg.quantization_block_size})"
    else:
        reduce_scatter = _name(resolve_dtype(cfg.comm_dtype, accum, "acco.comm_dtype"))
    if cfg.mode == "sync" or cfg.policy == "fixed":
        per_round = str(engine.G if cfg.mode == "sync" else cfg.quota(engine.G))
    else:
        cap = cfg.max_micro_batches_per_round
        per_round = f"adaptive(>=1{'' if cap is None else f',<={cap}'},nominal {cfg.quota(engine.G)})"
    return {
        "mode": cfg.mode, "policy": cfg.policy, "world_size": engine.world_size,
        "gradient_accumulation_steps": engine.G, "micro_batches_per_round": per_round,
        "warmup_steps": cfg.warmup_steps, "grad_accum_dtype": _name(accum),
        "reduce_scatter": reduce_scatter, "param_all_gather": _param_all_gather(cfg.all_gather_quantization, compute),
        "lr_schedule": "by tokens" if engine.lr_clock.by_tokens else "per commit",
    }


def streaming_fields(engine) -> dict:
    """What a :class:`~ds_acco.streaming.StreamingEngine` job runs."""
    s = engine.config.streaming
    return {
        "mode": "streaming", "world_size": engine.world_size, "fragments": s.fragments,
        "sync_every": s.sync_every, "overlap_steps": s.overlap_steps, "alpha": s.alpha,
        "pseudo_gradient_reduce_scatter": s.quantize, "global_all_gather": s.all_gather_dtype,
    }
