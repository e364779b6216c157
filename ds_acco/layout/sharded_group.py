"""The parameter group a front end hands the round engine: its buffers, its master shard, its layout.

Why a class of its own: this is the adapter's whole answer to "where do buffers live". The
DeepSpeed front end builds it from DeepSpeed's ZeRO-1 flat groups, the FSDP2 front end from
FSDP2's dim-0 shards (with a :class:`~ds_acco.layout.rank_major.RankMajorPacking`), the plain
front end with :func:`build_sharded_groups`; the round engine sees nothing else of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from .flat_buffer import FlatLayout, flatten_into, rebind_params
from .rank_major import RankMajorPacking


@dataclass
class ShardedGroup:
    """One parameter group as the round engine sees it.

    Attributes:
        params: the compute parameters, views into ``flat``.
        flat: compute-parameter buffer (compute dtype, ``layout.padded_numel``).
        master: this rank's fp32 master shard, the tensor the shard optimizer steps (``layout.shard_numel`` elements);
            None with ``packing``, whose masters are one tensor per parameter.
        rebind: called with a flat buffer at a swap; the default re-points ``params`` at it. Adapters override it when
            their framework keeps references to the flat buffer.
        packing: set when the group's shards are per-parameter dim-0 chunks (FSDP2): rank ``r``'s shard is then not a
            slice of ``flat`` but the rank-major concatenation of the parameters' ``r``-th chunks, and the round packs
            and unpacks around its collectives.
    """

    params: list[nn.Parameter]
    layout: FlatLayout
    flat: torch.Tensor
    master: Optional[torch.Tensor]
    rebind: Callable[[torch.Tensor], None] | None = field(default=None)
    packing: Optional[RankMajorPacking] = field(default=None)

    def bind(self, flat: torch.Tensor) -> None:
        if self.rebind is not None:
            self.rebind(flat)
        else:
            rebind_params(self.params, self.layout, flat)
        self.flat = flat

    def read_master(self, out: torch.Tensor) -> None:
        """Copy this rank's master shard into ``out`` (``layout.shard_numel`` elements, any dtype)."""
        if self.packing is not None:
            self.packing.read_masters(out)
        else:  # a detach is one more operation on a round's thread, needless where autograd records nothing
            out.copy_(self.master if not torch.is_grad_enabled() else self.master.detach())

    def comm_input(self, buf: torch.Tensor, scratch: Optional[torch.Tensor]) -> torch.Tensor:
        """What the reduce-scatter sends for the flat buffer ``buf``: itself, or its copy into ``scratch``
        (rank-major with ``packing``; cast when ``scratch`` has another dtype)."""
        if self.packing is not None:
            return self.packing.pack(buf, scratch)
        return buf if scratch is None else scratch.copy_(buf)

    def compute_shard(self, flat: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s shard of a compute buffer laid out like ``flat`` (a new tensor)."""
        if self.packing is not None:
            return self.packing.shard(flat, rank)
        return self.layout.shard(flat, rank).clone()


def build_sharded_groups(
    param_groups: Sequence[Sequence[nn.Parameter]], world_size: int, rank: int, alignment: int = 1
) -> list[ShardedGroup]:
    """Flatten each group of parameters and cut this rank's fp32 master shard from it (the plain front end)."""
    groups = []
    for params in param_groups:
        params = list(params)
        if not params:
            raise ValueError("a parameter group is empty")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"a parameter group mixes dtypes {sorted(map(str, dtypes))}; split it by dtype")
        layout = FlatLayout.for_params(params, world_size, alignment)
        flat = layout.new_buffer(params[0])
        flatten_into(params, layout, flat)
        master = layout.shard(flat, rank).detach().clone().float()
        groups.append(ShardedGroup(params=params, layout=layout, flat=flat, master=master))
    return groups
