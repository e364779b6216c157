"""Analytic per-worker memory of stock DeepSpeed ZeRO-1 and each ds_acco mode, in bytes per parameter.

``P`` parameters, ``N`` data-parallel workers, fp32 compute parameters and fp32
gradient accumulation (the benchmark's configs). Every term is a buffer the code
allocates; the source is named next to it. Full-size terms scale with ``P``,
sharded terms with ``P / N``.

Stock DeepSpeed ZeRO-1 (``DeepSpeedZeroOptimizer``, stage 1, ``contiguous_gradients``):

=====================================  =====  ==========================================
compute parameters (``bit16_groups_flat``)  4     one flat buffer; ``p.data`` are views
gradients (``p.grad``)                       4     autograd accumulates across micro-batches
reduce bucket (IPG bucket)              4·min(1, B/P)  ``torch.empty(reduce_bucket_size)``, touched up to P
fp32 master shard                           4/N   ``single_partition_of_fp32_groups``
optimizer state (AdamW m, v)                8/N
fp32 gradient partition                     4/N   ``averaged_gradients`` handed to the optimizer
=====================================  =====  ==========================================

ds_acco (``AccoDeepSpeedEngine``; DeepSpeed's gradient hooks are removed before the
first backward, so neither ``p.grad`` storage nor the IPG bucket is ever allocated):

=====================================  =====  ==========================================
compute parameters                          4     DeepSpeed's flat buffer, re-bound at swaps
two gradient accumulators                   8     ``GradBuffers`` (``p.grad`` are views)
staging parameter buffer                    4     the all-gather target, swapped in
communication buffers                       8/N   reduce-scatter output (fp32 shard) + publish shard
                                            (+ c  a full-size cast buffer only when comm dtype != accum dtype)
fp32 master shard                           4/N
optimizer state (AdamW m, v)                8/N
estimate scratch (acco only)               16/N   kept estimate shard 4/N + lookahead snapshot of
                                                  master and m, v 12/N
=====================================  =====  ==========================================

So at fp32 (the benchmark's configs): ZeRO-1 = 12 + 16/N, sync/dpu = 16 + 20/N,
acco = 16 + 36/N bytes per parameter. acco - ZeRO-1 = 4 (one model-sized buffer: the
staging buffer; the second accumulator takes the place of DeepSpeed's bucket) + 20/N.
Gradient clipping adds nothing: ``RoundEngine._clip_global_norm`` reduces each shard
with ``torch.linalg.vector_norm`` (until 2026-11-22 it made a float64 copy of the shard
and its square, 16/N; the first memory measurements in BENCHMARKS.md showed it).
Activations, the optimizer's per-step temporaries (O(P/N), in both), libraries and
data are on top and do not depend on the mode; ds_acco's round runs concurrently with
the next micro-batches' backward, so its transients and the activations can peak
together, where ZeRO-1's optimizer step runs after backward has freed them.
"""

from __future__ import annotations

from typing import Optional

STOCK_CONFIGS = ("zero1", "zero1_overlap")


def components(config: str, world_size: int, params: int, *, bucket_elems: Optional[int] = None,
               comm_cast: bool = False) -> dict[str, float]:
    """Bytes of each buffer of one worker (fp32 parameters and accumulation).

    Args:
        config: ``zero1``, ``zero1_overlap``, ``sync``, ``dpu``, ``acco_fixed`` or ``acco_adaptive``.
        world_size: ``N``.
        params: ``P`` (padded flat size; the padding is < 2N elements).
        bucket_elems: DeepSpeed's ``reduce_bucket_size`` (None: larger than P).
        comm_cast: ds_acco communicates in another dtype than it accumulates (adds one
            full-size buffer of the comm dtype; 2 bytes for bf16/fp16).
    """
    if world_size < 1 or params < 1:
        raise ValueError(f"world_size and params must be >= 1; got {world_size}, {params}")
    P, N = float(params), float(world_size)
    if config in STOCK_CONFIGS:
        bucket = P if bucket_elems is None else min(P, float(bucket_elems))
        return {
            "compute parameters": 4 * P,
            "gradients (p.grad)": 4 * P,
            "reduce bucket": 4 * bucket,
            "fp32 master shard": 4 * P / N,
            "optimizer state": 8 * P / N,
            "fp32 gradient partition": 4 * P / N,
        }
    if config not in ("sync", "dpu", "acco_fixed", "acco_adaptive"):
        raise ValueError(f"config: got {config!r}")
    out = {
        "compute parameters": 4 * P,
        "two gradient accumulators": 8 * P,
        "staging parameter buffer": 4 * P,
        "communication buffers": 8 * P / N + (2 * P if comm_cast else 0.0),
        "fp32 master shard": 4 * P / N,
        "optimizer state": 8 * P / N,
    }
    if config.startswith("acco"):
        out["estimate scratch"] = 16 * P / N
    return out


def total(config: str, world_size: int, params: int, **kwargs) -> float:
    return sum(components(config, world_size, params, **kwargs).values())


def bytes_per_param(config: str) -> tuple[float, float]:
    """``(f, s)`` such that bytes = f·P + s·P/N (bucket >= P, no comm cast)."""
    big = 10 ** 6
    t1, t2 = total(config, 1, big) / big, total(config, 2, big) / big  # f + s and f + s/2
    s = 2 * (t1 - t2)
    return t1 - s, s


def formula(config: str) -> str:
    f, s = bytes_per_param(config)
    return f"{f:g}·P + {s:g}·P/N"
