"""Two gradient accumulators per parameter group, one filled, one in a round.

Backward writes micro-batch gradients into the *active* accumulator while the round in flight reads the other one. At
each launch the engine hands the active one to the round and activates the other, which the previous round zeroed after
its reduce-scatter, so the training thread never copies or clears a model-sized buffer.

When the accumulation dtype equals the parameter dtype, ``p.grad`` is a view of the active accumulator and autograd
accumulates in place (DDP's ``gradient_as_bucket_view`` trick). Otherwise (e.g. bf16 parameters accumulating in fp32) a
post-accumulate-grad hook adds ``p.grad`` into the accumulator and drops it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .sharded_group import ShardedGroup


class GradBuffers:
    """Double-buffered flat gradient accumulators for a list of :class:`ShardedGroup`."""

    def __init__(self, groups: Sequence[ShardedGroup], dtype: torch.dtype | None = None):
        self.groups = list(groups)
        self.dtypes = [dtype or g.flat.dtype for g in self.groups]
        self.buffers = [[g.layout.new_buffer(g.flat, dt) for g, dt in zip(self.groups, self.dtypes)] for _ in range(2)]
        self.active = 0
        self._views = [[g.layout.swap_views(buf) for g, buf in zip(self.groups, bufs)] for bufs in self.buffers]
        self._use_hooks = any(dt != g.flat.dtype for g, dt in zip(self.groups, self.dtypes))
        self._hooks = []
        if self._use_hooks:
            for gi, g in enumerate(self.groups):
                for pi, p in enumerate(g.params):
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(gi, pi)))
        self.bind()

    def _make_hook(self, gi: int, pi: int):
        def hook(p: torch.Tensor) -> None:
            self._views[self.active][gi][pi].add_(p.grad)
            p.grad = None

        return hook

    def bind(self) -> None:
        """Make ``p.grad`` of every parameter the view of the active accumulator (None with hooks)."""
        for g, views in zip(self.groups, self._views[self.active]):
            for p, v in zip(g.params, views):
                p.grad = None if self._use_hooks else v

    def repair(self) -> None:
        """Fold gradients that escaped the accumulator back into it.

        User code may call ``model.zero_grad()`` (which sets ``p.grad = None``) or an optimizer may replace ``p.grad``;
        then autograd allocated a fresh tensor. This adds it into the accumulator and re-binds, so nothing is lost.
        """
        if self._use_hooks:
            return
        for g, views in zip(self.groups, self._views[self.active]):
            for p, v in zip(g.params, views):
                grad = p.grad
                if grad is None or grad.data_ptr() != v.data_ptr():
                    if grad is not None:
                        v.add_(grad)
                    p.grad = v

    def take(self) -> list[torch.Tensor]:
        """Hand the active accumulators to a round and activate the other (already zeroed) ones."""
        taken = self.buffers[self.active]
        self.active ^= 1
        self.bind()
        return taken

    def replace(self, group: int, buffer: torch.Tensor) -> None:
        """Put ``buffer`` (zeroed, same size and dtype) in place of ``group``'s inactive accumulator, the one a round
        holds (a swap rotates buffer roles: :mod:`ds_acco.rounds.landing`); ``p.grad`` bindings stay valid."""
        slot = self.active ^ 1
        old = self.buffers[slot][group]
        if buffer.numel() != old.numel() or buffer.dtype != old.dtype or buffer.device != old.device:
            raise ValueError(f"replacement accumulator {buffer.dtype}[{buffer.numel()}] does not match "
                             f"{old.dtype}[{old.numel()}]")
        self.buffers[slot][group] = buffer
        self._views[slot][group] = self.groups[group].layout.swap_views(buffer)

    def active_buffers(self) -> list[torch.Tensor]:
        return self.buffers[self.active]

    def inactive_buffers(self) -> list[torch.Tensor]:  # the ones a round holds between its launch and its swap
        return self.buffers[self.active ^ 1]

    def clear(self) -> None:
        """Zero the accumulators being filled (micro-batches dropped, or committed by other means)."""
        for buf in self.active_buffers():
            buf.zero_()

    def state_dict(self, held: bool) -> dict:
        """The accumulators being filled, where they hold micro-batches (``held``; else None: zeros on load)."""
        return {"active_grads": [b.clone() for b in self.active_buffers()] if held else None}

    def load_state_dict(self, saved: dict) -> None:
        self.clear()
        for buf, kept in zip(self.active_buffers(), saved["active_grads"] or []):
            buf.copy_(kept)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
