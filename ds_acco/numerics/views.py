"""Views of a caller's buffers made once per buffer, not once per round.

A round reshapes the same few buffers every time (the gradient accumulators, the compute parameters, the shards),
and each ``view``, ``slice`` or ``unflatten`` is an operation that holds the Python interpreter the training
thread needs (issue 49: a round issued more views than arithmetic). A :class:`ViewCache` keeps what its ``make``
returned for a tensor object while that object lives and still points at the same memory.

The views are cut from a ``detach()`` of the tensor, so they do not keep the tensor object alive (a plain view's
``_base`` would): when the caller drops a buffer, its entry goes with it and holds no memory.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch


class ViewCache:
    """``cache(t)``: ``make(t.detach())``, made on the first call for the tensor object ``t`` (and again if its
    memory, dtype, shape or strides changed); at most ``size`` tensors are remembered."""

    def __init__(self, make: Callable[[torch.Tensor], Any], size: int = 8):
        self._make, self._size = make, size
        self._entries: dict[int, tuple] = {}

    def __call__(self, t: torch.Tensor) -> Any:
        key = id(t)
        hit = self._entries.get(key)
        sig = (t.data_ptr(), t.dtype, t.shape, t.stride())
        if hit is not None and hit[0]() is t and hit[1] == sig:
            return hit[2]
        views = self._make(t.detach())
        entries = self._entries
        if len(entries) >= self._size and key not in entries:  # the oldest goes (a callback may race us to it)
            entries.pop(next(iter(entries), None), None)
        entries[key] = (weakref.ref(t, lambda _, k=key: entries.pop(k, None)), sig, views)
        return views
