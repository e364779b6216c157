"""torch's fused Adam kernel (what ``torch.optim.Adam(fused=True)`` runs) for a round's lookahead and commit.

Why: a round runs on the communication thread, and each operation it issues holds the Python interpreter for
a moment the training thread needs to launch its own forward and backward kernels. On a GPU this, not the
round's arithmetic, is what a round costs compute (docs/gpu.md). The elementwise rule
(:mod:`ds_acco.optim.adam_lookahead`) issues eight operations per chunk of a shard; the fused kernel steps a
whole list of tensors in one, with no temporaries. So on an accelerator the commit steps the whole shard in
two operations (the step count's scalar, the kernel) and the lookahead three per chunk (the moments copied
into scratch, the kernel stepping the copies and the publish buffer) after the master's copy and the step's.

Why not on a CPU: there the elementwise rule is torch's single-tensor step bit for bit, and an operation costs
no launch. The exception is an optimizer built with ``fused=True``: its lookahead runs this kernel on any
device, so the estimate rounds exactly as the commit (torch's own fused step) will.

Rounding: the kernel computes Adam's formula in its own order (fp32), as ``fused=True`` does: a few ulps from
the single-tensor step. DeepSpeed's FusedAdam on a GPU (``multi_tensor_adam.cu``) computes the same formula
in yet another order; its lookahead here is torch's kernel with its hyper-parameters (``adam_w_mode`` is
decoupled weight decay), within the same few ulps of its own step.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

LAUNCHES_PER_CHUNK = 3
"""A fused lookahead's operations per chunk: the two moment copies and the kernel (two more for the whole
shard: the master's copy into the publish buffer, the step count's scalar)."""


@functools.lru_cache(maxsize=None)
def _kernel_devices() -> frozenset:
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return frozenset(_get_fused_kernels_supported_devices())


def kernel_exists(device: torch.device) -> bool:
    """Whether torch ships a fused Adam kernel for ``device``'s type (asked once: a round asks per master)."""
    return device.type in _kernel_devices()


def _step_tensor(step: float, device: torch.device) -> torch.Tensor:
    """The kernel reads the step count from a tensor on the parameters' device, made per call on the current
    stream (one operation, like a fill): a kept one refilled on one stream could change under a kernel still
    queued on another. The optimizer's own ``state["step"]`` stays where the user's optimizer keeps it."""
    return torch.full((), step, dtype=torch.float32, device=device)


def step_in_place(h, step: float, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
         exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor],
         max_exp_avg_sqs: Sequence[torch.Tensor] = ()) -> None:
    """Adam's step number ``step`` (already counted) of ``params`` and the moments, in place; ``h`` an
    :class:`~ds_acco.optim.adam_lookahead.AdamHyper` whose rule :func:`usable` accepts."""
    _launch(h, _step_tensor(step, params[0].device), params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)


def _launch(h, step: torch.Tensor, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs) -> None:
    kernel = torch._fused_adamw_ if h.decoupled else torch._fused_adam_
    kernel(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(max_exp_avg_sqs),
           [step] * len(params), amsgrad=h.amsgrad, lr=h.lr, beta1=h.beta1, beta2=h.beta2,
           weight_decay=h.weight_decay, eps=h.eps, maximize=h.maximize, grad_scale=None, found_inf=None)


def lookahead(h, step: float, chunks: Sequence[tuple], buf: Callable[[str, int], torch.Tensor]) -> None:
    """Each chunk's stepped master into its publish chunk, the master and moments untouched: ``chunks`` holds
    ``(p, g, m, v, vmax, out)`` views, a moment None before the first step (``vmax`` None without amsgrad),
    ``out`` already holding ``p`` where it is fp32 and contiguous (the caller copied the whole master in
    one operation), else any dtype, stepped through scratch; ``buf(name, elements)`` gives scratch."""
    steps = None
    for pc, gc, mc, vc, xc, oc in chunks:
        steps = _step_tensor(step, pc.device) if steps is None else steps
        k = pc.numel()
        direct = oc.dtype == torch.float32 and oc.is_contiguous()
        res = oc if direct else buf("result", k).copy_(pc)
        m2, v2 = buf("exp_avg", k), buf("exp_avg_sq", k)
        m2.zero_() if mc is None else m2.copy_(mc)
        v2.zero_() if vc is None else v2.copy_(vc)
        x2 = []
        if h.amsgrad:  # the kernel keeps the maximum in place: a copy too (zeros before the first step)
            x2 = [buf("max_exp_avg_sq", k)]
            x2[0].zero_() if xc is None else x2[0].copy_(xc)
        _launch(h, steps, [res], [gc], [m2], [v2], x2)
        if not direct:
            oc.copy_(res)


def usable(h) -> bool:
    """Whether the kernel computes ``h``'s rule: it always corrects for bias (DeepSpeed's ``bias_correction``
    off is left to the elementwise rule)."""
    return h.bias_correction
