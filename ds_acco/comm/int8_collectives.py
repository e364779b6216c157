"""Quantised collectives: an int8 reduce-scatter and a reduced-precision all-gather.

[Note: the int8 reduce-scatter]
A summing reduce-scatter cannot run on int8 payloads (the sum of int8 blocks with different scales is meaningless, and
it would overflow), so it is built from an all-to-all, as in torchft's ``collectives.py``::

    rank r:   full (numel)  --pad-->  N chunks of `chunk` elements
              chunk d --quantise (blockwise absmax)--> wire row d  ----all_to_all---->  rank d
    rank d:   N wire rows (one per source) --dequantise, sum in fp32--> out (chunk)

A *wire row* packs one chunk for one destination as bytes::

    [ fp32 scales: 4 * num_blocks(chunk) | int8 payload: chunk | 0-3 bytes to the next multiple of 4 ]

so scales and payload travel in one collective, and every row's scales start on a 4-byte boundary (they are read back
through ``Tensor.view(torch.float32)``). Each rank keeps its own row, so it sends and receives ``(N - 1) * row_bytes``
bytes, which :meth:`RoundCollectives.all_to_all` adds to ``coll.wire`` exactly. Padding (``numel`` not divisible by
``N``) is zeros, quantised and sent; block padding is not needed (a row's last block may be short).

[Note: error feedback]
With ``error_feedback`` the local quantisation residual ``x - dequant(quant(x))`` is kept (one fp32 buffer the size of
the input, per buffer exchanged) and added to the next call's input. The sum over calls of what was sent then differs
from the sum of the inputs by only the last residual, instead of by the sum of all residuals. A residual that is not
finite (inf/NaN input, a step that ``check_finite`` skips) is reset to zero so it cannot poison later rounds.
"""

from __future__ import annotations

from typing import Optional

import torch

from ds_acco.numerics.dtypes import DTYPES
from ds_acco.numerics.finite import all_finite, count_non_finite
from ds_acco.numerics.quantization import (DEFAULT_BLOCK_SIZE, QMAX, QMAX_INT4, absmax_into, block_parts,
                                           check_block_size, dequantize_log, dequantize_parts, inverse_scales,
                                           num_blocks, quantize_log, quantize_parts, scale_parts)
from ds_acco.numerics.views import ViewCache

from . import collectives
from .collectives import RoundCollectives

WIRE_DTYPES = ("fp32", "bf16", "int8", "log8")
LOG_PIECE = 1 << 18
"""Elements a ``log8`` row converts at once (whole blocks): a few MiB of scratch whatever the shard's size."""
CUDA_RECV_BYTES = 1 << 26
"""Received wire rows of one delta all-gather piece on a GPU, over all ranks (64 MiB). Each piece costs its
thread a dozen kernel launches that hold the Python interpreter while the training thread launches its
own: on an H200, 1 MiB rows (25 pieces for a 25 M-parameter shard) took 13 ms of host time per round."""


def default_piece_numel(block_size: int, world_size: int, device: Optional[torch.device], bits: int = 8) -> int:
    """Elements per rank in one delta all-gather piece: as many whole blocks as fit, with their scales, in
    ``collectives.MAX_PIECE_NUMEL`` bytes (``bits`` 4: twice as many, in the same bytes), or on an accelerator
    (any device but the CPU) as many int8 blocks as fit in ``CUDA_RECV_BYTES / world_size`` if that is more
    (there the fp32 temporaries of a piece, not its bytes, are what bounds it)."""
    # b blocks: 4 b bytes of scales and b * block_size * bits / 8 of payload, < 4 more to align
    cpu = (collectives.MAX_PIECE_NUMEL - 4) * 8 // (32 + block_size * bits) * block_size
    if device is not None and torch.device(device).type != "cpu":
        return max(cpu, (CUDA_RECV_BYTES // world_size - 4) // (block_size + 4) * block_size)
    return cpu


class _WireRows:
    """``rows`` packed wire rows (scales, payload, alignment) of ``numel`` elements each; ``bits`` 8 or 4
    (int4: two elements per payload byte, through an int8 scratch of the levels). ``log``: non-negative values as
    :func:`~ds_acco.numerics.quantization.quantize_log` codes (two scales a block), quantised and dequantised
    :data:`LOG_PIECE` elements at a time: its arithmetic takes several fp32 copies of what it converts.

    Every view of the rows that a call needs is cut here, once, and a call works on all rows at once (or one
    row of them) in a few operations: see the note in :mod:`ds_acco.numerics.quantization`."""

    def __init__(self, rows: int, numel: int, block_size: int, device: Optional[torch.device], bits: int = 8,
                 log: bool = False):
        self.numel, self.block_size, self.log = numel, block_size, log
        self.qmax = QMAX if bits == 8 else QMAX_INT4
        self.scale_bytes = 4 * (2 if log else 1) * num_blocks(numel, block_size)
        self.payload_bytes = numel if bits == 8 else -(-numel // 2)
        self.row_bytes = self.scale_bytes + -(-self.payload_bytes // 4) * 4  # payload padded to 4 bytes
        self.buffer = torch.zeros(rows, self.row_bytes, dtype=torch.int8, device=device)
        self.flat = self.buffer.view(-1)
        self.scales = self.buffer[:, : self.scale_bytes].view(torch.float32)
        self.payload = self.buffer[:, self.scale_bytes : self.scale_bytes + self.payload_bytes]
        # int4: the levels before packing (an even width: a lone last element pairs with a zero)
        self._levels = torch.zeros(rows, 2 * self.payload_bytes, dtype=torch.int8, device=device) if bits == 4 \
            else None
        if log:
            return
        levels = self.payload if self._levels is None else self._levels[:, :numel]
        self._q = block_parts(levels, block_size)  # the levels, block by block
        self._amax = scale_parts(self.scales, numel, block_size, broadcast=False)
        # qmax / scale while quantising, then scale / qmax (what a level is worth): one buffer, 4 bytes a block
        self._inv = self._factor = torch.empty(rows, num_blocks(numel, block_size), dtype=torch.float32,
                                               device=device)
        self._inv_parts = self._factor_parts = scale_parts(self._inv, numel, block_size)
        self._row_q = [[t[r:r + 1] for t in self._q] for r in range(rows)]
        self._row_factor = [[t[r:r + 1] for t in self._factor_parts] for r in range(rows)]
        if self._levels is not None:
            u = self._levels.view(torch.uint8)
            self._packed, self._even, self._odd = self.payload.view(torch.uint8), u[:, 0::2], u[:, 1::2]

    def _log_pieces(self):
        """``(elements, scales)`` slices of whole blocks, :data:`LOG_PIECE` elements at most."""
        step = max(1, LOG_PIECE // self.block_size) * self.block_size
        for a in range(0, self.numel, step):
            b = min(a + step, self.numel)
            yield slice(a, b), slice(2 * a // self.block_size, 2 * num_blocks(b, self.block_size))

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` (``(rows, numel)``) cut as the rows are (for :meth:`pack`'s ``x_parts``, made once per buffer)."""
        return block_parts(x, self.block_size)

    def pack(self, x: torch.Tensor, x_parts: Optional[list[torch.Tensor]] = None) -> None:
        """Quantise ``x`` (``(rows, numel)``; ``x_parts``: its :meth:`parts`, when the caller keeps them) into
        the rows."""
        if self.log:
            for elements, scales in self._log_pieces():
                q = quantize_log(x[:, elements], self.block_size)
                self.payload[:, elements].view(torch.uint8).copy_(q.payload)
                self.scales[:, scales].copy_(q.scales)
            return
        parts = self.parts(x) if x_parts is None else x_parts
        absmax_into(parts, self._amax)
        inverse_scales(self.scales, self.qmax, self._inv)
        quantize_parts(parts, self._inv_parts, self._q, self.qmax)
        if self._levels is not None:  # pack_int4 on the views cut once
            torch.add(self._even, self._odd, alpha=16, out=self._packed).add_(136)

    def levels(self) -> None:
        """Make the levels of received rows readable: int4 unpacks the payload (all rows); int8 reads it as it
        is. The factors each level is worth are computed here too."""
        if self._levels is not None:
            torch.bitwise_and(self._packed, 15, out=self._even)
            torch.bitwise_right_shift(self._packed, 4, out=self._odd)
            self._levels.sub_(8)
        self.factors()

    def factors(self) -> None:
        """``scale / qmax`` of every block of every row (after :meth:`pack`, or after :meth:`levels`)."""
        torch.div(self.scales, self.qmax, out=self._factor)

    def dequantize(self, out_parts: list[torch.Tensor], accumulate: bool = False, row: Optional[int] = None) -> None:
        """``out (+)= level * factor`` for every row (``out_parts``: :meth:`parts` of ``(rows, numel)``) or for
        ``row`` (of ``(1, numel)``); needs :meth:`levels` (received rows) or :meth:`pack` and :meth:`factors`."""
        q, f = (self._q, self._factor_parts) if row is None else (self._row_q[row], self._row_factor[row])
        dequantize_parts(q, f, out_parts, accumulate)

    def unpack(self, out: torch.Tensor, accumulate: bool = False, row: Optional[int] = None) -> torch.Tensor:
        """Dequantise the rows (or only ``row``) into ``out`` (``(rows, numel)``, or ``(1, numel)``)."""
        rows = slice(None) if row is None else slice(row, row + 1)
        if self.log:
            for elements, scales in self._log_pieces():
                value = dequantize_log(self.payload[rows, elements].view(torch.uint8), self.scales[rows, scales],
                                       self.block_size)
                out[:, elements].add_(value) if accumulate else out[:, elements].copy_(value)
            return out
        self.levels()
        self.dequantize(self.parts(out), accumulate, row)
        return out


class Int8ReduceScatter:
    """Summing reduce-scatter of a flat buffer as blockwise int8 (or int4), for one buffer size (the note above):
    rank ``r`` receives the fp32 sum of chunk ``r``, ``chunk = ceil(numel / N)``. ``block_size`` elements share
    one fp32 scale; ``bits``: 8, or 4 (acco's estimate rounds: half the bytes; the commit sends the residual on).
    """

    def __init__(
        self,
        numel: int,
        world_size: int,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        error_feedback: bool = False,
        device: Optional[torch.device] = None,
        bits: int = 8,
    ):
        if numel < 1 or world_size < 1:
            raise ValueError(f"numel and world_size must be >= 1, got {numel}, {world_size}")
        if bits not in (8, 4):
            raise ValueError(f"bits: got {bits!r}; allowed: 8 or 4")
        check_block_size(block_size)
        self.numel, self.world_size, self.block_size = numel, world_size, block_size
        self.chunk = -(-numel // world_size)
        self.padded_numel = self.chunk * world_size
        self._send = _WireRows(world_size, self.chunk, block_size, device, bits)
        self._recv = _WireRows(world_size, self.chunk, block_size, device, bits)
        needs_work = error_feedback or self.padded_numel != numel
        self._work = torch.zeros(self.padded_numel, dtype=torch.float32, device=device) if needs_work else None
        self.residual: Optional[torch.Tensor] = (
            torch.zeros(self.padded_numel, dtype=torch.float32, device=device) if error_feedback else None
        )
        self._acc: Optional[torch.Tensor] = None
        rows = lambda t: self._send.parts(t.view(world_size, self.chunk))  # noqa: E731
        self._rows = ViewCache(rows)
        """The block views of a caller's buffer seen as ``(N, chunk)`` rows: the accumulators, made once each."""
        self._own = {name: rows(t) for name, t in (("work", self._work), ("residual", self.residual)) if t is not None}
        self._out = ViewCache(lambda t: self._recv.parts(t.view(1, self.chunk)), size=4)
        self._numel_view = ViewCache(lambda t: t.reshape(-1)[: self.numel], size=4)

    @property
    def bytes_per_call(self) -> int:
        """Bytes this rank sends (and receives) per call: ``(N - 1)`` wire rows."""
        return (self.world_size - 1) * self._send.row_bytes

    def __call__(self, coll: RoundCollectives, out: torch.Tensor, full: torch.Tensor,
                 residual_out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Reduce-scatter ``full`` (sum) into ``out`` through quantised wire rows.

        Args:
            out: this rank's chunk of the sum, ``chunk`` elements (fp32 recommended; another dtype receives the fp32 sum
                rounded once).
            full: this rank's contribution, ``numel`` elements of any floating dtype; read only.
            residual_out: ``numel`` elements: receives what this rank's quantisation lost,
                ``full - dequant(quant(full))`` (acco's commit sends it after an int4 estimate).
        """
        if full.numel() != self.numel or out.numel() != self.chunk:
            raise ValueError(
                f"Int8ReduceScatter built for {self.numel} -> {self.chunk} elements, "
                f"got {full.numel()} -> {out.numel()}"
            )
        if coll.world_size != self.world_size:
            raise ValueError(f"Int8ReduceScatter built for {self.world_size} ranks, group has {coll.world_size}")
        flat = full if full.dim() == 1 else full.reshape(-1)
        if self._work is None:
            x_parts = self._rows(flat)
        else:
            self._numel_view(self._work).copy_(flat)
            if self.residual is not None:
                self._work.add_(self.residual)
            x_parts = self._own["work"]
        self._send.pack(None, x_parts)
        if residual_out is not None or self.residual is not None:
            self._send.factors()
        if residual_out is not None:
            lost = residual_out if residual_out.dim() == 1 else residual_out.reshape(-1)
            if lost.numel() != self.numel or self.residual is not None:
                raise ValueError(f"residual_out: got {lost.numel()} elements for {self.numel}, error feedback "
                                 f"{self.residual is not None}; needs {self.numel} elements and no error feedback")
            sent = lost
            if self._work is None:
                self._send.dequantize(self._rows(lost))
            else:  # padded: the work buffer is free once packed (no error feedback reads it)
                self._send.dequantize(self._own["work"])
                sent = self._numel_view(self._work)
                if lost.dtype != torch.float32:
                    sent = lost.copy_(sent)  # rounded to the residual's dtype before the subtraction, as it was
            torch.sub(flat, sent, out=lost)  # full - sent: what this rank's quantisation lost
        if self.residual is not None:
            self._send.dequantize(self._own["residual"])
            torch.sub(self._work, self.residual, out=self.residual)
            if not all_finite(self.residual):
                self.residual.zero_()
        coll.all_to_all(self._recv.flat, self._send.flat)
        direct = out.dtype == torch.float32 and out.is_contiguous()
        if not direct and self._acc is None:
            self._acc = torch.empty(self.chunk, dtype=torch.float32, device=out.device)
        acc = out if direct else self._acc
        acc_parts = self._out(acc)
        acc.zero_()
        self._recv.levels()
        for src in range(self.world_size):  # rank order; O(chunk) temporaries only
            self._recv.dequantize(acc_parts, accumulate=True, row=src)
        if not direct:
            out.copy_(acc.view(out.shape))
        return out

    def reset_error_feedback(self) -> None:
        """Forget the kept residual (e.g. after loading a checkpoint)."""
        if self.residual is not None:
            self.residual.zero_()


class ShardAllGather:
    """All-gather of equal shards, sent as fp32, bf16, blockwise int8 or (non-negative values) log8 codes.

    Every rank, the shard's owner included, ends with the same values: the owner's
    own part is also rounded through the wire dtype, so replicas never diverge. ``wire_dtype``: ``"fp32"``,
    ``"bf16"``, ``"int8"`` (blockwise absmax, one fp32 scale per ``block_size`` elements) or ``"log8"``
    (non-negative values only: :func:`~ds_acco.numerics.quantization.quantize_log`, two scales a block).
    """

    def __init__(
        self,
        shard_numel: int,
        world_size: int,
        wire_dtype: str = "bf16",
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        device: Optional[torch.device] = None,
    ):
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype: got {wire_dtype!r}; allowed: {', '.join(map(repr, WIRE_DTYPES))}")
        if shard_numel < 1 or world_size < 1:
            raise ValueError(f"shard_numel and world_size must be >= 1, got {shard_numel}, {world_size}")
        self.shard_numel, self.world_size, self.wire_dtype = shard_numel, world_size, wire_dtype
        if wire_dtype in ("int8", "log8"):
            log = wire_dtype == "log8"
            self._send_rows = _WireRows(1, shard_numel, block_size, device, log=log)
            self._recv_rows = _WireRows(world_size, shard_numel, block_size, device, log=log)
        else:
            dt = DTYPES[wire_dtype]
            self._send = torch.empty(shard_numel, dtype=dt, device=device)
            self._recv = torch.empty(world_size * shard_numel, dtype=dt, device=device)

    @property
    def bytes_per_call(self) -> int:
        """Bytes this rank sends (and receives) per call by the ring model."""
        if self.wire_dtype in ("int8", "log8"):
            return (self.world_size - 1) * self._send_rows.row_bytes
        return (self.world_size - 1) * self._send.numel() * self._send.element_size()

    def __call__(self, coll: RoundCollectives, full: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        """Gather every rank's ``shard`` into ``full`` (rank order, any floating dtype), through the wire dtype."""
        if full.numel() != self.world_size * self.shard_numel or shard.numel() != self.shard_numel:
            raise ValueError(
                f"ShardAllGather built for {self.shard_numel} x {self.world_size}, got shard {shard.numel()}, "
                f"full {full.numel()}"
            )
        if self.wire_dtype in ("int8", "log8"):
            self._send_rows.pack(shard.reshape(1, -1))
            coll.all_gather(self._recv_rows.buffer.view(-1), self._send_rows.buffer.view(-1))
            rows = full.view(self.world_size, self.shard_numel)
            for r in range(self.world_size):  # a row at a time: a dequantisation's scratch stays one shard's size
                self._recv_rows.unpack(rows[r : r + 1], row=r)
            return full
        self._send.copy_(shard.reshape(-1))
        if full.dtype == self._send.dtype and full.is_contiguous():
            coll.all_gather(full.view(-1), self._send)
        else:
            coll.all_gather(self._recv, self._send)
            full.copy_(self._recv.view(full.shape))
        return full


class Int8DeltaAllGather:
    """All-gather of new parameter shards as blockwise int8 *deltas* from what every rank holds.

    [Note: the int8 delta all-gather]
    After a round, every rank needs every rank's new shard. All of them already hold ``base``, the compute parameters
    the round started from, bit-identically. So the owner of shard ``r`` sends only ``int8(new_r - base_r)`` (one byte
    per element plus one fp32 scale per block), and every rank, the owner included, writes::

        out_r = base_r + dequant(wire row r)          (in fp32, then cast to out's dtype)

    from the *received* rows, so all replicas stay bit-identical. ``new - base`` is one optimizer step (or, for an acco
    commit, the difference between the commit and its own lookahead), small and well scaled, so the round-trip error per
    element is at most ``absmax(block) / 254``. Nothing accumulates: the next round's delta is taken against the
    replicas' values again, so it carries this round's error (error feedback without a residual buffer), and the
    distance of the replicas to the fp32 master is one quantisation step of the last delta.

    The shard travels in pieces of whole blocks, one all-gather each, so the receive buffer is ``N`` wire rows of one
    piece, not a model-sized one; blocks never straddle pieces, so the result is the same as in one piece. By default a
    piece's wire row (scales and payload) fits in one of the pieces :meth:`RoundCollectives.all_gather` cuts on gloo, so
    nothing is cut and copied twice.

    Args:
        piece_numel: elements per rank per all-gather (rounded down to whole blocks); None: :func:`default_piece_numel`.
        device: where the wire buffers and the ``shard_numel`` fp32 scratch live.
        bits: 8, or 4 (acco's estimate rounds: their lookahead only steers where the next gradients are computed, and
            the commit's delta, taken against what landed, carries the error).
    """

    def __init__(self, shard_numel: int, world_size: int, *, block_size: int = DEFAULT_BLOCK_SIZE,
                 piece_numel: Optional[int] = None, device: Optional[torch.device] = None, bits: int = 8):
        if shard_numel < 1 or world_size < 1:
            raise ValueError(f"shard_numel and world_size must be >= 1, got {shard_numel}, {world_size}")
        if bits not in (8, 4):
            raise ValueError(f"bits: got {bits!r}; allowed: 8 or 4")
        check_block_size(block_size)
        self.shard_numel, self.world_size, self.block_size = shard_numel, world_size, block_size
        if piece_numel is None:
            piece_numel = default_piece_numel(block_size, world_size, device, bits)
        piece = min(shard_numel, max(block_size, piece_numel // block_size * block_size))
        self.pieces = [(start, min(piece, shard_numel - start)) for start in range(0, shard_numel, piece)]
        self._rows = {n: (_WireRows(1, n, block_size, device, bits), _WireRows(world_size, n, block_size, device, bits))
                      for n in {n for _, n in self.pieces}}
        self._delta = torch.empty(shard_numel, dtype=torch.float32, device=device)
        self._delta_pieces = [self._delta[a:a + n] for a, n in self.pieces]
        self._delta_parts = [self._rows[n][0].parts(d.view(1, -1))
                             for d, (_, n) in zip(self._delta_pieces, self.pieces)]
        self._views = ViewCache(self._cut)
        """``base`` and ``out`` cut by rank and piece, once per buffer (the compute parameters and accumulators)."""

    @property
    def scratch(self) -> torch.Tensor:
        """A ``shard_numel`` fp32 buffer of this all-gather's that nothing reads between calls (a round's shard
        step borrows it: :mod:`ds_acco.rounds.round_work`)."""
        return self._delta

    def _cut(self, t: torch.Tensor) -> dict:
        rows = t.view(self.world_size, self.shard_numel)
        pieces = [rows[:, a:a + n] for a, n in self.pieces]
        return {"own": list(rows.unbind(0)), "pieces": pieces,
                "blocks": [self._rows[n][1].parts(p) for p, (_, n) in zip(pieces, self.pieces)],
                "row_pieces": [[row[a:a + n] for a, n in self.pieces] for row in rows.unbind(0)]}

    @property
    def bytes_per_call(self) -> int:
        """Bytes this rank sends (and receives) per call by the ring model."""
        return (self.world_size - 1) * sum(self._rows[n][0].row_bytes for _, n in self.pieces)

    def __call__(self, coll: RoundCollectives, out: torch.Tensor, base: torch.Tensor,
                 new_shard: torch.Tensor) -> torch.Tensor:
        """Write ``base + dequant(int8(new - base))`` for every rank's shard into ``out``.

        Args:
            coll: the collectives to run on (its rank picks this rank's shard of ``base``).
            out: ``world_size * shard_numel`` elements, any floating dtype; may not alias ``base``.
            base: the parameters every rank holds (same values on every rank), same size as ``out``.
            new_shard: this rank's new values, ``shard_numel`` elements (fp32 recommended).
        """
        S, N = self.shard_numel, self.world_size
        if out.numel() != N * S or base.numel() != N * S or new_shard.numel() != S:
            raise ValueError(f"Int8DeltaAllGather built for {S} x {N}, got out {out.numel()}, base {base.numel()}, "
                             f"new shard {new_shard.numel()}")
        if out.data_ptr() == base.data_ptr():
            raise ValueError("Int8DeltaAllGather: out must not alias base (the delta is taken against base)")
        bv, ov = self._views(base), self._views(out)
        torch.sub(new_shard if new_shard.dim() == 1 else new_shard.reshape(-1), bv["own"][coll.rank], out=self._delta)
        if not all_finite(self._delta):
            raise ValueError(
                f"int8 delta all-gather: {count_non_finite(self._delta)} of {S} elements of rank {coll.rank}'s "
                "parameter delta are inf/NaN "
                "(non-finite master parameters); an int8 delta cannot carry them. Set "
                "acco.all_gather_quantization to 'none' to send exact parameters"
            )
        fp32 = out.dtype == torch.float32 and base.dtype == torch.float32
        for i, (start, n) in enumerate(self.pieces):
            send, recv = self._rows[n]
            send.pack(None, self._delta_parts[i])
            coll.all_gather(recv.flat, send.flat)
            recv.levels()
            if fp32:  # every row at once, straight into out: dequant(row) + base, as base + dequant(row)
                recv.dequantize(ov["blocks"][i])
                ov["pieces"][i].add_(bv["pieces"][i])
                continue
            for r in range(N):  # rank order; this rank's own delta is packed already: its memory is the scratch
                recv.dequantize(self._delta_parts[i], row=r)
                torch.add(self._delta_pieces[i], bv["row_pieces"][r][i], out=ov["row_pieces"][r][i])
        return out
