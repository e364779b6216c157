"""Every piece of FSDP2 that ds_acco touches, in one place, checked by name at start-up.

:mod:`ds_acco.fsdp` keeps a ``fully_shard`` model *unsharded* for the whole run:
FSDP2's hooks still run (input casting, mixed precision, state-dict hooks) but
never all-gather or reduce-scatter, because ACCO's background rounds do both.
This module is the only one that reaches below FSDP2's public API; if a torch
release changes what it relies on, :func:`check_fsdp2` fails at start-up with
the torch version and the name of what is missing instead of training wrongly,
and the layout checks below (local shard = padded dim-0 chunk, the DTensor's
local tensor a view of it) fail if a kept name changed meaning. Releases outside
:data:`TORCH_RANGE` (the ones tested) start with a warning, not an error.

Public FSDP2 API used
    ``fully_shard``, ``MixedPrecisionPolicy``, ``FSDPModule.unshard`` / ``reshard``,
    ``set_requires_gradient_sync``, ``set_reshard_after_forward``,
    ``set_reshard_after_backward``, ``fully_shard.state(module)``,
    ``nn.Module.named_parameters()`` (parameter names), ``DTensor.to_local()``.

Internals used (``torch/distributed/fsdp/_fully_shard/``, torch 2.13)
    * ``FSDPState._lazy_init()``, ``._is_root``, ``._state_ctx.all_states``,
      ``._fsdp_param_groups``, ``._auto_reshard_after_forward``: find every
      parameter group under the root, as the first forward would.
    * ``_fsdp_common.FSDPMeshInfo`` / ``HSDPMeshInfo``: tell a 1-D FSDP mesh from HSDP.
    * ``FSDPParamGroup.fsdp_params``, ``.is_unsharded``, ``._to_unsharded()``
      (re-register the unsharded parameters without an all-gather), and the
      flags ``reduce_grads``, ``all_reduce_grads``, ``post_forward_mesh_info``,
      ``reshard_after_backward`` (saved at take-over, restored at release).
    * ``FSDPParam``: ``sharded_param`` (the DTensor ``nn.Parameter`` the optimizer
      steps), ``_sharded_param_data`` (the padded 1-D local shard; the DTensor's
      local tensor is a view of it, and it is the round engine's master shard),
      ``fsdp_placement``, ``mesh_info``, ``offload_to_cpu``, ``is_dtensor``,
      ``reduce_dtype``, ``param_dtype``, ``orig_dtype``, ``unsharded_param`` (the
      compute parameter), ``free_unsharded_param()``.

[Note: the layout is FSDP2's own, one round-engine group per bucket of units]
FSDP2 shards every parameter on dim 0 with ``torch.chunk`` semantics: each rank
holds ``c = ceil(d0 / N)`` rows (the last ranks fewer, padded with zero rows up
to ``c``), the padded local shard ``_sharded_param_data``. The round engine's
group for a bucket of ``fully_shard`` units (one unit, or consecutive small
ones: ``bucket_cap_mb``) packs those chunks rank-major, as FSDP2's own
all-gather does for a unit (:mod:`ds_acco.layout.rank_major`): rank ``r``'s shard of
the group is the concatenation of its padded local shards, so they *are* the
master shards (read with one ``torch.cat`` when a round publishes, stepped in
place by the optimizer) and no second fp32 copy exists. A round costs one
reduce-scatter and one all-gather per bucket, on the background thread.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ds_acco.errors import AccoConfigError

TORCH_RANGE = ((2, 13), (2, 15))
"""``[low, high)`` (major, minor) of the torch releases this module was tested with (others: a warning):
tests/test_fsdp.py passes on torch 2.13.0 (CPU) and 2.14.1 (CUDA build, run on CPU)."""

_FSDP_STATE_ATTRS = ("_lazy_init", "_is_root", "_state_ctx", "_fsdp_param_groups", "_auto_reshard_after_forward")
_FSDP_PARAM_ATTRS = (
    "sharded_param", "_sharded_param_data", "fsdp_placement", "mesh_info", "offload_to_cpu", "is_dtensor",
    "reduce_dtype", "param_dtype", "orig_dtype", "unsharded_param", "free_unsharded_param",
)
_FSDP_GROUP_ATTRS = (
    "fsdp_params", "is_unsharded", "_to_unsharded", "reduce_grads", "all_reduce_grads",
    "post_forward_mesh_info", "reshard_after_backward",
)


def _release(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _tested() -> str:
    (a, b), (c, d) = TORCH_RANGE
    return f">={a}.{b},<{c}.{d}"


def check_torch_version(version: Optional[str] = None) -> bool:
    """Warn when torch is outside :data:`TORCH_RANGE` (the tested releases); True when inside."""
    version = version or torch.__version__
    low, high = TORCH_RANGE
    if low <= _release(version) < high:
        return True
    warnings.warn(
        f"ds_acco.fsdp was tested with torch {_tested()}; installed torch is {version}. The FSDP2 internals it "
        "relies on (ds_acco/fsdp/_fsdp2.py) are checked at start-up; the exactness tests (tests/test_fsdp.py) tell "
        "whether this release trains identically.", RuntimeWarning, stacklevel=2)
    return False


def check_fsdp2(state: Any, fsdp_param: Any = None, group: Any = None) -> None:
    """Fail at start-up, naming the torch version and every missing attribute, if an FSDP2 object lacks one
    this module uses."""
    missing = []
    for obj, kind, attrs in ((state, "FSDPState", _FSDP_STATE_ATTRS), (fsdp_param, "FSDPParam", _FSDP_PARAM_ATTRS),
                             (group, "FSDPParamGroup", _FSDP_GROUP_ATTRS)):
        if obj is not None:  # class attributes (methods, properties) or instance attributes; a property is not run
            missing += [f"{kind}.{a}" for a in attrs
                        if not hasattr(type(obj), a) and a not in getattr(obj, "__dict__", {})]
    if missing:
        raise RuntimeError(
            f"ds_acco.fsdp: torch {torch.__version__} lacks FSDP2 internals ds_acco relies on: "
            f"{', '.join(missing)} (tested with torch {_tested()}). Install a tested torch, or use the plain "
            "PyTorch front end (ds_acco.plain), which needs no FSDP."
        )


@dataclass
class ManagedParam:
    """One FSDP2 parameter as the FSDP front end sees it."""

    fqn: str
    fsdp_param: Any
    group: Any
    sharded: nn.Parameter
    """FSDP2's sharded parameter (a DTensor); what the optimizer steps and checkpoints hold."""
    master: torch.Tensor
    """Its padded 1-D local shard (``_sharded_param_data``); the DTensor's local tensor is a view of it."""
    unsharded: Optional[nn.Parameter] = None
    """The compute parameter, set by :meth:`FSDP2Model.hold_unsharded`."""
    fsdp_data: Optional[torch.Tensor] = field(default=None, repr=False)
    """What ``unsharded.data`` was before ds_acco re-pointed it (a view of FSDP2's all-gather output)."""

    @property
    def trainable(self) -> bool:
        return self.sharded.requires_grad and self.sharded.numel() > 0


class FSDP2Model:
    """The FSDP2 state of a ``fully_shard`` root, and the take-over/release of its parameters.

    ``root``: the module ``fully_shard`` was applied to last; its first forward need not have run. An FSDP2
    feature ACCO cannot drive fails here (:class:`AccoConfigError`, listed in :mod:`ds_acco.fsdp.api`).
    """

    def __init__(self, root: nn.Module):
        from torch.distributed.fsdp import FSDPModule, fully_shard

        try:
            from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo
        except ImportError as err:
            raise RuntimeError(f"ds_acco.fsdp: torch {torch.__version__} lacks FSDP2 internals ds_acco relies on: "
                               f"{err} (tested with torch {_tested()})") from err
        check_torch_version()
        if not isinstance(root, FSDPModule):
            raise AccoConfigError(
                f"model: got {type(root).__name__}, which is not a fully_shard module; pass the root module "
                "(fully_shard applied to it last) or an unwrapped model, which acco_fully_shard wraps itself"
            )
        self.root = root
        state = fully_shard.state(root)
        check_fsdp2(state)
        state._lazy_init()  # what the first forward does: decide the root, FQNs, mixed-precision dtypes
        if not state._is_root:
            raise AccoConfigError("model: not the FSDP2 root; pass the outermost fully_shard module")
        self.states = list(state._state_ctx.all_states)
        names = {id(p): n for n, p in root.named_parameters()}  # the sharded DTensors are registered now
        self.groups = [g for s in self.states for g in s._fsdp_param_groups]
        self.modules = [m for m in root.modules() if isinstance(m, FSDPModule)]
        self.params: list[ManagedParam] = []
        self.ranks: Optional[tuple] = None
        for group in self.groups:
            for fp in group.fsdp_params:
                check_fsdp2(None, fp, group)
                info = fp.mesh_info
                name = names.get(id(fp.sharded_param), "?")
                if isinstance(info, HSDPMeshInfo) or not isinstance(info, FSDPMeshInfo) or info.mesh.ndim != 1:
                    raise AccoConfigError(
                        f"model: parameter {name} is replicated (HSDP or DDP mesh); ds_acco.fsdp supports a 1-D "
                        "fully_shard mesh only (ACCO's rounds are one reduce-scatter and all-gather over it)"
                    )
                if getattr(info, "is_spmd_mesh", False) or fp.is_dtensor:
                    raise AccoConfigError(
                        f"model: parameter {name} is a DTensor before fully_shard (tensor/expert parallelism); "
                        "not supported with ds_acco.fsdp"
                    )
                if fp.fsdp_placement.dim != 0:
                    raise AccoConfigError(
                        f"model: parameter {name} is sharded on dim {fp.fsdp_placement.dim} (shard_placement_fn); "
                        "ds_acco.fsdp supports FSDP2's default dim-0 sharding only"
                    )
                if fp.offload_to_cpu:
                    raise AccoConfigError(
                        "offload_policy: CPUOffloadPolicy is not supported with ds_acco.fsdp (the round's shard "
                        "step runs on the parameters' device)"
                    )
                if hasattr(fp.sharded_param.to_local(), "fsdp_pre_all_gather"):
                    raise AccoConfigError(
                        f"model: parameter {name} uses an FSDP2 all-gather extension (e.g. float8); not supported"
                    )
                if fp.reduce_dtype not in (None, fp.param_dtype or fp.orig_dtype):
                    raise AccoConfigError(
                        f"mp_policy.reduce_dtype: got {fp.reduce_dtype} on {name}; with ds_acco.fsdp gradients "
                        "accumulate and reduce in acco.grad_accum_dtype / acco.comm_dtype. Pass mp_policy to "
                        "acco_fully_shard (it translates reduce_dtype) or fully_shard without reduce_dtype."
                    )
                ranks = tuple(torch.distributed.get_process_group_ranks(info.shard_process_group))
                if self.ranks is not None and ranks != self.ranks:
                    raise AccoConfigError(
                        f"model: parameters are sharded over different process groups ({self.ranks} and {ranks}); "
                        "ds_acco.fsdp needs one data-parallel mesh for the whole model"
                    )
                self.ranks = ranks
                master = fp._sharded_param_data
                local = fp.sharded_param.to_local()
                if master.dim() != 1 or (local.numel() > 0 and local.data_ptr() != master.data_ptr()):
                    raise RuntimeError(
                        f"ds_acco.fsdp: unexpected FSDP2 shard of {name} (padded data {tuple(master.shape)}, "
                        f"local {tuple(local.shape)}); is torch {torch.__version__} supported?"
                    )
                self.params.append(ManagedParam(
                    fqn=name, fsdp_param=fp, group=group, sharded=fp.sharded_param, master=master,
                ))
        if not self.params:
            raise AccoConfigError("model: fully_shard manages no parameters")
        self.process_group = self.params[0].fsdp_param.mesh_info.shard_process_group
        self.shard_rank = self.params[0].fsdp_param.mesh_info.shard_mesh_rank
        managed = {id(p.sharded) for p in self.params}
        outside = [n for n, p in root.named_parameters() if p.requires_grad and id(p) not in managed]
        if outside:
            raise AccoConfigError(
                f"model: trainable parameters outside fully_shard (ignored_params?): {outside[:5]}; their "
                "gradients would never be synchronised. Freeze them or let fully_shard manage them."
            )
        self._saved_flags: Optional[list] = None
        self._hook = None

    # ------------------------------------------------------------------ take-over
    def hold_unsharded(self) -> None:
        """Unshard once and keep FSDP2 unsharded: no collective in forward or backward from now on.

        Every compute parameter keeps its ``nn.Parameter`` object (modules and autograd
        see the same objects); :meth:`own_storage` then moves its data out of FSDP2's
        all-gather buffer, so FSDP2 freeing that buffer (on ``reshard()``, e.g. from a
        ``state_dict()`` pre-hook) never touches what the model computes with.
        """
        self._saved_flags = [
            (g, g.reduce_grads, g.all_reduce_grads, g.post_forward_mesh_info, g.reshard_after_backward)
            for g in self.groups
        ]
        self._saved_auto = [(s, s._auto_reshard_after_forward) for s in self.states]
        self.root.set_requires_gradient_sync(False)  # backward only accumulates; rounds reduce
        self.root.set_reshard_after_forward(False)
        self.root.set_reshard_after_backward(False)
        for module in self.modules:
            module.unshard()
        for p in self.params:
            p.unsharded = p.fsdp_param.unsharded_param
            p.fsdp_data = p.unsharded.data
        # A forward after someone resharded (model.state_dict() does) re-registers the compute
        # parameters before FSDP2's own pre-forward hook would all-gather the masters.
        self._hook = self.root.register_forward_pre_hook(lambda *_: self.to_unsharded(), prepend=True)

    def own_storage(self, p: ManagedParam, data: Optional[torch.Tensor]) -> None:
        """Point ``p.unsharded`` at ``data`` (a private copy when None) and free FSDP2's all-gather buffer."""
        with torch.no_grad():
            p.unsharded.data = p.unsharded.detach().clone() if data is None else data
        p.fsdp_param.free_unsharded_param()

    def to_sharded(self) -> None:
        """Register the sharded DTensor parameters (what DCP and ``get_state_dict`` expect); no collective."""
        for module in self.modules:
            module.reshard()

    def to_unsharded(self) -> None:
        """Re-register the compute parameters after :meth:`to_sharded`; no collective."""
        for g in self.groups:
            if not g.is_unsharded:
                g._to_unsharded()

    def release(self) -> None:
        """Give the model back to stock FSDP2: original buffers and flags, sharded parameters registered."""
        if self._saved_flags is None:
            return
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for p in self.params:
            if p.unsharded is not None:
                p.unsharded.grad = None
                p.unsharded.data = p.fsdp_data  # FSDP2's next unshard all-gathers the masters into it
        for g, reduce_grads, all_reduce, post_forward, after_backward in self._saved_flags:
            g.reduce_grads, g.all_reduce_grads = reduce_grads, all_reduce
            g.post_forward_mesh_info, g.reshard_after_backward = post_forward, after_backward
        for s, auto in self._saved_auto:
            s._auto_reshard_after_forward = auto
        self._saved_flags = None
        self.to_sharded()
