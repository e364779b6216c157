"""Where a round's parameter all-gather lands, and how the swap makes it the compute parameters.

[Note: no staging buffer]
A round reduce-scatters its gradient accumulator first and all-gathers the new parameters last; in between, the
accumulator holds nothing anyone needs. So the all-gather lands in it, and acco holds the compute parameters plus two
gradient buffers, like the ACCO paper, instead of a fourth model-sized staging buffer:

* accumulation dtype = compute dtype (``rotate``): at the swap the round's accumulator *becomes* the compute parameters
  (a re-bind, no copy) and the buffer the model read until then takes its place among the accumulators, zeroed on the
  training thread (one memset of the parameters per swap, which the training thread must do before the next backward
  writes into it);
* accumulation dtype wider than the compute dtype, e.g. fp32 accumulators for bf16 parameters (``copy``): the all-gather
  lands in the accumulator's bytes viewed in the compute dtype; the swap copies it into the compute parameters and
  zeroes the accumulator (both on the training thread);
* narrower (``staging``): a separate staging buffer, swapped in by pointer, and the round zeroes its accumulator right
  after the reduce-scatter.

Each round publishes this rank's new shard straight into its own slice of the landing buffer (an in-place all-gather),
so no publish shard is held either. The buffer a round writes is never the one the model reads while the round is in
flight, so the int8-delta all-gather can still take its base from the compute parameters of the launch.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ds_acco.layout.grad_buffers import GradBuffers
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.numerics.views import ViewCache

ROTATE, COPY, STAGING = "rotate", "copy", "staging"


class Landing:
    """Per group: where the all-gather lands (:meth:`targets`) and the swap (:meth:`install`). ``grads`` holds
    two accumulators per group; a round's are the inactive pair between its launch and its swap."""

    def __init__(self, groups: Sequence[ShardedGroup], grads: GradBuffers):
        self.groups, self.grads = list(groups), grads
        self.modes = []
        for g, accum in zip(self.groups, grads.dtypes):
            compute = g.flat.dtype
            if accum == compute:
                self.modes.append(ROTATE)
            elif torch.empty(0, dtype=accum).element_size() > torch.empty(0, dtype=compute).element_size():
                self.modes.append(COPY)
            else:
                self.modes.append(STAGING)
        self.staging = [g.layout.new_buffer(g.flat) if m == STAGING else None for g, m in zip(self.groups, self.modes)]
        # the accumulator's bytes in the compute dtype, cut once per accumulator (the same view object every round)
        self._copy_views = [ViewCache(lambda t, g=g: t.view(g.flat.dtype)[: g.layout.padded_numel], size=4)
                            for g in self.groups]

    def round_zeroes(self, i: int) -> bool:
        """Whether a round must zero group ``i``'s accumulator after its reduce-scatter (else the swap does)."""
        return self.modes[i] == STAGING

    def targets(self, taken: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The all-gather destinations of the round that holds accumulators ``taken``, one per group."""
        out = []
        for mode, buf, staging, copy_view in zip(self.modes, taken, self.staging, self._copy_views):
            if mode == ROTATE:
                out.append(buf)
            elif mode == COPY:
                out.append(copy_view(buf))
            else:
                out.append(staging)
        return out

    def in_flight_targets(self) -> list[torch.Tensor]:
        """Where the round in flight (or a pending one restored from a checkpoint) lands."""
        return self.targets(self.grads.inactive_buffers())

    def install(self) -> None:
        """The swap, on the training thread: the round's parameters become the compute parameters
        and the round's accumulators are zeroed (or replaced by the old, zeroed, compute buffer)."""
        taken = self.grads.inactive_buffers()
        for i, (g, mode, landed) in enumerate(zip(self.groups, self.modes, self.targets(taken))):
            if mode == ROTATE:
                old = g.flat
                g.bind(landed)
                old.zero_()
                self.grads.replace(i, old)
            elif mode == COPY:
                g.flat.copy_(landed)
                taken[i].zero_()
            else:
                old = g.flat
                g.bind(landed)
                self.staging[i] = old

    def zero_in_flight(self) -> None:
        """Forget a round in flight: its accumulators go back to the training thread clean."""
        for i, buf in enumerate(self.grads.inactive_buffers()):
            if self.modes[i] != STAGING:
                buf.zero_()
