"""The fp32 scalars DeepSpeed's CPU Adam kernel derives from its arguments, for the lookahead that evaluates that
kernel's formula op for op (:meth:`ds_acco.optim.adam_lookahead.FunctionalAdam._chunk_deepspeed`).

Why apart: they are the kernel's C++ arithmetic in numpy fp32 (``beta ** step`` multiplied up step by step as the
kernel keeps it), nothing of the lookahead's tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KernelScalars:
    beta1: float
    beta2: float
    one_minus_beta1: float
    one_minus_beta2: float
    eps: float
    bias_correction2: float
    step_size: float
    weight_decay: float
    """``-lr * weight_decay`` in AdamW mode, ``weight_decay`` in L2 mode."""


def deepspeed_scalars(h, step: int) -> KernelScalars:
    """The fp32 scalars DeepSpeed's CPU Adam kernel derives from its fp32 arguments (``h``, an ``AdamHyper``) for
    ``step``."""
    f = np.float32
    lr, b1, b2, eps, wd = (f(x) for x in (h.lr, h.beta1, h.beta2, h.eps, h.weight_decay))
    if h.bias_correction:
        power = running_power if h.running_power else (lambda b, t: f(float(b) ** t))  # std::pow(float, size_t)
        b1_t, b2_t = power(b1, step), power(b2, step)
        bias_correction1 = f(1) - b1_t
        bias_correction2 = f(1) / f(math.sqrt(f(1) - b2_t))
    else:
        bias_correction1 = bias_correction2 = f(1)
    return KernelScalars(
        beta1=float(b1), beta2=float(b2), one_minus_beta1=float(f(1) - b1), one_minus_beta2=float(f(1) - b2),
        eps=float(eps), bias_correction2=float(bias_correction2), step_size=float(f(-lr) / bias_correction1),
        weight_decay=float(f(-lr) * wd if h.decoupled else wd),
    )


_POWERS: dict[float, tuple[int, np.float32]] = {}


def running_power(beta: np.float32, step: int) -> np.float32:
    """``beta ** step`` as the kernel keeps it: multiplied up in fp32, one step at a time (cached)."""
    done, value = _POWERS.get(float(beta), (0, np.float32(1)))
    if step < done:
        done, value = 0, np.float32(1)
    for _ in range(step - done):
        value = np.float32(value * beta)
    _POWERS[float(beta)] = (step, value)
    return value
