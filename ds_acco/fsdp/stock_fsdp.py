"""``StockFSDP``: ``"enabled": false`` gives stock FSDP2 gradient accumulation behind ``AccoFSDP``'s calls.

Why behind the same calls: switching ACCO off must not change the training script, and the
FSDP2 benchmarks compare the two with everything else equal. Checkpoints move both ways.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ds_acco.checkpoint import signing
from ds_acco.errors import AccoConfigError

from . import checkpoint
from ._fsdp2 import FSDP2Model


class StockFSDP:
    """Backward reduce-scatters only on the ``G``-th micro-batch (``set_requires_gradient_sync``)
    and keeps the parameters unsharded between the micro-batches of a step
    (``set_reshard_after_backward``, FSDP2's recipe for gradient accumulation: no
    all-gather per micro-batch); FSDP2 sums and divides by ``world * G * grad_scale``
    (so the update uses the mean gradient, as ACCO's does), then clipping, the
    optimizer and the scheduler step.
    """

    telemetry = None

    def __init__(self, module: nn.Module, fsdp: FSDP2Model, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 gradient_accumulation_steps: int, clip_grad_norm: Optional[float],
                 grad_scale: Union[float, Callable[[], float]]):
        self.module, self.fsdp, self.optimizer, self.lr_scheduler = module, fsdp, optimizer, lr_scheduler
        self.signing_key = signing.load_key(None)  # $DS_ACCO_CHECKPOINT_KEY_FILE: stock jobs sign and check too
        self.G, self.clip, self._grad_scale = gradient_accumulation_steps, float(clip_grad_norm or 0.0), grad_scale
        self.commits = self.micro_batches = self._n = 0
        self._params = [p.sharded for p in fsdp.params if p.sharded.requires_grad]
        for m in fsdp.modules:
            m.set_force_sum_reduction_for_comms(True)
        self._sync(self.G == 1)

    def _sync(self, on: bool) -> None:
        if on:
            scale = float(self._grad_scale() if callable(self._grad_scale) else self._grad_scale)
            for m in self.fsdp.modules:
                m.set_gradient_divide_factor(float(len(self.fsdp.ranks) * self.G) * scale)
        self.module.set_requires_gradient_sync(on)
        self.module.set_reshard_after_backward(on)

    def after_micro_batch(self) -> bool:
        self._n += 1
        self.micro_batches += 1
        if self._n < self.G:
            if self._n == self.G - 1:
                self._sync(True)
            return False
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self._params, self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.commits += 1
        self._n = 0
        self._sync(self.G == 1)
        return True

    def finish(self) -> None:
        """Nothing runs in the background; accumulated gradients of an unfinished step stay."""

    def close(self, drain: bool = True) -> None:
        self.module.set_requires_gradient_sync(True)
        self.module.set_reshard_after_backward(True)

    def save_checkpoint(self, checkpoint_id: Any, extra: Optional[dict] = None) -> bool:
        """Same entries as :meth:`AccoFSDP.save_checkpoint`, without round state; at a step boundary (a
        failed write raises on every rank)."""
        return checkpoint.save(self, checkpoint_id, extra)

    def load_checkpoint(self, checkpoint_id: Any) -> Optional[dict]:
        """Load a checkpoint of either class (resharded by DCP when the world size differs)."""
        return checkpoint.load(self, checkpoint_id)

    def _check_checkpointable(self) -> None:
        if self._n:
            raise AccoConfigError(
                f"checkpoint: {self._n} micro-batches of an unfinished step are accumulated; stock FSDP2 "
                "checkpoints are taken right after an optimizer step"
            )

    def _restart(self, commits: int, micro_batches: int) -> None:
        self.commits, self.micro_batches, self._n = commits, micro_batches, 0
        self._sync(self.G == 1)
