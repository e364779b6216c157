"""The FSDP front end's shard optimizer: FSDP2's DTensor parameters as master shards.

A round hands one packed 1-D fp32 gradient shard per bucket of ``fully_shard``
units (:mod:`ds_acco.layout.rank_major`); the user's optimizer holds one sharded DTensor
per parameter (what stock FSDP2 steps, and what DCP checkpoints).
:class:`DTensorShardOptimizer` maps one to the other.

[Note: no DTensor dispatch in a round]
Stepping torch's Adam/AdamW on DTensors costs a DTensor dispatch per operation
per parameter: on the benchmark's tiny GPT (52 parameters, CPU), 18 ms for
``optimizer.step()`` plus 5 ms to wrap the gradients, against under 3 ms for the
same arithmetic on the local tensors; in sync mode the training thread waits for
that step every round. Every operation of the step is elementwise on FSDP2's
``Shard(0)`` local shards, so for Adam/AdamW both the commit and the acco
estimate's lookahead run :class:`ds_acco.optim.adam_lookahead.FunctionalAdam` on
each parameter's chunk of the packed shards (:meth:`DTensorShardOptimizer._master_grads` /
``_master_outs``), bit-identically to ``optimizer.step()`` on the DTensors
(tests/test_fsdp.py compares them bit for bit, single-tensor and ``foreach``).
Other optimizers get DTensor gradients (:meth:`DTensorShardOptimizer._set_grads`)
and their own ``step()``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ds_acco.layout.rank_major import RankMajorPacking
from ds_acco.optim.shard_optimizer import ShardOptimizer

from ._fsdp2 import ManagedParam


class DTensorShardOptimizer(ShardOptimizer):
    """A :class:`ShardOptimizer` whose master shards are FSDP2's sharded DTensor parameters.

    Args:
        optimizer: built over the ``sharded`` parameters of ``params``.
        params: the trainable parameters, in the rounds' packing order.
        packings: one per round-engine group, covering ``params`` in order.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[ManagedParam],
                 packings: list[RankMajorPacking], lr_scheduler: Any):
        super().__init__(optimizer, [p.sharded for p in params], lr_scheduler)
        self._packings = packings
        with torch.no_grad():
            self._specs = [
                (p.sharded.to_local().shape, p.sharded.device_mesh, p.sharded.placements, p.sharded.shape,
                 p.sharded.stride())
                for p in params
            ]

    def _write_masters(self, outs) -> None:
        for packing, out in zip(self._packings, outs):
            packing.read_masters(out)

    def _master_grads(self, grads):
        """Each parameter's padded chunk of the packed gradient shards, in :attr:`masters` order."""
        return [chunk for packing, shard in zip(self._packings, grads) for chunk in packing.split_shard(shard)]

    def _master_outs(self, outs):
        """Each parameter's padded chunk of the packed output shards. The functional step and lookahead
        write a chunk's first ``local numel`` elements (its DTensor's local shard); the padding after
        them keeps what the round published there (the masters')."""
        return [chunk for packing, out in zip(self._packings, outs)
                for chunk in packing.split_shard(out[: packing.shard_numel])]

    def _set_grads(self, grads) -> None:
        """Each parameter's gradient: a view of its chunk, unpadded and shaped like the local shard (cast when the
        sharded parameters are not fp32)."""
        grads = self._master_grads(grads)
        for param, grad, (local_shape, mesh, placements, shape, stride) in zip(self.masters, grads, self._specs):
            local = grad.narrow(0, 0, local_shape.numel()).view(local_shape)
            if local.dtype != param.dtype:
                local = local.to(param.dtype)
            param.grad = DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)
