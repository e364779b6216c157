"""Adam/AdamW's lookahead step computed functionally, chunk by chunk, into the publish buffer.

The estimate round needs ``Opt_lookahead(θ, S, g)``: what the next commit would
produce, with ``θ`` and ``S`` left untouched. Stepping the optimizer on a
snapshot costs a copy of the master shard and of every state tensor (12 bytes
per shard element for Adam), held for the whole run. For Adam and AdamW the step
is an elementwise formula of ``θ``, ``m``, ``v``, ``g`` and the step count, so this
module evaluates it on chunks of :data:`CHUNK_ELEMS` elements into scratch that
is allocated once, and writes the result straight where the all-gather reads it.

Recognised optimizers (exact types; a subclass may change ``step`` and takes the
snapshot path):

* ``torch.optim.Adam`` and ``torch.optim.AdamW`` (single-tensor, ``foreach`` or
  ``fused``; not ``capturable`` or ``differentiable``), with ``amsgrad`` and
  ``maximize``. The arithmetic below is the single-tensor implementation's, op
  for op, so its result is bit-identical to stepping a snapshot with the default
  (single-tensor) path on CPU; ``foreach`` runs the same ops per tensor, and
  ``fused`` kernels may round differently (fp32 rounding).
* DeepSpeed's ``FusedAdam`` (``adam_w_mode``, ``bias_correction``) and
  ``DeepSpeedCPUAdam`` (``adamw_mode``; not ``amsgrad``): the same update rule,
  which their kernels evaluate in another order with fp32 scalars. Measured
  against DeepSpeed 0.19's CPU ``FusedAdam`` (steps 1-4, both weight-decay modes):
  equal to within 2.4e-5 of the largest update (about 10 fp32 ulps of parameters
  near 1). Only the estimate is affected: a commit is always the optimizer's own step.

Masters and state must be fp32 (DeepSpeed's ZeRO-1 partitions and ds_acco's own
masters are); anything else takes the snapshot path.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

CHUNK_ELEMS = 1 << 18
"""Elements per chunk: the scratch is at most 4 such fp32 buffers (4 MiB), whatever the model size."""


@dataclass(frozen=True)
class AdamHyper:
    """One parameter group's hyper-parameters, as the step would read them now."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    decoupled: bool
    amsgrad: bool = False
    maximize: bool = False
    bias_correction: bool = True


def _scalar(x) -> float:
    return float(x.item()) if torch.is_tensor(x) else float(x)


def local_flat(t: torch.Tensor) -> torch.Tensor:
    """The rank-local elements of a plain tensor or a DTensor, as a 1-D view."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.detach().reshape(-1)


def _deepspeed_class(name: str, module: str):
    mod = sys.modules.get(module)  # loaded iff such an optimizer can exist; never import DeepSpeed here
    return getattr(mod, name, None) if mod is not None else None


def _torch_hyper(optimizer: torch.optim.Optimizer, group: dict) -> Optional[AdamHyper]:
    if group.get("capturable") or group.get("differentiable"):
        return None
    return AdamHyper(
        lr=_scalar(group["lr"]), beta1=_scalar(group["betas"][0]), beta2=_scalar(group["betas"][1]),
        eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
        decoupled=bool(group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW))),
        amsgrad=bool(group["amsgrad"]), maximize=bool(group["maximize"]),
    )


def _deepspeed_hyper(optimizer: torch.optim.Optimizer, group: dict) -> Optional[AdamHyper]:
    if group.get("amsgrad"):
        return None  # DeepSpeed's kernels do not implement it
    return AdamHyper(
        lr=_scalar(group["lr"]), beta1=_scalar(group["betas"][0]), beta2=_scalar(group["betas"][1]),
        eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
        decoupled=bool(optimizer.adam_w_mode), bias_correction=bool(group.get("bias_correction", True)),
    )


def _hyper_reader(optimizer: torch.optim.Optimizer):
    kind = type(optimizer)
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        return _torch_hyper
    deepspeed_kinds = (_deepspeed_class("FusedAdam", "deepspeed.ops.adam.fused_adam"),
                       _deepspeed_class("DeepSpeedCPUAdam", "deepspeed.ops.adam.cpu_adam"))
    if any(kind is k for k in deepspeed_kinds if k is not None):
        return _deepspeed_hyper
    return None


def _step_count(optimizer: torch.optim.Optimizer, group: dict, state: dict) -> float:
    """Steps taken so far (the step about to be computed is this plus one)."""
    if "step" in state:
        return _scalar(state["step"])
    return _scalar(group.get("step", 0))  # DeepSpeed's FusedAdam seeds a new state from group["step"]


class FunctionalAdam:
    """Evaluates the next Adam/AdamW step of given master shards without touching them.

    Build it with :meth:`for_optimizer`, which returns None for optimizers without
    a known functional rule (the caller then snapshots and steps).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, hyper_reader):
        self.optimizer = optimizer
        self._hyper_reader = hyper_reader
        self._scratch: dict[str, torch.Tensor] = {}

    @classmethod
    def for_optimizer(cls, optimizer: torch.optim.Optimizer) -> Optional["FunctionalAdam"]:
        reader = _hyper_reader(optimizer)
        return cls(optimizer, reader) if reader is not None else None

    def supports(self, masters: Sequence[torch.Tensor]) -> bool:
        """True when every master (and its state) is fp32 and its group has a functional rule now."""
        for group in self.optimizer.param_groups:
            if self._hyper_reader(self.optimizer, group) is None:
                return False
        for p in masters:
            if local_flat(p).dtype != torch.float32:
                return False
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                value = self.optimizer.state.get(p, {}).get(key)
                if value is not None and local_flat(value).dtype != torch.float32:
                    return False
        return True

    def _group_of(self, p: torch.Tensor) -> dict:
        for group in self.optimizer.param_groups:
            if any(q is p for q in group["params"]):
                return group
        raise ValueError("a master shard is not in any parameter group of the optimizer")

    def _buf(self, name: str, n: int, device: torch.device) -> torch.Tensor:
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < n or buf.device != device:
            buf = self._scratch[name] = torch.empty(n, dtype=torch.float32, device=device)
        return buf[:n]

    def lookahead(self, masters: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                  outs: Sequence[torch.Tensor]) -> None:
        """Write the stepped value of each master into the first ``numel`` elements of its ``out``.

        Args:
            masters: the fp32 master shards (plain tensors or DTensors) the optimizer owns.
            grads: one 1-D fp32 gradient per master, at least as long as its local shard.
            outs: one 1-D tensor per master (any floating dtype), at least as long.
        """
        with torch.no_grad():
            for p, g, out in zip(masters, grads, outs):
                group = self._group_of(p)
                hyper = self._hyper_reader(self.optimizer, group)
                state = self.optimizer.state.get(p, {})
                step = _step_count(self.optimizer, group, state) + 1
                flat = local_flat(p)
                n = flat.numel()
                m, v, vmax = (local_flat(state[key]) if key in state else None  # absent before the first step
                              for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"))
                for start in range(0, n, CHUNK_ELEMS):
                    piece = slice(start, min(n, start + CHUNK_ELEMS))
                    self._chunk(hyper, step, flat[piece], g[piece], m if m is None else m[piece],
                                v if v is None else v[piece],
                                vmax[piece] if vmax is not None and hyper.amsgrad else None, out[piece])

    def _chunk(self, h: AdamHyper, step: float, p, g, m, v, vmax, out) -> None:
        """torch's ``_single_tensor_adam`` (non-capturable branch) on one chunk, into scratch."""
        k, dev = p.numel(), p.device
        direct = out.dtype == torch.float32 and out.is_contiguous()
        res = out if direct else self._buf("result", k, dev)
        grad = g
        if h.maximize:
            grad = torch.neg(g, out=self._buf("grad", k, dev))
        if h.weight_decay != 0 and h.decoupled:
            torch.mul(p, 1 - h.lr * h.weight_decay, out=res)  # param.mul_(1 - lr * weight_decay)
        else:
            res.copy_(p)
            if h.weight_decay != 0:
                grad = torch.add(grad, p, alpha=h.weight_decay, out=self._buf("grad", k, dev))
        m2 = self._buf("exp_avg", k, dev)
        if m is None:
            m2.zero_()
        else:
            m2.copy_(m)
        m2.lerp_(grad, 1 - h.beta1)
        v2 = self._buf("exp_avg_sq", k, dev)
        if v is None:
            v2.zero_()
        else:
            v2.copy_(v)
        v2.mul_(h.beta2).addcmul_(grad, grad, value=1 - h.beta2)
        if h.bias_correction:
            bias_correction1 = 1 - h.beta1 ** step
            bias_correction2 = 1 - h.beta2 ** step
        else:
            bias_correction1 = bias_correction2 = 1.0
        step_size = h.lr / bias_correction1
        if h.amsgrad and vmax is not None:
            torch.maximum(vmax, v2, out=v2)
        v2.sqrt_().div_(bias_correction2 ** 0.5).add_(h.eps)  # denom
        res.addcdiv_(m2, v2, value=-step_size)
        if not direct:
            out.copy_(res)
