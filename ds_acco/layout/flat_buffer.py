"""Flat buffers and their partition across the data-parallel group.

Index spaces (the vocabulary every other module uses):

* **param space**: a parameter's own elements, ``0 .. p.numel()``.
* **flat space**: one contiguous buffer per parameter group, ``0 .. padded_numel``; parameter ``i`` lives at
  ``[offsets[i], offsets[i] + numel_i)``. Zero padding at the end makes ``padded_numel`` a multiple of
  ``world_size * alignment``.
* **shard space**: rank ``r`` owns flat elements ``[r * shard_numel, (r + 1) * shard_numel)``, the ZeRO-1 partition; its
  fp32 master copy and optimizer state cover exactly that.

Model parameters and gradients are *views* into flat buffers, so a swap at a round boundary re-points ``p.data`` (a
pointer move per parameter) instead of copying the model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from ds_acco.numerics.views import ViewCache


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter of a group sits in flat space, and how flat space is sharded."""

    numels: tuple[int, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    numel: int
    padded_numel: int
    world_size: int
    _swap_views: ViewCache = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the same three buffers rotate through the swap's roles (ds_acco.rounds.landing): four is one to spare
        object.__setattr__(self, "_swap_views", ViewCache(self.views, size=4))

    @classmethod
    def for_params(cls, params: Sequence[torch.Tensor], world_size: int, alignment: int = 1) -> "FlatLayout":
        """Pack ``params`` back to back, in order, and pad to a multiple of ``world_size * alignment``: each
        shard's element count is then a multiple of ``alignment`` (e.g. 2 or 4 so shards of a bf16 buffer
        start on NCCL-friendly addresses)."""
        if world_size < 1 or alignment < 1:
            raise ValueError(f"world_size and alignment must be >= 1, got {world_size}, {alignment}")
        numels = tuple(p.numel() for p in params)
        *offsets, total = itertools.accumulate(numels, initial=0)
        unit = world_size * alignment
        padded = max(unit, -(-total // unit) * unit)
        return cls(numels, tuple(p.shape for p in params), tuple(offsets), total, padded, world_size)

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_slice(self, rank: int) -> slice:
        return slice(rank * self.shard_numel, (rank + 1) * self.shard_numel)

    def shard(self, flat: torch.Tensor, rank: int) -> torch.Tensor:
        return flat[self.shard_slice(rank)]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        if flat.numel() != self.padded_numel:
            raise ValueError(f"flat buffer has {flat.numel()} elements, layout needs {self.padded_numel}")
        return [flat.narrow(0, o, n).view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def swap_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """:meth:`views` of a buffer the swap binds, cut once per buffer object: a swap re-points every parameter
        (and a replaced accumulator's gradients) at a buffer seen before, and cutting a parameter's view is two
        operations on the training thread, which on a GPU launches nothing while it does them (an H200 profile:
        a swap's views of the medium GPT took about 2 ms of the step, the compute stream idle)."""
        return self._swap_views(flat)

    def new_buffer(self, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros(self.padded_numel, dtype=dtype or like.dtype, device=like.device)


def flatten_into(params: Sequence[nn.Parameter], layout: FlatLayout, flat: torch.Tensor) -> None:
    for p, view in zip(params, layout.views(flat)):
        view.copy_(p.detach())
        p.data = view


def rebind_params(params: Sequence[nn.Parameter], layout: FlatLayout, flat: torch.Tensor) -> None:
    """Point every parameter at its view of ``flat`` without copying (the swap)."""
    for p, view in zip(params, layout.swap_views(flat)):
        p.data = view
