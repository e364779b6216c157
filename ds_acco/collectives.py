"""The collectives a round issues, with a byte count of what each puts on the wire.

Byte figures follow the bandwidth-optimal (ring) algorithms NCCL and gloo use
for large payloads: a reduce-scatter or all-gather of an ``M``-byte buffer over
``N`` ranks sends and receives ``M * (N - 1) / N`` bytes per rank, an all-reduce
twice that. They are the payload a link must carry, not packet-level counts;
the benchmark measures the interface counters next to them.

All collectives go to the round engine's own process group, created with the
configured timeout, so the background thread never interleaves with
collectives the training thread issues on the default group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# torch 2.13 renamed the *_tensor collectives; keep one spelling for the range we support.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class WireBytes:
    """Bytes this rank sent and received, by the ring model above, and how many collectives moved them."""

    sent: int = 0
    received: int = 0
    calls: int = 0

    def add(self, payload: int, world_size: int, factor: int = 1) -> None:
        self.calls += 1
        moved = factor * payload * (world_size - 1) // world_size
        self.sent += moved
        self.received += moved


class RoundCollectives:
    """Thin wrappers over ``torch.distributed`` on a dedicated process group."""

    def __init__(self, group: dist.ProcessGroup | None, timeout_s: float):
        base = group if group is not None else dist.group.WORLD
        ranks = dist.get_process_group_ranks(base)
        # Every rank of the default group must take part in new_group, in the same order.
        self.group = dist.new_group(ranks=ranks, timeout=timedelta(seconds=timeout_s))
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.wire = WireBytes()

    def check_peers_agree(self, mine: object, what: str) -> None:
        """Fail at start-up, not with a hang, when ranks hold different ``mine`` (configs, layouts).

        Raises:
            AccoConfigError: naming ``what`` and every rank's value.
        """
        from .config import AccoConfigError

        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.group)
        if any(theirs != mine for theirs in everyone):
            detail = "; ".join(f"rank {r}: {everyone[r]}" for r in range(self.world_size))
            raise AccoConfigError(f"{what} differ across ranks -> {detail}")

    def all_gather_small(self, local: torch.Tensor) -> torch.Tensor:
        """All-gather a tiny vector (counts, flags); returns ``(world_size, *local.shape)``."""
        out = torch.empty((self.world_size, *local.shape), dtype=local.dtype, device=local.device)
        _all_gather(out.view(-1), local.reshape(-1).contiguous(), group=self.group)
        self.wire.add(_nbytes(out), self.world_size)
        return out

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        self.wire.add(_nbytes(t), self.world_size, factor=2)
        return t

    def reduce_scatter_sum(self, out: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        """Sum ``full`` over ranks and keep this rank's ``1/N`` slice in ``out``."""
        _reduce_scatter(out, full, group=self.group)
        self.wire.add(_nbytes(full), self.world_size)
        return out

    def all_gather(self, full: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``shard`` into ``full`` (rank order)."""
        _all_gather(full, shard, group=self.group)
        self.wire.add(_nbytes(full), self.world_size)
        return full

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        """Send the ``r``-th of ``N`` equal slices of ``inp`` to rank ``r``; slice ``s`` of
        ``out`` receives rank ``s``'s. Each rank keeps one slice, so it sends and receives
        exactly ``M * (N - 1) / N`` bytes of an ``M``-byte ``inp`` (no ring model needed)."""
        dist.all_to_all_single(out, inp, group=self.group)
        self.wire.add(_nbytes(inp), self.world_size)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def destroy(self) -> None:
        try:
            dist.destroy_process_group(self.group)
        except (RuntimeError, ValueError):
            pass
