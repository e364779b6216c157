"""ACCO for models sharded with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Gradient synchronisation leaves the backward pass: FSDP2 keeps the compute
parameters unsharded and only accumulates gradients, and ACCO's background
rounds (:class:`~ds_acco.rounds.engine.RoundEngine`) reduce-scatter them, step
the optimizer on FSDP2's own sharded parameters and all-gather the result into
the compute parameters at the next swap. The training loop is the plain one::

    from ds_acco.fsdp import acco_fully_shard

    acco = acco_fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16),
                            acco_config={"backend": "fsdp", "mode": "acco"},
                            optimizer_cls=torch.optim.AdamW, optimizer_kwargs={"lr": 3e-4},
                            gradient_accumulation_steps=8, clip_grad_norm=1.0)
    for batch in loader:                       # one micro-batch per iteration
        loss_fn(model(batch)).backward()
        acco.after_micro_batch()
    acco.finish(); print(acco.telemetry.summary()); acco.close()

Where the buffers live (the FSDP2 internals used, checked at start-up: :mod:`ds_acco.fsdp._fsdp2`):

* **master shards**: FSDP2's sharded parameters. The optimizer is built over the
  DTensor parameters ``model.parameters()`` returns after ``fully_shard`` (as with
  stock FSDP2; how a commit steps them: :mod:`ds_acco.fsdp.shard_optimizer`), and the
  round engine reads their padded local shards; no second fp32 copy exists.
  Checkpoints (:mod:`ds_acco.fsdp.checkpoint`) therefore hold ordinary FSDP2/DCP state.
* **compute parameters**: FSDP2's unsharded parameters (same ``nn.Parameter``
  objects, in ``mp_policy.param_dtype``), each a view of a round-engine buffer;
  a swap re-points them at the freshly all-gathered buffer.
* **layout**: one round-engine group per bucket of consecutive ``fully_shard``
  units (:mod:`ds_acco.fsdp.buckets`), packed rank-major as FSDP2's own all-gather.

While training, the rounds own the parameters: no ``optimizer.step()``,
``model.to()`` or ``model.load_state_dict()`` of your own.

Every ``"acco"`` switch of the DeepSpeed front end runs here, low-bit rounds included, but ``mode:
"streaming"`` and ``auto.streaming``, refused at start-up with the reason (:mod:`ds_acco.config.front_ends`).
What FSDP2 set-ups are not supported, and fail at start-up with a message saying so: HSDP
and other 2-D meshes, tensor/expert parallel (DTensor) parameters, CPU offload,
``shard_placement_fn`` sharding on a dim other than 0, all-gather extensions
(float8), parameters outside FSDP, and a torch that lacks an FSDP2 internal used
(releases outside :data:`TORCH_RANGE`, the tested ones, start with a warning).
FSDP2's parameter sharding (ZeRO-3) is not kept during training: like ZeRO-1,
every rank holds the full compute parameters (twice: one set computing, one
being gathered) while optimizer state and fp32 masters stay sharded. The
rank-major packing adds one buffer per bucket (model-sized in all) for the collectives
(the reduce-scatter input, reused as the all-gather output when the
accumulation and compute dtypes agree), as FSDP2's own all-gather output and
reduce-scatter input do.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ds_acco.comm.engine_lifecycle import EXIT_ORDER
from ds_acco.config import AccoConfig
from ds_acco.errors import AccoConfigError

from ._fsdp2 import FSDP2Model, check_torch_version
from .acco_fsdp import AccoFSDP
from .buckets import DEFAULT_BUCKET_CAP_MB
from .mesh import shard_model
from .options import fsdp_config, translate_mp_policy
from .stock_fsdp import StockFSDP


def optimizer_groups(model: nn.Module, fsdp: FSDP2Model, param_groups: Any) -> list[dict]:
    """The optimizer's param groups over FSDP2's sharded parameters, checked to cover every trainable one once."""
    if param_groups is None:
        spec = [{"params": [p.sharded for p in fsdp.params if p.sharded.requires_grad]}]
    else:
        items = list(param_groups(model) if callable(param_groups) else param_groups)
        if items and not isinstance(items[0], Mapping):
            items = [{"params": items}]
        spec = [dict(g, params=list(g["params"])) for g in items]
    names = {id(p.sharded): p.fqn for p in fsdp.params}
    seen: dict[int, int] = {}
    for g in spec:
        for p in g["params"]:
            if id(p) not in names:
                raise AccoConfigError(
                    f"param_groups: a parameter of shape {tuple(p.shape)} is not one of the model's FSDP2 sharded "
                    "parameters; build the groups from the sharded model (param_groups=lambda m: ...)"
                )
            seen[id(p)] = seen.get(id(p), 0) + 1
    twice = [names[i] for i, n in seen.items() if n > 1]
    missing = [p.fqn for p in fsdp.params if p.sharded.requires_grad and id(p.sharded) not in seen]
    if twice or missing:
        raise AccoConfigError(
            f"param_groups: every trainable parameter must appear exactly once; twice: {twice}, missing: {missing}"
        )
    return spec


def acco_fully_shard(
    model: nn.Module,
    *,
    acco_config: Union[AccoConfig, Mapping[str, Any], None],
    gradient_accumulation_steps: int,
    mesh: Any = None,
    process_group: Optional[dist.ProcessGroup] = None,
    mp_policy: Any = None,
    optimizer_cls: type = torch.optim.AdamW,
    optimizer_kwargs: Optional[dict] = None,
    param_groups: Union[None, Iterable[Any], Callable[[nn.Module], Iterable[Any]]] = None,
    clip_grad_norm: Optional[float] = None,
    lr_scheduler: Optional[Callable[[torch.optim.Optimizer], Any]] = None,
    grad_scale: Union[float, Callable[[], float]] = 1.0,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
) -> Union["AccoFSDP", "StockFSDP"]:
    """Shard ``model`` with FSDP2 (unless it already is) and train it with ACCO rounds.

    Args:
        model: an unwrapped module (``fully_shard`` is applied to it with ``mesh`` /
            ``process_group`` and ``mp_policy``), or the root of a model you already
            sharded with ``fully_shard`` (then pass none of those three).
        acco_config: the ``"acco"`` block (dict or :class:`AccoConfig`); a
            ``"backend"`` key must say ``"fsdp"``. ``"enabled": false`` or ``None``
            returns :class:`StockFSDP`: stock FSDP2 accumulation behind the same calls.
        gradient_accumulation_steps: ``G``, micro-batches per rank per optimizer step.
        mesh / process_group: the 1-D data-parallel mesh, or a group to build it from
            (default: every rank).
        mp_policy: FSDP2's ``MixedPrecisionPolicy``; its ``reduce_dtype`` becomes
            ``acco.grad_accum_dtype`` (FSDP2 itself then gets none).
        optimizer_cls / optimizer_kwargs: built over FSDP2's sharded parameters.
        param_groups: optimizer param groups, or a function of the sharded model
            returning them (e.g. weight decay on weights only); default: all
            trainable parameters.
        clip_grad_norm: clip the mean gradient to this global L2 norm.
        lr_scheduler: a factory called with the optimizer; stepped once per commit.
        grad_scale: the factor backward multiplied gradients by (see RoundEngine).
        bucket_cap_mb: consecutive ``fully_shard`` units are packed into one round
            collective until it holds this many MiB of parameters (DDP's knob of the
            same name); a unit is never split. 0: one reduce-scatter and one
            all-gather per unit, as FSDP2 issues them.
    """
    check_torch_version()
    config = fsdp_config(acco_config)
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb >= 0:
        raise AccoConfigError(f"bucket_cap_mb: got {bucket_cap_mb!r}; must be a number >= 0 (0: one bucket per unit)")
    if config.enabled:
        config.check_accumulation(gradient_accumulation_steps)
        mp_policy, config = translate_mp_policy(mp_policy, config, model)
    elif isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, int) or (
            gradient_accumulation_steps < 1):
        raise AccoConfigError(f"gradient_accumulation_steps: got {gradient_accumulation_steps!r}; must be >= 1")
    if not dist.is_initialized():
        raise RuntimeError("ds_acco.fsdp: call torch.distributed.init_process_group() before acco_fully_shard")
    EXIT_ORDER.arm()  # stock mode too: the exit hook collects FSDP2's cycles before finalization
    model = shard_model(model, mesh, process_group, mp_policy)
    fsdp = FSDP2Model(model)
    optimizer = optimizer_cls(optimizer_groups(model, fsdp, param_groups), **(optimizer_kwargs or {}))
    scheduler = lr_scheduler(optimizer) if lr_scheduler is not None else None
    if not config.enabled:
        return StockFSDP(model, fsdp, optimizer, scheduler, gradient_accumulation_steps, clip_grad_norm, grad_scale)
    return AccoFSDP(model, fsdp, optimizer, scheduler, config, gradient_accumulation_steps, clip_grad_norm, grad_scale,
                    bucket_cap_mb=bucket_cap_mb)


