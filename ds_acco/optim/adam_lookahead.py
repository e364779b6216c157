"""Adam/AdamW's lookahead step computed functionally, chunk by chunk, into the publish buffer.

The estimate round needs ``Opt_lookahead(θ, S, g)``: what the next commit would produce, with ``θ`` and ``S`` left
untouched. Stepping the optimizer on a snapshot costs a copy of the master shard and of every state tensor (12 bytes per
shard element for Adam), held for the whole run. For Adam and AdamW the step is an elementwise formula of ``θ``, ``m``,
``v``, ``g`` and the step count, so this module evaluates it on chunks of :func:`chunk_elems` elements into scratch that
is allocated once, and writes the result straight where the all-gather reads it.

Recognised optimizers (exact types; a subclass may change ``step`` and takes the snapshot path):

* ``torch.optim.Adam`` and ``torch.optim.AdamW`` (single-tensor, ``foreach`` or ``fused``; not ``capturable`` or
  ``differentiable``), with ``amsgrad`` and ``maximize``. The arithmetic below is the single-tensor implementation's, op
  for op, so its result is bit-identical to stepping a snapshot with the default (single-tensor) path on CPU;
  ``foreach`` runs the same ops per tensor; ``fused`` rounds differently, and its lookahead is its own kernel.
* DeepSpeed's ``FusedAdam`` (``adam_w_mode``, ``bias_correction``) and ``DeepSpeedCPUAdam`` (``adamw_mode``; not
  ``amsgrad``). On CPU both run the same kernel (``ds_adam_step`` in DeepSpeed's ``csrc/adam/cpu_adam_impl.cpp``), and
  :meth:`FunctionalAdam._chunk_deepspeed` evaluates its formula with its fp32 scalars and its fused multiply-adds
  (torch's formula with fp64 scalars was 1e-5 of the update away). Against DeepSpeed 0.19.8's CPU ``FusedAdam``:
  bit-identical except in the last ``numel % lanes`` elements of a tensor, which the kernel steps in scalar C++ (about
  two fp32 ulps), and in a resumed run, where the kernel's ``beta ** step`` starts from ``pow`` (see
  :func:`~ds_acco.optim.deepspeed_scalars.running_power`); tests/test_shard_optimizer.py checks this. Only the
  estimate is affected: a commit is always the optimizer's own step. (FusedAdam's GPU kernel is another formula's:
  its lookahead there is torch's fused kernel.)

On an accelerator both the lookahead and the commit run torch's fused Adam kernel instead
(:mod:`ds_acco.optim.fused_adam`: a few operations a shard, not eight a chunk), as does the lookahead of an optimizer
built with ``fused=True`` anywhere.

Masters and state must be fp32 (DeepSpeed's ZeRO-1 partitions and ds_acco's own masters are); anything else takes the
snapshot path.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ds_acco.numerics.views import ViewCache

from . import fused_adam
from .deepspeed_scalars import deepspeed_scalars

CHUNK_ELEMS = 1 << 18
"""Elements per chunk on a CPU: the scratch is at most 4 such fp32 buffers (4 MiB), whatever the model size."""
CUDA_CHUNK_ELEMS = 1 << 22
"""Elements per chunk on a GPU or another accelerator (at most 64 MiB of scratch). The round's thread launches
about ten kernels per chunk, each holding the Python interpreter for microseconds the training thread needs: on an
H200, 256 Ki-element chunks slowed compute with a round in flight up to 1.24x (BENCHMARKS.md, "On a GPU")."""
SQRT_PIECE = 1 << 14
"""Elements per fp64 square root of DeepSpeed's rule (128 KiB of scratch): fp64's, rounded once, is fp32's
correctly rounded root, which the kernel's ``sqrt`` is."""
WHOLE_OPS = 10
"""The operations of :meth:`FunctionalAdam._whole`: on an accelerator a lookahead that has its scratch takes
it unless the fused kernel's chunks (:data:`ds_acco.optim.fused_adam.LAUNCHES_PER_CHUNK`) take fewer."""
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
"""The state tensors of torch's Adam (DeepSpeed's lack the last)."""


def chunk_elems(device: torch.device) -> int:
    """Elements per chunk for tensors on ``device``: on an accelerator (any device but the CPU) launches,
    not scratch memory, are what is scarce."""
    return CHUNK_ELEMS if device.type == "cpu" else CUDA_CHUNK_ELEMS


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
    deepspeed: bool = False
    """DeepSpeed's CPU kernel's arithmetic (:meth:`FunctionalAdam._chunk_deepspeed`), not torch's."""
    running_power: bool = True
    """DeepSpeed: the kernel multiplies ``beta ** step`` up step by step (every group has the same
    betas), rather than recomputing it with ``pow`` at every call (the betas differ between groups)."""


def _scalar(x) -> float:
    return float(x.item()) if torch.is_tensor(x) else float(x)


def local_flat(t: torch.Tensor) -> torch.Tensor:
    """The rank-local elements of a plain tensor or a DTensor, as a 1-D view."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.detach().reshape(-1)


def _head(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if t.numel() == n else t[:n]


def _whole_rule(h: AdamHyper) -> bool:
    """Whether :meth:`FunctionalAdam._whole` computes this rule: torch's, with decoupled or no weight decay,
    without amsgrad or maximize (those need more scratch than one buffer)."""
    return not (h.deepspeed or h.amsgrad or h.maximize) and (h.weight_decay == 0 or h.decoupled)


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
        deepspeed=True, running_power=len({tuple(map(_scalar, g["betas"])) for g in optimizer.param_groups}) == 1,
    )


def _hyper_reader(optimizer: torch.optim.Optimizer):
    kind = type(optimizer)
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        return _torch_hyper
    # a module is loaded iff such an optimizer can exist; never import DeepSpeed here
    if kind in (getattr(sys.modules.get("deepspeed.ops.adam.fused_adam"), "FusedAdam", None),
                getattr(sys.modules.get("deepspeed.ops.adam.cpu_adam"), "DeepSpeedCPUAdam", None)):
        return _deepspeed_hyper
    return None


class FunctionalAdam:
    """Evaluates the next Adam/AdamW step of given master shards without touching them.

    Build it with :meth:`for_optimizer`, which returns None for optimizers without
    a known functional rule (the caller then snapshots and steps).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, hyper_reader):
        self.optimizer = optimizer
        self._hyper_reader = hyper_reader
        self._scratch: dict[str, torch.Tensor] = {}
        self._flats = ViewCache(lambda t: t.reshape(-1), size=32)
        """Masters and moments as 1-D views, cut once per tensor."""
        self._chunk_views: dict[tuple, ViewCache] = {}
        self.fused: Optional[bool] = None
        """Whether torch's fused kernel steps (:mod:`ds_acco.optim.fused_adam`): None, on an accelerator or for
        an optimizer built with ``fused=True``; tests set True to run it on a CPU."""
        self.accelerator: Optional[bool] = None
        """Whether to choose as on an accelerator (its chunk size, the kernel, the fewer operations of the kernel
        and the whole-shard rule): None, where the tensors are; True counts an accelerator's operations on a
        CPU (benchmarks/round_launches.py)."""

    @classmethod
    def for_optimizer(cls, optimizer: torch.optim.Optimizer) -> Optional["FunctionalAdam"]:
        reader = _hyper_reader(optimizer)
        return cls(optimizer, reader) if reader is not None else None

    def supports(self, masters: Sequence[torch.Tensor]) -> bool:
        """True when every master (and its state) is fp32 and its group has a functional rule now."""
        opt = self.optimizer
        if any(self._hyper_reader(opt, group) is None for group in opt.param_groups):
            return False
        state = [opt.state.get(p, {}).get(key) for p in masters for key in _MOMENTS]
        # a DTensor's dtype is its local tensor's
        return all(t.dtype == torch.float32 for t in [*masters, *state] if t is not None)

    def _group_of(self, p: torch.Tensor) -> dict:
        for group in self.optimizer.param_groups:
            if any(q is p for q in group["params"]):
                return group
        raise ValueError("a master shard is not in any parameter group of the optimizer")

    def _buf(self, name: str, n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < n or buf.device != device:
            buf = self._scratch[name] = torch.empty(n, dtype=dtype, device=device)
        return buf if buf.numel() == n else buf[:n]

    def lookahead(self, masters: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                  outs: Sequence[torch.Tensor], scratch: Optional[Sequence[Optional[torch.Tensor]]] = None) -> None:
        """Write the stepped value of each master (plain tensor or DTensor) into the first ``numel`` elements
        of its ``out`` (1-D, any floating dtype); ``grads``: one 1-D fp32 gradient per master. Both are at
        least as long as the master's local shard. ``scratch``: per master, an fp32 buffer at least as long
        (or None): with one, torch's rule runs over the whole shard at once (:meth:`_whole`)."""
        with torch.no_grad():
            for i, (p, g, out) in enumerate(zip(masters, grads, outs)):
                group = self._group_of(p)
                hyper = self._hyper_reader(self.optimizer, group)
                state = self.optimizer.state.get(p, {})
                # the step about to be taken; DeepSpeed's FusedAdam seeds a new state from group["step"]
                step = _scalar(state["step"] if "step" in state else group.get("step", 0)) + 1
                flat, m, v, vmax = (self._flat(t) if t is not None else None for t in
                                    (p, *(state.get(key) for key in _MOMENTS)))  # moments: absent before a step
                n = flat.numel()
                whole = scratch[i] if scratch is not None else None
                o = out if out.numel() == n else out[:n]
                whole_ok = whole is not None and _whole_rule(hyper) and o.dtype == torch.float32 and o.is_contiguous()
                if self._kernel_looks_ahead(hyper, group, flat.device, n, whole_ok):
                    self._kernel_lookahead(hyper, step, flat, g, m, v, vmax, o)
                    continue
                if whole_ok:
                    self._whole(hyper, step, flat, _head(g, n), m, v, _head(whole, n), o)
                    continue
                chunk = self._chunk_deepspeed if hyper.deepspeed else self._chunk
                size = self._chunk_elems(flat.device)
                ps, gs, ms, vs, xs, os = (self._pieces(t, n, size) for t in
                                          (flat, g, m, v, vmax if hyper.amsgrad else None, out))
                for pc, gc, mc, vc, xc, o in zip(ps, gs, ms, vs, xs, os):
                    # the chunk steps into fp32 contiguous memory: o itself, or scratch
                    direct = o.dtype == torch.float32 and o.is_contiguous()
                    res = o if direct else self._buf("result", o.numel(), o.device)
                    chunk(hyper, step, pc, gc, mc, vc, xc, res)
                    if not direct:
                        o.copy_(res)

    def _uses_kernel(self, h: AdamHyper, group: dict, device: torch.device) -> bool:
        """Whether torch's fused kernel steps this group's shards (see :attr:`fused`)."""
        if not (fused_adam.usable(h) and fused_adam.kernel_exists(device)):
            return False
        return self.fused if self.fused is not None else self._on_accelerator(device) or bool(group.get("fused"))

    def _kernel_looks_ahead(self, h: AdamHyper, group: dict, device: torch.device, n: int, whole_ok: bool) -> bool:
        """The kernel, but on an accelerator where the whole-shard rule can run in fewer operations."""
        return self._uses_kernel(h, group, device) and not (
            whole_ok and self._on_accelerator(device) and self._kernel_ops(n, device) > WHOLE_OPS)

    def _on_accelerator(self, device: torch.device) -> bool:
        return self.accelerator if self.accelerator is not None else device.type != "cpu"

    def _chunk_elems(self, device: torch.device) -> int:
        return chunk_elems(device) if self.accelerator is None else \
            (CUDA_CHUNK_ELEMS if self.accelerator else CHUNK_ELEMS)

    def _kernel_ops(self, n: int, device: torch.device) -> int:
        return 2 + fused_adam.LAUNCHES_PER_CHUNK * -(-n // self._chunk_elems(device))

    def _kernel_lookahead(self, h: AdamHyper, step: float, flat, g, m, v, vmax, o) -> None:
        n, size, dev = flat.numel(), self._chunk_elems(flat.device), flat.device
        if o.dtype == torch.float32 and o.is_contiguous():
            o.copy_(flat)  # the kernel steps the publish buffer in place
        chunks = zip(*(self._pieces(t, n, size) for t in (flat, g, m, v, vmax if h.amsgrad else None, o)))
        fused_adam.lookahead(h, step, list(chunks), lambda name, k: self._buf(name, k, dev))

    def _pieces(self, t: Optional[torch.Tensor], n: int, size: int) -> list:
        """The chunks of ``size`` elements of ``t``'s first ``n``, cut once per tensor (None: Nones)."""
        if t is None:
            return [None] * -(-n // size)
        cache = self._chunk_views.get((n, size))
        if cache is None:
            cache = self._chunk_views[(n, size)] = ViewCache(
                lambda x: [x[a:min(n, a + size)] for a in range(0, n, size)], size=64)
        return cache(t)

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        """:func:`local_flat`, cut once per plain tensor (a DTensor's local tensor is read every time)."""
        return local_flat(t) if hasattr(t, "to_local") else self._flats(t)

    def _whole(self, h: AdamHyper, step: float, p, g, m, v, scratch, res) -> None:
        """torch's rule over a whole shard into ``res`` (fp32, contiguous) in ten operations, with one scratch
        buffer: :meth:`_chunk`'s arithmetic, op for op, but for its last ``addcdiv``, which is
        ``res + (value * m) / denom`` and is computed as those two steps (the same roundings)."""
        if m is None:  # before the first step: zeros, as _chunk starts from
            scratch.zero_().lerp_(g, 1 - h.beta1)
        else:
            torch.lerp(m, g, 1 - h.beta1, out=scratch)
        if v is None:
            res.zero_().mul_(h.beta2)
        else:
            torch.mul(v, h.beta2, out=res)
        res.addcmul_(g, g, value=1 - h.beta2)
        bias_correction1, bias_correction2 = (1 - h.beta1 ** step, 1 - h.beta2 ** step) if h.bias_correction \
            else (1.0, 1.0)
        res.sqrt_().div_(bias_correction2 ** 0.5).add_(h.eps)  # the denominator
        scratch.mul_(-h.lr / bias_correction1).div_(res)
        if h.weight_decay != 0:
            torch.mul(p, 1 - h.lr * h.weight_decay, out=res)
        else:
            res.copy_(p)
        res.add_(scratch)

    def _chunk(self, h: AdamHyper, step: float, p, g, m, v, vmax, res) -> None:
        """The next step of one chunk into ``res`` (fp32, contiguous), on scratch for ``m`` and ``v``."""
        k, dev = p.numel(), p.device
        m2, v2 = self._buf("exp_avg", k, dev), self._buf("exp_avg_sq", k, dev)
        # amsgrad: the maximum goes into v2 (the stored maximum is left as it is)
        self._torch_update(h, step, res, g, m2, v2, vmax, vmax_out=v2, denom=v2, sources=(p, m, v))

    def _torch_update(self, h: AdamHyper, step: float, p, g, m, v, vmax, *, vmax_out, denom,
                      sources: Optional[tuple] = None) -> None:
        """torch's ``_single_tensor_adam`` (non-capturable branch), op for op, in place on ``p``, ``m``, ``v``;
        with ``sources`` (``p``, ``m``, ``v`` to read, a moment None before the first step) into ``p``, ``m``,
        ``v`` from them, each first operation writing its result out of place (no copy first)."""
        k, dev = p.numel(), p.device
        p_src, m_src, v_src = (p, m, v) if sources is None else sources
        grad = g
        if h.maximize:
            grad = torch.neg(g, out=self._buf("grad", k, dev))
        if h.weight_decay != 0 and not h.decoupled:
            grad = torch.add(grad, p_src, alpha=h.weight_decay, out=self._buf("grad", k, dev))
        if h.weight_decay != 0 and h.decoupled:
            torch.mul(p_src, 1 - h.lr * h.weight_decay, out=p)
        elif p_src is not p:
            p.copy_(p_src)
        if m_src is None:
            m.zero_()
        torch.lerp(m if m_src is None else m_src, grad, 1 - h.beta1, out=m)
        if v_src is None:
            v.zero_()
        torch.mul(v if v_src is None else v_src, h.beta2, out=v).addcmul_(grad, grad, value=1 - h.beta2)
        if h.bias_correction:
            bias_correction1 = 1 - h.beta1 ** step
            bias_correction2 = 1 - h.beta2 ** step
        else:
            bias_correction1 = bias_correction2 = 1.0
        step_size = h.lr / bias_correction1
        src = v
        if h.amsgrad and vmax is not None:
            src = torch.maximum(vmax, v, out=vmax_out)
        torch.sqrt(src, out=denom).div_(bias_correction2 ** 0.5).add_(h.eps)
        p.addcdiv_(m, denom, value=-step_size)

    def steps_in_place(self, masters: Sequence[torch.Tensor]) -> bool:
        """Whether :meth:`step` may replace ``optimizer.step()`` bit for bit: torch's Adam/AdamW
        stepping single-tensor or ``foreach`` (not ``fused``), with no step hooks."""
        opt = self.optimizer
        from torch.optim import optimizer as torch_optimizer

        hooks = (opt._optimizer_step_pre_hooks, opt._optimizer_step_post_hooks,
                 getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
                 getattr(torch_optimizer, "_global_optimizer_post_hooks", None))
        return (self._hyper_reader is _torch_hyper and self.supports(masters)
                and not any(g.get("fused") for g in opt.param_groups) and not any(hooks))

    def step(self, masters: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
             scratch: Optional[Sequence[Optional[torch.Tensor]]] = None) -> None:
        """The optimizer's step on ``masters``, chunk by chunk: the same arithmetic as torch's
        single-tensor step (and so its state), with chunk-sized temporaries instead of two
        shard-sized ones (``sqrt`` and the division of the denominator); with a ``scratch`` buffer per master
        (see :meth:`lookahead`), over the whole shard at once, the denominator in it."""
        from torch.optim.optimizer import _get_scalar_dtype

        with torch.no_grad():
            for i, (p, g) in enumerate(zip(masters, grads)):
                group = self._group_of(p)
                hyper = self._hyper_reader(self.optimizer, group)
                state = self.optimizer.state[p]
                if not state:  # Adam._init_group, non-capturable, not fused
                    state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
                    for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ()):
                        state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = _scalar(state["step"])
                flat, m, v = self._flat(p), self._flat(state["exp_avg"]), self._flat(state["exp_avg_sq"])
                vmax = self._flat(state["max_exp_avg_sq"]) if hyper.amsgrad else None
                n = flat.numel()
                if self._uses_kernel(hyper, group, flat.device):  # in place, no temporaries
                    fused_adam.step_in_place(hyper, step, [flat], [_head(g, n)], [m], [v],
                                             [vmax] if hyper.amsgrad else [])
                    continue
                whole = scratch[i] if scratch is not None else None
                if whole is not None and not hyper.maximize and (hyper.weight_decay == 0 or hyper.decoupled):
                    # the whole shard at once; the denominator in the caller's scratch (no grad copy needed)
                    self._torch_update(hyper, step, flat, _head(g, n), m, v, vmax, vmax_out=vmax,
                                       denom=_head(whole, n))
                    continue
                size = self._chunk_elems(flat.device)
                for pc, gc, mc, vc, xc in zip(*(self._pieces(t, n, size) for t in (flat, g, m, v, vmax))):
                    self._torch_update(hyper, step, pc, gc, mc, vc, xc, vmax_out=xc,
                                       denom=self._buf("exp_avg_sq", pc.numel(), p.device))  # the lookahead's
                    # scratch: never in use at once
        self.optimizer._opt_called = True  # what the LR scheduler's wrapper of optimizer.step() records

    def _chunk_deepspeed(self, h: AdamHyper, step: float, p, g, m, v, vmax, res) -> None:
        """DeepSpeed's CPU Adam kernel (``Adam_Optimizer::Step_AVX``) on one chunk, op for op.

        Scalars are the kernel's fp32 values; each ``add(x, alpha=a)`` is the kernel's
        ``fma(x, a, ...)``. ``vmax`` is unused (DeepSpeed has no amsgrad).
        """
        k, dev = p.numel(), p.device
        s = deepspeed_scalars(h, int(step))
        grad = g
        if h.weight_decay > 0 and not h.decoupled:  # grad = fma(param, weight_decay, grad)
            grad = torch.add(g, p, alpha=s.weight_decay, out=self._buf("grad", k, dev))
        m2, v2 = self._buf("exp_avg", k, dev), self._buf("exp_avg_sq", k, dev)
        m2.zero_() if m is None else torch.mul(m, s.beta1, out=m2)
        m2.add_(grad, alpha=s.one_minus_beta1)  # fma(grad, 1 - beta1, momentum * beta1)
        v2.zero_() if v is None else torch.mul(v, s.beta2, out=v2)
        square = torch.mul(grad, grad, out=res)  # res is free until the parameter is written
        v2.add_(square, alpha=s.one_minus_beta2)  # fma(grad * grad, 1 - beta2, variance * beta2)
        for start in range(0, k, SQRT_PIECE):  # the kernel's sqrt: ATen's fp32 sqrt is not correctly rounded
            piece = v2[start:start + SQRT_PIECE]
            piece.copy_(self._buf("sqrt", piece.numel(), dev, torch.float64).copy_(piece).sqrt_())
        eps = torch.tensor(s.eps, dtype=torch.float32, device=dev)
        torch.add(eps, v2, alpha=s.bias_correction2, out=v2)  # fma(sqrt(variance), bias_correction2, eps)
        m2.div_(v2)
        if h.weight_decay > 0 and h.decoupled:  # param = fma(param, -lr * weight_decay, param)
            torch.add(p, p, alpha=s.weight_decay, out=res)
        else:
            res.copy_(p)
        res.add_(m2, alpha=s.step_size)  # fma(update, -lr / bias_correction1, param)
