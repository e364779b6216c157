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

Where the buffers live (see :mod:`ds_acco.fsdp._fsdp2` for the FSDP2 internals used):

* **master shards**: FSDP2's sharded parameters. The optimizer is built over the
  DTensor parameters ``model.parameters()`` returns after ``fully_shard`` (as with
  stock FSDP2; Adam/AdamW commits step their local tensors, bit-identically and
  without DTensor dispatch: :mod:`ds_acco.fsdp.shard_optimizer`), and the round
  engine reads their padded local shards; no second fp32 copy exists. Checkpoints therefore hold ordinary FSDP2/DCP state.
* **compute parameters**: FSDP2's unsharded parameters (same ``nn.Parameter``
  objects, in ``mp_policy.param_dtype``), each a view of a round-engine buffer;
  a swap re-points them at the freshly all-gathered buffer.
* **layout**: one round-engine group per bucket of consecutive ``fully_shard``
  units (``bucket_cap_mb``, 25 MiB by default; 0: one per unit, as FSDP2 issues
  its collectives), so a round issues one reduce-scatter and one all-gather per
  bucket: the bucket's dim-0 chunks are packed rank-major around each collective
  (FSDP2's own all-gather layout, :mod:`ds_acco.layout.rank_major`).

What it relies on from FSDP2 (all of it in :mod:`ds_acco.fsdp._fsdp2`, checked at
start-up): the public ``fully_shard``, ``unshard``/``reshard``,
``set_requires_gradient_sync(False)``, ``set_reshard_after_forward(False)`` and
``set_reshard_after_backward(False)`` keep FSDP2 unsharded and silent; the
internal ``FSDPParam`` gives the padded local shard (``_sharded_param_data``)
and the unsharded parameter, and ``FSDPParamGroup._to_unsharded()`` re-registers
the compute parameters after something (``model.state_dict()``, a checkpoint)
resharded the model, without an all-gather.

Checkpoints go through ``torch.distributed.checkpoint``:
:meth:`AccoFSDP.save_checkpoint` / :meth:`AccoFSDP.load_checkpoint`
(:mod:`ds_acco.fsdp.checkpoint`). While training, the rounds own the parameters:
no ``optimizer.step()``, ``model.to()`` or ``model.load_state_dict()`` of your own.

What is not supported, and fails at start-up with a message saying so: HSDP
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

import dataclasses
import logging
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ._fsdp2 import TORCH_RANGE, FSDP2Model, ManagedParam, check_torch_version
from ds_acco.rounds.committed import committed_parameters
from ds_acco.config.schema import AccoConfig, AccoConfigError, parse_acco_config
from ds_acco.layout.flat_buffer import ShardedGroup
from .shard_optimizer import DTensorShardOptimizer
from ds_acco.layout.rank_major import RankMajorPacking
from ds_acco.rounds.engine import RoundEngine
from ds_acco.telemetry.startup_line import announce, round_fields
from ds_acco.telemetry.records import Telemetry

logger = logging.getLogger("ds_acco")

__all__ = ["AccoFSDP", "StockFSDP", "TORCH_RANGE", "acco_fully_shard", "check_torch_version", "split_backend"]

BACKENDS = ("deepspeed", "fsdp")
DEFAULT_BUCKET_CAP_MB = 25.0
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# --------------------------------------------------------------------------- config


def split_backend(block: Any) -> tuple[str, Any]:
    """Read ``"backend"`` out of an ``"acco"`` block; return it and the block without it.

    The FSDP front end checks the key itself so its error can say which front end to
    use; the rest goes to :func:`ds_acco.parse_acco_config`. A block without the key
    means ``"deepspeed"`` (``AccoConfig.backend``'s default).

    Raises:
        AccoConfigError: ``backend`` is not one of :data:`BACKENDS`.
    """
    if not isinstance(block, Mapping) or "backend" not in block:
        return "deepspeed", block
    rest = dict(block)
    backend = rest.pop("backend")
    if backend not in BACKENDS:
        raise AccoConfigError(f"acco.backend: got {backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    return backend, rest


def _fsdp_config(block: Any) -> AccoConfig:
    backend, rest = split_backend(block)
    if isinstance(block, Mapping) and "backend" in block and backend != "fsdp":
        raise AccoConfigError(
            f"acco.backend: got {backend!r}, but this is the FSDP front end (ds_acco.fsdp.acco_fully_shard); "
            "use ds_acco.initialize for DeepSpeed, or set acco.backend to 'fsdp'"
        )
    config = parse_acco_config(rest)
    if config.all_gather_quantization != "none":
        raise AccoConfigError(
            f"acco.all_gather_quantization: got {config.all_gather_quantization!r}; the FSDP front end allows "
            "'none' only (its DCP checkpoints hold FSDP2's master shards, not the int8-rounded parameters the "
            "replicas train on, so a resume could not continue exactly). Low-bit all-gathers run on the "
            "DeepSpeed and plain front ends"
        )
    return config


def _translate_mp_policy(mp_policy: Any, config: AccoConfig, model: nn.Module) -> tuple[Any, AccoConfig]:
    """FSDP2's ``reduce_dtype`` becomes ``acco.grad_accum_dtype``; FSDP2 itself gets none.

    FSDP2 would move each backward's gradient out of ``param.grad`` into its own
    ``reduce_dtype`` accumulator; ACCO accumulates in its round buffers instead.
    """
    if mp_policy is None or mp_policy.reduce_dtype is None:
        return mp_policy, config
    compute = mp_policy.param_dtype or next(iter(model.parameters())).dtype
    if mp_policy.reduce_dtype != compute:
        name = _DTYPE_NAMES.get(mp_policy.reduce_dtype)
        if name is None:
            raise AccoConfigError(f"mp_policy.reduce_dtype: got {mp_policy.reduce_dtype}; allowed: fp32, bf16, fp16")
        if config.grad_accum_dtype == "auto":
            config = config.model_copy(update={"grad_accum_dtype": name})
        elif config.grad_accum_dtype != name:
            raise AccoConfigError(
                f"mp_policy.reduce_dtype ({name}) and acco.grad_accum_dtype ({config.grad_accum_dtype!r}) disagree; "
                "set one of them"
            )
    return dataclasses.replace(mp_policy, reduce_dtype=None), config


def _device_type(group: dist.ProcessGroup) -> str:
    backend = str(dist.get_backend(group)).lower()
    for name, device in (("nccl", "cuda"), ("xccl", "xpu"), ("gloo", "cpu")):
        if name in backend:
            return device
    raise AccoConfigError(f"process_group: backend {backend!r}; pass mesh= (a 1-D DeviceMesh) instead")


def _shard(model: nn.Module, mesh: Any, process_group: Optional[dist.ProcessGroup], mp_policy: Any) -> nn.Module:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules()):
        if mesh is not None or process_group is not None or mp_policy is not None:
            raise AccoConfigError(
                "mesh/process_group/mp_policy: the model is already sharded with fully_shard, which fixed them; "
                "pass none of them, or pass the unwrapped model"
            )
        return model
    if mesh is not None and process_group is not None:
        raise AccoConfigError("mesh and process_group: pass one of them, not both")
    if mesh is None:
        group = process_group if process_group is not None else dist.group.WORLD
        device = _device_type(group)
        if process_group is None:
            mesh = init_device_mesh(device, (dist.get_world_size(),))
        else:
            mesh = DeviceMesh.from_group(process_group, device)
    if mesh.ndim != 1:
        raise AccoConfigError(f"mesh: got a {mesh.ndim}-D mesh; ds_acco.fsdp supports a 1-D data-parallel mesh only")
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy or MixedPrecisionPolicy())
    return model


def _optimizer_groups(model: nn.Module, fsdp: FSDP2Model, param_groups: Any) -> list[dict]:
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


# --------------------------------------------------------------------------- front end


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

    Raises:
        AccoConfigError: a wrong option, or an FSDP2 feature ACCO does not support.
        RuntimeError: torch outside :data:`TORCH_RANGE`.
    """
    check_torch_version()
    config = _fsdp_config(acco_config)
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb >= 0:
        raise AccoConfigError(f"bucket_cap_mb: got {bucket_cap_mb!r}; must be a number >= 0 (0: one bucket per unit)")
    if config.enabled:
        config.check_accumulation(gradient_accumulation_steps)
        mp_policy, config = _translate_mp_policy(mp_policy, config, model)
    elif isinstance(gradient_accumulation_steps, bool) or not isinstance(gradient_accumulation_steps, int) or (
            gradient_accumulation_steps < 1):
        raise AccoConfigError(f"gradient_accumulation_steps: got {gradient_accumulation_steps!r}; must be >= 1")
    if not dist.is_initialized():
        raise RuntimeError("ds_acco.fsdp: call torch.distributed.init_process_group() before acco_fully_shard")
    model = _shard(model, mesh, process_group, mp_policy)
    fsdp = FSDP2Model(model)
    optimizer = optimizer_cls(_optimizer_groups(model, fsdp, param_groups), **(optimizer_kwargs or {}))
    scheduler = lr_scheduler(optimizer) if lr_scheduler is not None else None
    if not config.enabled:
        return StockFSDP(model, fsdp, optimizer, scheduler, gradient_accumulation_steps, clip_grad_norm, grad_scale)
    return AccoFSDP(model, fsdp, optimizer, scheduler, config, gradient_accumulation_steps, clip_grad_norm, grad_scale,
                    bucket_cap_mb=bucket_cap_mb)


def _buckets(units: Iterable[list[ManagedParam]], cap_bytes: float) -> list[list[ManagedParam]]:
    """Consecutive ``fully_shard`` units of one compute dtype merged until a bucket holds ``cap_bytes``.

    A collective pays the link's latency (and, on gloo, a few milliseconds of a busy
    host's scheduling) once per call: small units merged into one bucket cost one
    reduce-scatter and one all-gather instead of one per unit. A unit is never split;
    ``cap_bytes <= 0`` keeps one bucket per unit.
    """
    buckets: list[list[ManagedParam]] = []
    open_bucket: dict[torch.dtype, tuple[int, int]] = {}  # dtype -> (bucket index, bytes in it)
    for unit in units:
        dtype, size = unit[0].unsharded.dtype, sum(p.unsharded.numel() * p.unsharded.element_size() for p in unit)
        at = open_bucket.get(dtype)
        if at is not None and cap_bytes > 0 and at[1] + size <= cap_bytes:
            buckets[at[0]].extend(unit)
            open_bucket[dtype] = (at[0], at[1] + size)
        else:
            buckets.append(list(unit))
            open_bucket[dtype] = (len(buckets) - 1, size)
    return buckets


def _unit_groups(fsdp: FSDP2Model, world: int,
                 bucket_cap_mb: float) -> tuple[list[ShardedGroup], list[list[ManagedParam]]]:
    """One packed round-engine group per bucket of ``fully_shard`` units (:func:`_buckets`).

    The trainable parameters' compute data moves into the group's param-major
    buffer (frozen ones get a private copy); the group's shards are FSDP2's padded
    local shards, packed rank-major (:mod:`ds_acco.layout.rank_major`), as FSDP2 packs a
    unit for its all-gather.
    """
    units: dict[tuple[int, torch.dtype], list[ManagedParam]] = {}
    for p in fsdp.params:
        if not p.trainable:
            fsdp.own_storage(p, None)  # frozen: a private copy, never updated
            continue
        units.setdefault((id(p.group), p.unsharded.dtype), []).append(p)
    units = _buckets(units.values(), bucket_cap_mb * 2 ** 20)
    groups = []
    for unit in units:
        try:
            packing = RankMajorPacking([p.unsharded.shape for p in unit], world, [p.master for p in unit])
        except ValueError as err:
            raise RuntimeError(
                f"ds_acco.fsdp: FSDP2's local shards of {[p.fqn for p in unit]} are not padded dim-0 chunks "
                f"({err}); is torch {torch.__version__} supported?"
            ) from err
        flat = packing.layout.new_buffer(unit[0].unsharded)
        for p, view in zip(unit, packing.layout.views(flat)):
            with torch.no_grad():
                view.copy_(p.unsharded.detach())
            fsdp.own_storage(p, view)
        groups.append(ShardedGroup(params=[p.unsharded for p in unit], layout=packing.layout, flat=flat,
                                   master=None, packing=packing))
    return groups, units


class AccoFSDP:
    """An FSDP2 model whose gradient rounds run in the background (see the module docstring).

    Attributes:
        module: the ``fully_shard`` model.
        engine: the :class:`RoundEngine` (its ``groups`` are one per ``fully_shard`` unit).
        optimizer: the torch optimizer over FSDP2's sharded parameters.
        lr_scheduler: stepped once per commit, or None.
    """

    def __init__(self, module: nn.Module, fsdp: FSDP2Model, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 config: AccoConfig, gradient_accumulation_steps: int, clip_grad_norm: Optional[float],
                 grad_scale: Union[float, Callable[[], float]], *, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB):
        self.module, self.fsdp, self.optimizer, self.lr_scheduler = module, fsdp, optimizer, lr_scheduler
        self.closed = False
        world = len(fsdp.ranks)
        self.params = [p for p in fsdp.params if p.trainable]
        if not self.params:
            raise AccoConfigError("model: no trainable parameter under fully_shard; nothing for ACCO to train")
        fsdp.hold_unsharded()
        try:
            groups, units = _unit_groups(fsdp, world, bucket_cap_mb)
            self.params = [p for unit in units for p in unit]  # the order of the rounds' packed shards
            shard_opt = DTensorShardOptimizer(optimizer, self.params, [g.packing for g in groups], lr_scheduler)
            self.engine = RoundEngine(
                groups, shard_opt, config=config, gradient_accumulation_steps=gradient_accumulation_steps,
                clip_grad_norm=clip_grad_norm, process_group=fsdp.process_group, grad_scale=grad_scale,
            )
            if self.engine.rank != fsdp.shard_rank:  # master shard r must be the round's shard r
                self.engine.close(drain=False)
                raise RuntimeError(f"ds_acco.fsdp: round rank {self.engine.rank} != FSDP2 shard rank {fsdp.shard_rank}")
        except BaseException:
            fsdp.release()
            raise
        # model.state_dict() reads FSDP2's sharded parameters, which are the master shards a round in
        # flight may be stepping: wait for it first (not swapped in, so training is unchanged). They
        # are then the committed parameters.
        self._quiesce_hook = module.register_state_dict_pre_hook(self._quiesce_for_state_dict)
        announce(f"FSDP2, {len(self.params)} parameters of {len(fsdp.groups)} fully_shard units in {len(groups)} "
                 "packed buckets",
                 self.engine.rank, round_fields(self.engine))

    # ------------------------------------------------------------ training loop
    @property
    def config(self) -> AccoConfig:
        return self.engine.config

    @property
    def telemetry(self) -> Telemetry:
        return self.engine.telemetry

    @property
    def commits(self) -> int:
        """Optimizer steps (commits) applied so far."""
        return self.engine.commits

    @property
    def micro_batches(self) -> int:
        return self.engine.micro_batches

    def after_micro_batch(self) -> bool:
        """Call after every backward; True when the compute parameters changed (see RoundEngine)."""
        return self.engine.after_micro_batch()

    def finish(self) -> None:
        """Drain and commit everything accumulated: the compute parameters equal the committed ones."""
        self.engine.finish()

    def committed_parameters(self):
        """``with acco.committed_parameters():`` forward passes use the committed parameters (evaluation)."""
        return committed_parameters(self.engine)

    def _quiesce_for_state_dict(self, *_: Any) -> None:
        if not self.closed:
            self.engine.quiesce()

    def close(self, drain: bool = True) -> None:
        """Stop the rounds and hand the model back to stock FSDP2 (sharded; its next forward all-gathers).

        ``drain``: finish the round in flight first (its update is applied). Telemetry stays readable.
        """
        if self.closed:
            return
        self.closed = True
        self._quiesce_hook.remove()
        try:
            self.engine.close(drain=drain)
        finally:
            self.fsdp.release()

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint_id: Any, extra: Optional[dict] = None) -> None:
        """Save model, optimizer, scheduler and round state with ``torch.distributed.checkpoint`` (collective).

        ``extra``: replicated values of your own (e.g. every rank's data cursor, gathered).
        """
        from .checkpoint import save

        save(self, checkpoint_id, extra)

    def load_checkpoint(self, checkpoint_id: Any) -> Optional[dict]:
        """Load what :meth:`save_checkpoint` wrote (collective); returns its ``extra``.

        Same world size and acco block: resumes exactly (fixed policy: bit-identically).
        Another world size, or a :class:`StockFSDP` checkpoint: model, optimizer and
        scheduler load (resharded by DCP); rounds bootstrap afresh. A checkpoint a stock
        FSDP2 job saved with DCP: model and optimizer load unverified, with one WARNING
        (returns None).
        """
        from .checkpoint import load

        return load(self, checkpoint_id)

    def _check_checkpointable(self) -> None:
        if self.closed:
            raise AccoConfigError("checkpoint: this AccoFSDP is closed; save or load before close()")


class StockFSDP:
    """``"enabled": false``: stock FSDP2 gradient accumulation behind :class:`AccoFSDP`'s calls.

    Backward reduce-scatters only on the ``G``-th micro-batch (``set_requires_gradient_sync``)
    and keeps the parameters unsharded between the micro-batches of a step
    (``set_reshard_after_backward``, FSDP2's recipe for gradient accumulation: no
    all-gather per micro-batch); FSDP2 sums and divides by ``world * G * grad_scale``
    (so the update uses the mean gradient, as ACCO's does), then clipping, the
    optimizer and the scheduler step.
    """

    telemetry = None

    def __init__(self, module: nn.Module, fsdp: FSDP2Model, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 gradient_accumulation_steps: int, clip_grad_norm: Optional[float],
                 grad_scale: Union[float, Callable[[], float]]):
        self.module, self.fsdp, self.optimizer, self.lr_scheduler = module, fsdp, optimizer, lr_scheduler
        self.G, self.clip, self._grad_scale = gradient_accumulation_steps, float(clip_grad_norm or 0.0), grad_scale
        self.commits = self.micro_batches = self._n = 0
        self._params = [p.sharded for p in fsdp.params if p.sharded.requires_grad]
        for m in fsdp.modules:
            m.set_force_sum_reduction_for_comms(True)
        self._sync(self.G == 1)

    def _sync(self, on: bool) -> None:
        if on:
            scale = float(self._grad_scale() if callable(self._grad_scale) else self._grad_scale)
            for m in self.fsdp.modules:
                m.set_gradient_divide_factor(float(len(self.fsdp.ranks) * self.G) * scale)
        self.module.set_requires_gradient_sync(on)
        self.module.set_reshard_after_backward(on)

    def after_micro_batch(self) -> bool:
        self._n += 1
        self.micro_batches += 1
        if self._n < self.G:
            if self._n == self.G - 1:
                self._sync(True)
            return False
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self._params, self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.commits += 1
        self._n = 0
        self._sync(self.G == 1)
        return True

    def finish(self) -> None:
        """Nothing runs in the background; accumulated gradients of an unfinished step stay."""

    def close(self, drain: bool = True) -> None:
        self.module.set_requires_gradient_sync(True)
        self.module.set_reshard_after_backward(True)

    def save_checkpoint(self, checkpoint_id: Any, extra: Optional[dict] = None) -> None:
        """Same entries as :meth:`AccoFSDP.save_checkpoint`, without round state; at a step boundary."""
        from .checkpoint import save

        save(self, checkpoint_id, extra)

    def load_checkpoint(self, checkpoint_id: Any) -> Optional[dict]:
        """Load a checkpoint of either class (resharded by DCP when the world size differs)."""
        from .checkpoint import load

        return load(self, checkpoint_id)

    def _check_checkpointable(self) -> None:
        if self._n:
            raise AccoConfigError(
                f"checkpoint: {self._n} micro-batches of an unfinished step are accumulated; stock FSDP2 "
                "checkpoints are taken right after an optimizer step"
            )

    def _restart(self, commits: int, micro_batches: int) -> None:
        self.commits, self.micro_batches, self._n = commits, micro_batches, 0
        self._sync(self.G == 1)
