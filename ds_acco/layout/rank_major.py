"""Several dim-0-sharded parameters in one collective: FSDP2's rank-major packing.

FSDP2 shards every parameter on dim 0 with ``torch.chunk`` semantics (each rank holds ``c = ceil(d0 / N)`` rows,
zero-padded) and keeps each rank's chunk of each parameter as its own tensor. One reduce-scatter or all-gather per
*parameter* pays the link's latency hundreds of times a round on a GPT; FSDP2 itself issues one per ``fully_shard`` unit
by packing the unit's chunks **rank-major**: rank ``r``'s region of the collective buffer is the concatenation of every
parameter's ``r``-th chunk, so a reduce-scatter hands rank ``r`` exactly its chunks and an all-gather of the
concatenated shards rebuilds the whole unit.

The compute parameters and the gradient accumulators cannot be views of a rank-major buffer (a parameter's rows are
spread over ``N`` regions), so they stay in a **param-major** buffer whose layout (:attr:`RankMajorPacking.layout`) pads
each parameter to ``N * c`` rows. Viewed as ``(N, c * row)``, parameter ``i``'s block and its column band of the
rank-major buffer viewed as ``(N, S)`` hold the same rows, and packing is one ``torch.cat`` along dim 1 (FSDP2's
``chunk_cat``), unpacking one ``torch.split_with_sizes_copy`` (FSDP2's copy-out). Both run on the communication thread,
inside the round.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch

from .flat_buffer import FlatLayout


class RankMajorPacking:
    """Where a group of dim-0 chunk-sharded parameters (full ``shapes``, in packing order) sits in param-major
    and rank-major space; ``masters``: this rank's shard of each, 1-D, ``c_i * row_i`` elements (FSDP2's padded
    local shards), whose concatenation the round publishes."""

    def __init__(self, shapes: Sequence[torch.Size], world_size: int, masters: Sequence[torch.Tensor]):
        self.world_size = N = world_size
        shapes = [torch.Size(s) for s in shapes]
        rows = [s[0] if len(s) else 1 for s in shapes]
        row_numels = [math.prod(s[1:]) if len(s) else 1 for s in shapes]
        self.chunk_numels = [-(-d0 // N) * k for d0, k in zip(rows, row_numels)]
        self.shard_numel = sum(self.chunk_numels)
        if self.shard_numel == 0:
            raise ValueError("RankMajorPacking: the parameters hold no element")
        numels = [d0 * k for d0, k in zip(rows, row_numels)]
        offsets = list(itertools.accumulate((N * m for m in self.chunk_numels[:-1]), initial=0))
        self.layout = FlatLayout(tuple(numels), tuple(shapes), tuple(offsets), offsets[-1] + numels[-1],
                                 N * self.shard_numel, N)
        self.masters = list(masters)
        wrong = [i for i, (m, n) in enumerate(zip(self.masters, self.chunk_numels)) if m.numel() != n or m.dim() != 1]
        if len(self.masters) != len(shapes) or wrong:
            raise ValueError(f"RankMajorPacking: master shards {wrong} are not 1-D padded dim-0 chunks "
                             f"of {self.chunk_numels} elements")

    def _blocks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's padded block of a param-major buffer, viewed ``(N, chunk)``."""
        N = self.world_size
        return [flat.narrow(0, o, N * m).view(N, m) for o, m in zip(self.layout.offsets, self.chunk_numels)]

    def pack(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        torch.cat(self._blocks(flat), dim=1, out=out.view(self.world_size, self.shard_numel))
        return out

    def unpack(self, packed: torch.Tensor, flat: torch.Tensor) -> None:
        """Copy a rank-major buffer (e.g. an all-gather output) into the param-major ``flat``."""
        torch.split_with_sizes_copy(packed.view(self.world_size, self.shard_numel), self.chunk_numels, dim=1,
                                    out=self._blocks(flat))

    def shard(self, flat: torch.Tensor, rank: int) -> torch.Tensor:
        return torch.cat([b[rank] for b in self._blocks(flat)])

    def read_masters(self, out: torch.Tensor) -> None:
        torch.cat([m.detach() for m in self.masters], out=out)

    def split_shard(self, shard: torch.Tensor) -> list[torch.Tensor]:
        """Views of a rank-major shard (e.g. a reduced gradient), one per parameter's padded chunk."""
        return list(shard.split(self.chunk_numels))
