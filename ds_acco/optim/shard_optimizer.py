"""The optimizer step on this rank's fp32 master shards: commit and lookahead.

Any ``torch.optim.Optimizer`` built over the master shards works. The commit is its ordinary ``step()`` followed by the
LR-scheduler steps it earns; for torch's Adam and AdamW stepping single-tensor or ``foreach`` it is the same arithmetic
done chunk by chunk (:meth:`ds_acco.optim.adam_lookahead.FunctionalAdam.step`), because torch's step holds two
shard-sized temporaries for its denominator (8 bytes per shard element) at the moment the round's buffers are all live.
The lookahead (``Opt_lookahead`` in docs/algorithms.md) leaves the shard and the optimizer state untouched: functional
for Adam and AdamW (:mod:`ds_acco.optim.adam_lookahead`); any other optimizer is stepped on the real tensors after a
snapshot into scratch that is allocated once, the result is copied out, and the snapshot is copied back in place, so
tensor identities (which DeepSpeed and user code may hold) never change.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Sequence

import torch

from .adam_lookahead import FunctionalAdam, local_flat


class _Snapshot:
    """Reusable scratch copy of master shards, optimizer state and group hyper-parameters."""

    def __init__(self) -> None:
        self._params: list[torch.Tensor] = []
        self._state: dict[tuple[int, str], torch.Tensor] = {}
        self._plain: dict[int, dict[str, Any]] = {}  # non-tensor state, by index of a master that had state
        self._groups: list[dict[str, Any]] = []

    def take(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        if len(self._params) != len(params):
            self._params = [torch.empty_like(p) for p in params]
        for scratch, p in zip(self._params, params):
            scratch.copy_(p.detach())
        self._plain = {}
        for i, p in enumerate(params):
            state = optimizer.state.get(p)
            if not state:
                continue
            plain = self._plain[i] = {}
            for key, value in state.items():
                if torch.is_tensor(value):
                    scratch = self._state.get((i, key))
                    if scratch is None or scratch.shape != value.shape or scratch.dtype != value.dtype:
                        scratch = self._state[(i, key)] = torch.empty_like(value)
                    scratch.copy_(value)
                else:
                    plain[key] = copy.deepcopy(value)
        self._groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]

    def restore(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for scratch, p in zip(self._params, params):
                p.copy_(scratch)
        for i, p in enumerate(params):
            if i not in self._plain:
                optimizer.state.pop(p, None)
                continue
            state = optimizer.state[p]
            for key in list(state):
                if torch.is_tensor(state[key]) and (i, key) in self._state:
                    state[key].copy_(self._state[(i, key)])
                elif key in self._plain[i]:
                    state[key] = self._plain[i][key]
                else:
                    del state[key]
        for group, saved in zip(optimizer.param_groups, self._groups):
            for key in [k for k in group if k != "params" and k not in saved]:
                del group[key]  # e.g. DeepSpeed's FusedAdam adds group["step"] on its first step
            group.update(saved)


class ShardOptimizer:
    """Steps ``masters`` (this rank's fp32 master shards, one per parameter group: ``optimizer``'s params) and
    advances ``lr_scheduler`` by commits, never by a lookahead; knows nothing of collectives or frameworks."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        masters: Sequence[torch.Tensor],
        lr_scheduler: Any = None,
    ):
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [i for i, m in enumerate(masters) if id(m) not in owned]
        if missing:
            raise ValueError(
                f"optimizer does not own master shard(s) {missing}: build it over the "
                "master shards (ShardedGroup.master), not over the model parameters"
            )
        self.optimizer = optimizer
        self.masters = list(masters)
        self.lr_scheduler = lr_scheduler
        self._snapshot = _Snapshot()
        self._functional = FunctionalAdam.for_optimizer(optimizer)

    def _set_grads(self, grads: Sequence[torch.Tensor]) -> None:
        for m, g in zip(self.masters, grads):
            m.grad = g

    def _clear_grads(self) -> None:
        for m in self.masters:
            m.grad = None

    def commit(self, grads: Sequence[torch.Tensor], scheduler_steps: int = 1,
               scratch: Optional[Sequence[Optional[torch.Tensor]]] = None) -> None:
        """``θ, S ← Opt(θ, S, g)``, then ``scheduler_steps`` scheduler steps (see :mod:`ds_acco.optim.lr_schedule`).
        ``scratch``: per master, an fp32 buffer at least as long as it that the caller does not need now (or
        None), in which the functional step runs over the whole shard at once instead of chunk by chunk."""
        if self._functional is not None and self._functional.steps_in_place(self.masters):
            # chunk-sized temporaries, or none in the caller's scratch
            self._functional.step(self.masters, self._master_grads(grads), self._master_scratch(scratch))
        else:
            self._set_grads(grads)
            self.optimizer.step()
            self._clear_grads()
        if self.lr_scheduler is not None:
            for _ in range(scheduler_steps):
                self.lr_scheduler.step()

    @property
    def lookahead_is_functional(self) -> bool:
        """True when the next lookahead needs no snapshot (Adam/AdamW over fp32 shards)."""
        return self._functional is not None and self._functional.supports(self.masters)

    def lookahead(self, grads: Sequence[torch.Tensor], outs: Sequence[torch.Tensor],
                  scratch: Optional[Sequence[Optional[torch.Tensor]]] = None) -> None:
        """Write ``Opt_lookahead(θ, S, g)`` of each master into the first ``numel`` elements of its ``out``
        (``scratch``: as for :meth:`commit`).

        ``θ``, ``S``, the parameter groups and the scheduler are left as they were.
        """
        if self.lookahead_is_functional:
            self._functional.lookahead(self.masters, self._master_grads(grads), self._master_outs(outs),
                                       self._master_scratch(scratch))
            return
        self._snapshot.take(self.optimizer, self.masters)
        try:
            self._set_grads(grads)
            self.optimizer.step()
            self._clear_grads()
            with torch.no_grad():
                self._write_masters(outs)
        finally:
            self._snapshot.restore(self.optimizer, self.masters)

    def _master_scratch(self, scratch) -> Optional[list]:
        """Each master's scratch (None where a buffer is missing or too short), or None: only where the round's
        buffers map one to one onto the masters (adapters that split a buffer over several masters get none)."""
        if scratch is None or len(scratch) != len(self.masters) or \
                type(self)._master_grads is not ShardOptimizer._master_grads:
            return None
        return [s if s is not None and s.numel() >= m.numel() else None for s, m in zip(scratch, self.masters)]

    def _master_grads(self, grads: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Each master's 1-D gradient, in :attr:`masters` order (adapters whose rounds hand one buffer
        for several masters override this and :meth:`_master_outs`)."""
        return grads

    def _master_outs(self, outs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Each master's 1-D output (publish) buffer, in :attr:`masters` order."""
        return outs

    def _write_masters(self, outs: Sequence[torch.Tensor]) -> None:
        """Copy each master into the first ``numel`` elements of its ``out`` (adapters with another
        master-to-buffer mapping override this)."""
        for m, out in zip(self.masters, outs):
            flat = local_flat(m)
            out[: flat.numel()].copy_(flat)

    def skip(self) -> None:
        """A commit skipped for non-finite gradients: no step, no scheduler step."""
        self._clear_grads()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])
