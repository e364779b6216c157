"""Analytic per-worker memory of stock DeepSpeed ZeRO-1 and each ds_acco mode, in bytes.

``P`` parameters, ``N`` data-parallel workers; ``c``, ``a``, ``r`` the bytes per
element of the compute parameters, the gradient accumulators and the gradient
reduce-scatter payload (4 for fp32, 2 for bf16). Every term is a buffer the code
allocates; the source is named next to it. Full-size terms scale with ``P``,
sharded terms with ``P / N``; a few chunked scratch buffers are constants.

Stock DeepSpeed ZeRO-1 (``DeepSpeedZeroOptimizer``, stage 1, ``contiguous_gradients``):

=====================================  ======  ==========================================
compute parameters (``bit16_groups_flat``)  c       one flat buffer; ``p.data`` are views
gradients (``p.grad``)                       c       autograd accumulates across micro-batches
reduce bucket (IPG bucket)              c·min(1, B/P)  ``torch.empty(reduce_bucket_size)``, touched up to P
fp32 master shard                           4/N    ``single_partition_of_fp32_groups``
optimizer state (AdamW m, v)                8/N
fp32 gradient partition                     4/N    handed to the optimizer
=====================================  ======  ==========================================

ds_acco (``AccoDeepSpeedEngine``; DeepSpeed's gradient hooks are removed before the
first backward, so neither ``p.grad`` storage nor the IPG bucket is ever allocated):

=====================================  ======  ==========================================
compute parameters                          c      DeepSpeed's flat buffer, re-bound at swaps
two gradient accumulators                   2a     ``GradBuffers`` (``p.grad`` are views when a = c)
staging parameter buffer                    0      the all-gather lands in the accumulator the round
                                                   has just reduce-scattered (a = c: the buffers rotate
                                                   roles; a > c: it lands in the accumulator's bytes
                                                   and is copied in at the swap); c only when a < c
comm cast scratch              r·(N+1)·min(P, K)/N  only when r != a: the cast is done in chunks of
                                                   ``K = chunked_cast.CAST_CHUNK_ELEMS`` elements
fp32 gradient shard                         4/N    the reduce-scatter's sum, divided, clipped, stepped
comm-dtype reduce-scatter output            r/N    only when r = a != 4 (e.g. bf16 accumulation)
fp32 master shard                           4/N
optimizer state (AdamW m, v)                8/N
kept estimate shard (acco only)             4/N    ``A_t``'s reduce-scattered sum, added at the commit
Adam chunk scratch            (8 or 12)·min(P/N, L)  acco's lookahead, chunks of ``L = adam_lookahead.chunk_elems``
                                                   (256 Ki on a CPU, 4 Mi on a GPU: ``adam_chunk``)
                                                   (any other optimizer than Adam/AdamW snapshots
                                                   master and state instead: 12/N for two moments);
                                    4·min(P/N, L)  sync/dpu: torch's Adam/AdamW commit, stepped in chunks
                                                   (torch's own step holds 8/N of temporaries)
=====================================  ======  ==========================================

The publish shard costs nothing: the shard step writes this rank's new parameters
straight into its slice of the all-gather destination.

FSDP2 front end (``packed=True``; ``ds_acco.fsdp``, one rank-major packed group per
bucket of ``fully_shard`` units, :mod:`ds_acco.layout.rank_major`): the compute parameters and
accumulators are param-major, the collectives rank-major, so a packed group adds

=====================================  ======  ==========================================
rank-major send buffer                      r      the reduce-scatter's input, packed (and cast)
                                                   from the accumulator; the all-gather's output
rank-major all-gather output                c      only when r != c (else the send buffer)
publish shard                               c/N    this rank's new shard, before the all-gather
=====================================  ======  ==========================================

and casts on the way into the send buffer (no chunked cast scratch; the reduce-scatter
output is in the comm dtype whenever r != 4).

So at fp32 (``zero1``, ``sync``, ``dpu``, ``acco_*``): ZeRO-1 = 12 P + 16 P/N,
sync/dpu = 12 P + 16 P/N (equal; + 1 MiB of step chunks), acco = 12 P + 20 P/N (+ 2 MiB of
lookahead chunks): acco - ZeRO-1 = 4 P/N, the kept estimate shard. With bf16 parameters and
bf16 accumulation (``zero1_bf16``, ``acco_bf16``): ZeRO-1 = 6 P + 16 P/N, acco =
6 P + 22 P/N (+ 3 MiB): + 6 P/N. With bf16 parameters, fp32 accumulation and a bf16
payload (``acco_bf16_fp32acc``, ``ds_configs/acco_bf16.json``): acco = 10 P + 20 P/N
(+ a 32 MiB cast chunk + 3 MiB): + 4 P + 4 P/N over ZeRO-1 bf16, because each of the two
accumulators is fp32 where ZeRO-1's gradient and bucket are bf16.
On gloo the round's collectives add their piece scratch (``collectives.MAX_PIECE_NUMEL``
elements per rank: a send and a receive buffer, 16 MiB at fp32 and N = 2) and gloo's
own temporary for each all-gather piece (8 MiB), which the model leaves out (NCCL needs
neither). Gradient clipping adds nothing: ``RoundEngine._clip_global_norm`` reduces each
shard with ``torch.linalg.vector_norm``. torch's Adam/AdamW step holds two shard-sized
temporaries (8 P/N), so ds_acco's commit steps it in chunks (``Adam chunk scratch``).
Activations, libraries and data are on top and do not depend on the mode.
``python -m benchmarks.memory.attribution`` measures what the model leaves out
(BENCHMARKS.md, "Memory per worker").
"""

from __future__ import annotations

from typing import Optional

from ds_acco.comm.chunked_cast import CAST_CHUNK_ELEMS
from ds_acco.optim.adam_lookahead import CHUNK_ELEMS as LOOKAHEAD_CHUNK

STOCK_CONFIGS = ("zero1", "zero1_overlap")
"""The fp32 stock configs (the comparison the bandwidth runs make)."""
DTYPE_BYTES = {  # (compute c, accumulation a, reduce-scatter payload r) bytes per element
    "zero1": (4, 4, 4), "zero1_overlap": (4, 4, 4), "zero1_bf16": (2, 2, 2),
    "sync": (4, 4, 4), "dpu": (4, 4, 4), "acco_fixed": (4, 4, 4), "acco_adaptive": (4, 4, 4),
    "acco_bf16": (2, 2, 2), "acco_bf16_fp32acc": (2, 4, 2),
}
"""The benchmark configs the model covers, by their dtypes."""
STOCK = ("zero1", "zero1_overlap", "zero1_bf16")


def baseline(config: str) -> str:
    """The stock ZeRO-1 config a ds_acco config is compared with (same parameter dtype)."""
    return "zero1_bf16" if DTYPE_BYTES[config][0] == 2 else "zero1"


def _check(config: str, world_size: int, params: int) -> None:
    if world_size < 1 or params < 1:
        raise ValueError(f"world_size and params must be >= 1; got {world_size}, {params}")
    if config not in DTYPE_BYTES:
        raise ValueError(f"config: got {config!r}; allowed: {', '.join(DTYPE_BYTES)}")


def components(config: str, world_size: int, params: int, *, bucket_elems: Optional[int] = None,
               constants: bool = True, packed: bool = False, adam_chunk: int = LOOKAHEAD_CHUNK) -> dict[str, float]:
    """Bytes of each buffer of one worker.

    Args:
        config: one of :data:`DTYPE_BYTES` (its dtypes follow from the name).
        world_size: ``N``.
        params: ``P`` (padded flat size; the padding is < 2N elements).
        bucket_elems: DeepSpeed's ``reduce_bucket_size`` (None: larger than P).
        constants: include the chunked scratch buffers, whose size does not grow with ``P``.
        packed: the FSDP2 front end's rank-major packed groups (ds_acco configs only).
        adam_chunk: elements per Adam chunk (``adam_lookahead.chunk_elems`` of the device; the CPU's).
    """
    _check(config, world_size, params)
    c, a, r = DTYPE_BYTES[config]
    P, N = float(params), float(world_size)
    if config in STOCK:
        bucket = P if bucket_elems is None else min(P, float(bucket_elems))
        return {
            "compute parameters": c * P,
            "gradients (p.grad)": c * P,
            "reduce bucket": c * bucket,
            "fp32 master shard": 4 * P / N,
            "optimizer state": 8 * P / N,
            "fp32 gradient partition": 4 * P / N,
        }
    out = {
        "compute parameters": c * P,
        "two gradient accumulators": 2 * a * P,
        "staging parameter buffer": c * P if a < c else 0.0,
        "comm cast scratch": (r * (N + 1) * min(P / N, CAST_CHUNK_ELEMS // N)
                              if r != a and constants and not packed else 0.0),
        "fp32 gradient shard": 4 * P / N,
        "comm-dtype reduce-scatter output": r * P / N if r != 4 and (r == a or packed) else 0.0,
        "fp32 master shard": 4 * P / N,
        "optimizer state": 8 * P / N,
    }
    if packed:
        out["rank-major send buffer"] = r * P
        out["rank-major all-gather output"] = c * P if r != c else 0.0
        out["publish shard"] = c * P / N
    if config.startswith("acco"):
        out["kept estimate shard"] = 4 * P / N
        out["Adam chunk scratch"] = (8 if c == 4 else 12) * min(P / N, adam_chunk) if constants else 0.0
    elif constants:
        out["Adam chunk scratch"] = 4 * min(P / N, adam_chunk)
    return {k: v for k, v in out.items() if v}


def total(config: str, world_size: int, params: int, **kwargs) -> float:
    return sum(components(config, world_size, params, **kwargs).values())


def bytes_per_param(config: str, **kwargs) -> tuple[float, float]:
    """``(f, s)`` such that bytes = f·P + s·P/N (bucket >= P, chunked constants left out)."""
    big = 10 ** 6
    t1 = total(config, 1, big, constants=False, **kwargs) / big  # f + s
    t2 = total(config, 2, big, constants=False, **kwargs) / big  # f + s/2
    s = 2 * (t1 - t2)
    return t1 - s, s


def constant_bytes(config: str, world_size: int, params: int) -> float:
    """The chunked scratch: what :func:`total` adds to ``f·P + s·P/N``."""
    return total(config, world_size, params) - total(config, world_size, params, constants=False)


def formula(config: str, **kwargs) -> str:
    f, s = bytes_per_param(config, **kwargs)
    return f"{f:g}·P + {s:g}·P/N"
