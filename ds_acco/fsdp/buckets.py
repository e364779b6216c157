"""``fully_shard`` units packed into buckets, one round-engine group per bucket.

A collective pays the link's latency (and, on gloo, a few milliseconds of a busy host's
scheduling) once per call: consecutive small units merged into one bucket cost one
reduce-scatter and one all-gather instead of one per unit (``bucket_cap_mb``, DDP's knob of
the same name). The layout: the Note in :mod:`ds_acco.fsdp._fsdp2`.
"""

from __future__ import annotations

from typing import Iterable

import torch

from ds_acco.layout.rank_major import RankMajorPacking
from ds_acco.layout.sharded_group import ShardedGroup

from ._fsdp2 import FSDP2Model, ManagedParam

DEFAULT_BUCKET_CAP_MB = 25.0


def pack_buckets(units: Iterable[list[ManagedParam]], cap_bytes: float) -> list[list[ManagedParam]]:
    """Consecutive ``fully_shard`` units of one compute dtype merged until a bucket holds ``cap_bytes``.

    A unit is never split; ``cap_bytes <= 0`` keeps one bucket per unit.
    """
    buckets: list[list[ManagedParam]] = []
    open_bucket: dict[torch.dtype, tuple[int, int]] = {}  # dtype -> (bucket index, bytes in it)
    for unit in units:
        dtype, size = unit[0].unsharded.dtype, sum(p.unsharded.numel() * p.unsharded.element_size() for p in unit)
        at = open_bucket.get(dtype)
        if at is not None and cap_bytes > 0 and at[1] + size <= cap_bytes:
            buckets[at[0]].extend(unit)
            open_bucket[dtype] = (at[0], at[1] + size)
        else:
            buckets.append(list(unit))
            open_bucket[dtype] = (len(buckets) - 1, size)
    return buckets


def unit_groups(fsdp: FSDP2Model, world: int,
                 bucket_cap_mb: float) -> tuple[list[ShardedGroup], list[list[ManagedParam]]]:
    """One packed round-engine group per bucket of ``fully_shard`` units (:func:`pack_buckets`).

    The trainable parameters' compute data moves into the group's param-major buffer (frozen
    ones get a private copy); the group's shards are FSDP2's padded local shards.
    """
    units: dict[tuple[int, torch.dtype], list[ManagedParam]] = {}
    for p in fsdp.params:
        if not p.trainable:
            fsdp.own_storage(p, None)  # frozen: a private copy, never updated
            continue
        units.setdefault((id(p.group), p.unsharded.dtype), []).append(p)
    units = pack_buckets(units.values(), bucket_cap_mb * 2 ** 20)
    groups = []
    for unit in units:
        try:
            packing = RankMajorPacking([p.unsharded.shape for p in unit], world, [p.master for p in unit])
        except ValueError as err:
            raise RuntimeError(
                f"ds_acco.fsdp: FSDP2's local shards of {[p.fqn for p in unit]} are not padded dim-0 chunks "
                f"({err}); is torch {torch.__version__} supported?"
            ) from err
        flat = packing.layout.new_buffer(unit[0].unsharded)
        for p, view in zip(unit, packing.layout.views(flat)):
            with torch.no_grad():
                view.copy_(p.unsharded.detach())
            fsdp.own_storage(p, view)
        groups.append(ShardedGroup(params=[p.unsharded for p in unit], layout=packing.layout, flat=flat,
                                   master=None, packing=packing))
    return groups, units


