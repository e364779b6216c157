"""The dtype names of the ``"acco"`` block and of the wire, mapped to torch dtypes in one place."""

from __future__ import annotations

import torch

from ds_acco.errors import AccoConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Name -> torch dtype: the names configs, wire formats and log lines use."""
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """``"fp32"``, ``"bf16"`` or ``"fp16"`` (torch's own name for any other dtype)."""
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def resolve_dtype(name: str, auto: torch.dtype, field: str) -> torch.dtype:
    """``"auto"`` means ``auto``; otherwise the named floating dtype (an unknown name: an error naming ``field``)."""
    if name == "auto":
        return auto
    try:
        return DTYPES[name]
    except KeyError:
        raise AccoConfigError(f"{field}: got {name!r}; allowed: 'auto', {', '.join(map(repr, DTYPES))}") from None
