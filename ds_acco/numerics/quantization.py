"""Blockwise absmax int8 (and int4) quantisation of fp32/bf16/fp16 tensors.

A tensor is cut into rows (one row per destination rank in the collectives, a single row otherwise) and every row into
blocks of ``block_size`` consecutive elements; the last block of a row may be shorter, so no size needs to divide by the
block size and nothing is padded. Each block keeps one fp32 *scale*, its absolute maximum ``s``, and stores every
element as ``q = round(127 * x / s)`` in ``[-127, 127]``. Dequantisation is ``q * s / 127``, so the round-trip error of
an element is at most half a step, ``s / 254`` (plus fp32 rounding), within the ``s / 127`` the spec allows. An all-zero
block has scale 0 and dequantises to 0.

Int4 is the same with ``qmax = 7`` (``q`` in ``[-7, 7]``, error at most ``s / 14``), stored two elements per byte by
:func:`pack_int4` (``q + 8``, low nibble first); acco's estimate rounds send it (``acco.estimate_quantization``).

Non-finite inputs are not special-cased: a block holding inf/NaN gets a non-finite scale and dequantises to NaN, which
``check_finite`` then catches after the exchange, exactly as it would for an fp32 payload.

Everything here is a pure function of its arguments; callers that want to reuse memory pass ``out`` tensors.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

DEFAULT_BLOCK_SIZE = 256
"""Elements per scale: 256 int8 values + one fp32 scale cost 1.016 bytes per element."""

QMAX = 127
QMAX_INT4 = 7


class Quantized(NamedTuple):
    """An int8 payload and its per-block scales.

    Attributes:
        payload: int8 (uint8 from :func:`quantize_log`), the shape of the (2-D) input, ``(rows, numel)``.
        scales: fp32 block absmax values, ``(rows, num_blocks(numel, block_size))``.
    """

    payload: torch.Tensor
    scales: torch.Tensor


def check_block_size(block_size: int, field: str = "block_size") -> int:
    """Return ``block_size`` if it is a positive int; else raise a ValueError naming ``field``."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"{field}: got {block_size!r}; allowed: an integer >= 1 (e.g. {DEFAULT_BLOCK_SIZE})")
    return block_size


def num_blocks(numel: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """``ceil(numel / block_size)``: blocks (and scales) for a row of ``numel`` elements; the last may be short."""
    check_block_size(block_size)
    return -(-numel // block_size)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(1, -1) if x.dim() <= 1 else x


def _split(rows: torch.Tensor, block_size: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(rows, full_blocks, block_size)`` view of the whole blocks and ``(rows, tail)`` of the short one."""
    n = rows.shape[1]
    k, tail = divmod(n, block_size)
    full = rows[:, : k * block_size].unflatten(1, (k, block_size)) if k else None
    short = rows[:, k * block_size :] if tail else None
    return full, short


# [Note: a whole buffer in a few operations]
# A round quantises and dequantises model-sized buffers, and each operation it issues holds the Python interpreter the
# training thread needs (issue 49), so the work is done per buffer, not per block, row or piece: the parts below are the
# one or two views (whole blocks, the short last block) that cover a 2-D buffer, made once per buffer by the callers
# that keep buffers (the wire rows); two parts go through one ``torch._foreach_*`` operation. The arithmetic is the
# per-part one, op for op, so results are bit-identical to it (tests/test_round_ops.py checks against a reference).

def block_parts(rows: torch.Tensor, block_size: int) -> list[torch.Tensor]:
    """The views that cover a 2-D ``(rows, numel)`` tensor block by block: ``(rows, k, block_size)`` for the
    whole blocks and ``(rows, tail)`` for the short last one (each only if there is one)."""
    return [t for t in _split(rows, block_size) if t is not None]


def scale_parts(per_block: torch.Tensor, numel: int, block_size: int, broadcast: bool = True) -> list[torch.Tensor]:
    """``(rows, blocks)`` per-block values as views that pair with :func:`block_parts` of ``numel`` elements:
    ``(rows, k, 1)`` and ``(rows, 1)`` (``broadcast``: to scale them), or ``(rows, k)`` and ``(rows, 1)`` (to
    write a reduction over them)."""
    k, tail = divmod(numel, block_size)
    parts = [per_block[:, :k, None] if broadcast else per_block[:, :k]] if k else []
    return parts + ([per_block[:, k:k + 1]] if tail else [])


def absmax_into(x_parts: list[torch.Tensor], out_parts: list[torch.Tensor]) -> None:
    """Each block's absolute maximum into ``out_parts`` (fp32, :func:`scale_parts` with ``broadcast=False``).
    (The infinity norm would need no ``abs()`` temporary, but it reduces six times slower on a CPU.)"""
    absolute = [x_parts[0].abs()] if len(x_parts) == 1 else torch._foreach_abs(x_parts)
    for x, out in zip(absolute, out_parts):
        keep = x.dim() == 2
        if x.dtype == torch.float32:
            torch.amax(x, dim=-1, keepdim=keep, out=out)
        else:  # amax keeps the input's dtype; widening is exact
            out.copy_(torch.amax(x, dim=-1, keepdim=keep))


def inverse_scales(scales: torch.Tensor, qmax: int, out: torch.Tensor) -> torch.Tensor:
    """``qmax / scale`` where the scale is positive, else 0 (an all-zero block; a NaN one), into ``out``: the
    product of the reciprocal and ``qmax``, as Python's ``qmax / tensor`` computes it."""
    torch.reciprocal(scales, out=out).mul_(qmax)
    zero = _ZEROS.get(out.device)
    if zero is None:
        zero = _ZEROS[out.device] = torch.zeros((), device=out.device)
    return torch.where(scales > 0, out, zero, out=out)


_ZEROS: dict = {}
"""A 0-d fp32 zero per device (``torch.where`` with ``out`` takes no Python scalar)."""


def quantize_parts(x_parts: list[torch.Tensor], inv_parts: list[torch.Tensor], payload_parts: list[torch.Tensor],
                   qmax: int) -> None:
    """``payload = clamp(round(x * inv), -qmax, qmax)`` per part (an fp32 product: type promotion widens ``x``
    exactly); ``|x| <= absmax`` keeps the product within ``qmax`` up to one ulp, which the clamp absorbs."""
    if len(x_parts) == 1:
        v = x_parts[0] * inv_parts[0]
        payload_parts[0].copy_(v.round_().clamp_(-qmax, qmax))
        return
    vals = torch._foreach_mul(x_parts, inv_parts)
    torch._foreach_round_(vals)
    for v in vals:  # one pass each (a _foreach_clamp_min_ and _max_ would be two)
        v.clamp_(-qmax, qmax)
    torch._foreach_copy_(payload_parts, vals)


def dequantize_parts(payload_parts: list[torch.Tensor], factor_parts: list[torch.Tensor],
                     out_parts: list[torch.Tensor], accumulate: bool = False) -> None:
    """``out (+)= q * factor`` per part (``factor = scale / qmax``; an fp32 product, rounded once into ``out``;
    written straight into ``out``, without a temporary, unless added)."""
    if not accumulate:
        for q, f, out in zip(payload_parts, factor_parts, out_parts):
            torch.mul(q, f, out=out)
        return
    torch._foreach_add_(out_parts, torch._foreach_mul(payload_parts, factor_parts))


def block_absmax(x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Per-block absolute maximum of each row of ``x`` (1-D: one row; any floating dtype): fp32
    ``(rows, num_blocks(numel, block_size))``."""
    check_block_size(block_size)
    rows = _as_rows(x)
    out = torch.empty(rows.shape[0], num_blocks(rows.shape[1], block_size), dtype=torch.float32, device=x.device)
    absmax_into(block_parts(rows, block_size), scale_parts(out, rows.shape[1], block_size, broadcast=False))
    return out


def _per_block(rows: torch.Tensor, block_size: int, reduce) -> torch.Tensor:
    """``reduce`` (``torch.amax`` or ``torch.amin``) over each block of each row: ``(rows, blocks)``."""
    full, short = _split(rows, block_size)
    parts = []
    if full is not None:
        parts.append(reduce(full, dim=2))
    if short is not None:
        parts.append(reduce(short, dim=1, keepdim=True))
    if not parts:
        return torch.zeros(rows.shape[0], 0, dtype=rows.dtype, device=rows.device)
    return torch.cat(parts, dim=1)


def quantize_blockwise(
    x: torch.Tensor,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    payload: Optional[torch.Tensor] = None,
    scales: Optional[torch.Tensor] = None,
    qmax: int = QMAX,
) -> Quantized:
    """Quantise every row of ``x`` (1-D: one row, or 2-D ``(rows, numel)``; fp32/bf16/fp16) blockwise to int8
    with one absmax scale per block and levels up to ``qmax`` (7 for int4; the payload is int8 either way).
    ``payload`` (may be a strided view) and ``scales``: optional outputs, shaped as :class:`Quantized` says."""
    if x.dim() > 2:
        raise ValueError(f"x: got a {x.dim()}-D tensor; allowed: 1-D or 2-D (rows, numel)")
    rows = _as_rows(x)
    amax = block_absmax(rows, block_size)
    if scales is None:
        scales = amax
    else:
        _check_out("scales", scales, amax.shape, torch.float32)
        scales.copy_(amax)
    if payload is None:
        payload = torch.empty(rows.shape, dtype=torch.int8, device=x.device)
    else:
        _check_out("payload", payload, rows.shape, torch.int8)
    n = rows.shape[1]
    quantize_parts(block_parts(rows, block_size), scale_parts(inverse_scales(amax, qmax, torch.empty_like(amax)), n,
                                                               block_size), block_parts(payload, block_size), qmax)
    return Quantized(payload, scales)


def dequantize_blockwise(
    payload: torch.Tensor,
    scales: torch.Tensor,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    out: Optional[torch.Tensor] = None,
    accumulate: bool = False,
    qmax: int = QMAX,
) -> torch.Tensor:
    """Inverse of :func:`quantize_blockwise`: ``q * scale / qmax`` per block, into ``out`` (the payload's shape,
    any floating dtype, may be strided; ``accumulate``: added into it) or a new fp32 tensor. ``scales`` may be
    1-D for a 1-D payload."""
    if payload.dtype != torch.int8:
        raise ValueError(f"payload: got dtype {payload.dtype}; allowed: torch.int8")
    rows = _as_rows(payload)
    expect = (rows.shape[0], num_blocks(rows.shape[1], block_size))
    scales2 = scales.reshape(expect) if scales.numel() == expect[0] * expect[1] else None
    if scales2 is None or scales.dtype != torch.float32:
        raise ValueError(f"scales: got {tuple(scales.shape)} {scales.dtype}; payload needs {expect} torch.float32")
    if accumulate and out is None:
        raise ValueError("accumulate=True needs an out tensor to add into")
    if out is None:
        out = torch.empty(payload.shape, dtype=torch.float32, device=payload.device)
    elif out.shape != payload.shape:
        raise ValueError(f"out: got shape {tuple(out.shape)}; payload has {tuple(payload.shape)}")
    if rows.shape[1]:
        dequantize_parts(block_parts(rows, block_size), scale_parts(scales2 / qmax, rows.shape[1], block_size),
                         block_parts(_as_rows(out), block_size), accumulate)
    return out


LOG_CODES = 255
"""Codes of :func:`quantize_log` for positive values (1-255; 0 is an exact zero)."""


def quantize_log(x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> Quantized:
    """Non-negative values to one byte each on a per-block logarithmic scale.

    For Adam's second moment, whose values in one block span tens of octaves: a linear scale would round the small ones
    to 0, and a 0 there becomes a step of ``lr * m / eps``. Here code 0 is an exact 0 and codes 1-255 spread the log2
    range of a block's positive values evenly, so no positive value becomes 0 and each is off by at most the factor
    ``2 ** (range / 508)`` (1.4% for a block spanning 10 octaves, 2.8% for 20). Returns a uint8 payload shaped like
    ``x``'s rows and, as scales, each block's lowest and highest log2 side by side, ``(rows, 2 * num_blocks)`` (a piece
    of whole blocks keeps its scales together). Finite, non-negative input only (callers check).
    """
    check_block_size(block_size)
    rows = _as_rows(x).float()
    positive = rows > 0
    logs = torch.where(positive, rows, 1.0).log2_()
    lo = _per_block(torch.where(positive, logs, torch.inf), block_size, torch.amin)
    hi = _per_block(torch.where(positive, logs, -torch.inf), block_size, torch.amax)
    empty = lo > hi  # no positive value in the block
    lo, hi = lo.masked_fill_(empty, 0.0), hi.masked_fill_(empty, 0.0)
    step = (hi - lo) / (LOG_CODES - 1)
    inv = torch.where(step > 0, 1.0 / step, 0.0)
    n = rows.shape[1]
    codes = (logs - _per_element(lo, n, block_size)).mul_(_per_element(inv, n, block_size))
    codes = codes.round_().add_(1).clamp_(1, LOG_CODES).masked_fill_(~positive, 0)
    return Quantized(codes.to(torch.uint8), torch.stack([lo, hi], dim=2).flatten(1))


def dequantize_log(payload: torch.Tensor, scales: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Inverse of :func:`quantize_log`: fp32 ``(rows, numel)``."""
    rows = _as_rows(payload)
    n = rows.shape[1]
    blocks = num_blocks(n, block_size)
    lo, hi = scales.reshape(rows.shape[0], blocks, 2).unbind(dim=2)
    step = (hi - lo) / (LOG_CODES - 1)
    logs = (rows.float() - 1).mul_(_per_element(step, n, block_size)).add_(_per_element(lo, n, block_size))
    return logs.exp2_().masked_fill_(rows == 0, 0.0)


def _per_element(per_block: torch.Tensor, numel: int, block_size: int) -> torch.Tensor:
    return per_block.repeat_interleave(block_size, dim=1)[:, :numel]


def pack_int4(q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Two int4 levels per byte: ``(rows, 2 k)`` int8 in ``[-7, 7]`` -> ``(rows, k)`` uint8, ``q + 8`` of the even
    elements in the low nibble. Both nibbles are in ``[1, 15]``, so the byte is the sum ``lo + 16 hi + 136``
    (mod 256: uint8 arithmetic wraps a negative ``q``), two operations."""
    u = q.view(torch.uint8)
    return torch.add(u[:, 0::2], u[:, 1::2], alpha=16, out=out).add_(136)


def unpack_int4(packed: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: ``(rows, k)`` uint8 -> ``q``, ``(rows, 2 k)`` int8 (a preallocated scratch)."""
    u = q.view(torch.uint8)
    torch.bitwise_and(packed, 15, out=u[:, 0::2])
    torch.bitwise_right_shift(packed, 4, out=u[:, 1::2])
    return q.sub_(8)


def _check_out(name: str, t: torch.Tensor, shape, dtype: torch.dtype) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{name}: got {tuple(t.shape)} {t.dtype}; needs {tuple(shape)} {dtype}")
