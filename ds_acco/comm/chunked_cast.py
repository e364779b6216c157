"""Reduce-scatter of a gradient accumulator in another dtype, cast chunk by chunk.

When ``acco.comm_dtype`` differs from ``acco.grad_accum_dtype`` (e.g. fp32 accumulators, a bf16 payload) the accumulator
must be cast before it travels. Casting it whole costs a model-sized buffer of the comm dtype for the whole run. Instead
each rank's shard is cut into chunks of ``k`` elements; chunk ``j`` of the reduce-scatter input is the ``j``-th chunk of
every rank's shard (``N`` strided pieces of flat space), cast into a ``N·k`` scratch, reduce-scattered into a ``k``
output and widened into the fp32 gradient shard. Every element is summed across ranks exactly as in one reduce-scatter
of the whole cast buffer, so the result is the same; the scratch is ``CAST_CHUNK_ELEMS`` elements whatever the model
size.
"""

from __future__ import annotations

import torch

from .collectives import RoundCollectives

CAST_CHUNK_ELEMS = 1 << 24
"""Elements of the cast scratch over all ranks (32 MiB in bf16): few enough collectives per round
(``P / CAST_CHUNK_ELEMS``) that their launch cost stays small next to the payload."""


class ChunkedCastReduceScatter:
    """Reduce-scatter ``full`` (any dtype) in ``comm_dtype`` into an fp32 shard, ``k`` shard elements at a time
    (``chunk_elems``: scratch elements over all ranks)."""

    def __init__(self, padded_numel: int, world_size: int, comm_dtype: torch.dtype, device: torch.device,
                 chunk_elems: int = CAST_CHUNK_ELEMS):
        if padded_numel % world_size:
            raise ValueError(f"padded_numel {padded_numel} is not a multiple of world_size {world_size}")
        self.world_size = world_size
        self.shard_numel = padded_numel // world_size
        self.k = max(1, min(self.shard_numel, chunk_elems // world_size))
        self.send = torch.empty(world_size * self.k, dtype=comm_dtype, device=device)
        self.recv = torch.empty(self.k, dtype=comm_dtype, device=device)

    def __call__(self, coll: RoundCollectives, out: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        """Sum ``full`` over ranks in the comm dtype; this rank's shard lands in ``out`` (widened)."""
        rows = full.view(self.world_size, self.shard_numel)  # row r: rank r's shard
        for start in range(0, self.shard_numel, self.k):
            k = min(self.k, self.shard_numel - start)
            send = self.send[: self.world_size * k]
            send.view(self.world_size, k).copy_(rows[:, start:start + k])
            coll.reduce_scatter_sum(self.recv[:k], send)
            out[start:start + k].copy_(self.recv[:k])
        return out
