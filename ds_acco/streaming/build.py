"""Streaming DiLoCo for a plain PyTorch model: fragments from the model or the config, then the engine.

Which layers form each fragment: explicit ones passed by the caller, else ``acco.streaming.fragment_modules`` by name,
else the default split (consecutive blocks of the model's layer stack, :mod:`ds_acco.layout.fragments`). The DeepSpeed
front end uses the same :func:`fragments_of` on the module DeepSpeed wraps.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ds_acco.config import AccoConfig, no_preemption_dir
from ds_acco.config.names import Mode
from ds_acco.errors import AccoConfigError
from ds_acco.layout.fragments import FragmentSpec, default_fragments, explicit_fragments, named_fragments

from .engine import StreamingEngine, streaming_config
from .phase import PhaseFactory


def fragments_of(model: nn.Module, config: AccoConfig,
                 explicit: Optional[FragmentSpec] = None) -> list[list[nn.Parameter]]:
    """``explicit`` fragments if given, else ``acco.streaming.fragment_modules``, else the default split (a model
    that cannot be cut so raises :class:`~ds_acco.errors.AccoConfigError`)."""
    P = config.streaming.fragments
    try:
        if explicit is not None:
            return explicit_fragments(explicit, model, P)
        if config.streaming.fragment_modules is not None:
            return named_fragments(config.streaming.fragment_modules, model, P)
        return default_fragments(model, P)
    except ValueError as exc:
        raise AccoConfigError(str(exc)) from None


def phase_factory(model: Optional[nn.Module], config: AccoConfig) -> Optional[PhaseFactory]:
    """What a front end hands the round engine for ``acco.auto.streaming``: the fragments, cut now, so a model
    that cannot be cut fails before training. None where auto may not switch, or without a model (the round
    engine then refuses ``acco.auto.streaming``, naming it)."""
    if model is None or not (config.mode == Mode.AUTO and config.auto.streaming):
        return None
    return PhaseFactory(fragments_of(model, config))


def build(
    model: nn.Module,
    inner_optimizer_cls: type = torch.optim.AdamW,
    inner_optimizer_kwargs: Optional[dict] = None,
    *,
    config: Union[AccoConfig, dict],
    process_group: Optional[dist.ProcessGroup] = None,
    fragments: Optional[FragmentSpec] = None,
    param_groups: Optional[Iterable[Any]] = None,
) -> StreamingEngine:
    """Split ``model`` into fragments, build its inner optimizer and start a streaming engine.

    Args:
        model: this rank's full replica (same architecture on every rank; rank 0's values are broadcast at start-up).
        inner_optimizer_cls / inner_optimizer_kwargs: the inner optimizer (any ``torch.optim``), available as
            ``engine.inner_optimizer``.
        config: the ``"acco"`` block, ``mode: "streaming"``.
        fragments: optional explicit fragments, one entry per fragment (modules and/or parameters); default:
            :func:`fragments_of`.
        param_groups: what to pass to the inner optimizer (default: the model's trainable parameters), e.g. groups with
            and without weight decay.

    Returns:
        The :class:`StreamingEngine`; call ``after_inner_step()`` after every inner step.
    """
    cfg = no_preemption_dir(streaming_config(config), "ds_acco.streaming.build")
    frags = fragments_of(model, cfg, fragments)
    groups = list(param_groups) if param_groups is not None else [p for p in model.parameters() if p.requires_grad]
    engine = StreamingEngine(model, None, frags, config=cfg, process_group=process_group)  # flattens first
    engine.inner_optimizer = inner_optimizer_cls(groups, **(inner_optimizer_kwargs or {}))
    engine.announce(f"plain PyTorch, {len(frags)} fragments")
    return engine
