"""Dtype names used in the config, mapped to torch dtypes in one place."""

from __future__ import annotations

import torch

from ds_acco.config.schema import AccoConfigError

_BY_NAME = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(name: str, auto: torch.dtype, field: str) -> torch.dtype:
    """``"auto"`` means ``auto``; otherwise the named floating dtype."""
    if name == "auto":
        return auto
    try:
        return _BY_NAME[name]
    except KeyError:
        raise AccoConfigError(f"{field}: got {name!r}; allowed: 'auto', {', '.join(map(repr, _BY_NAME))}") from None
