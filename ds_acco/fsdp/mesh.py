"""Put a model under ``fully_shard`` on a 1-D mesh, or take one the user sharded already.

ACCO keeps the model unsharded while it trains (``reshard_after_forward=False``); what
FSDP2 contributes is its sharded parameters (the master shards), its mixed precision and
its checkpointing. HSDP and other 2-D meshes are refused here, before any FSDP2 work.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist
from torch import nn

from ds_acco.errors import AccoConfigError


def device_type(group: dist.ProcessGroup) -> str:
    backend = str(dist.get_backend(group)).lower()
    for name, device in (("nccl", "cuda"), ("xccl", "xpu"), ("gloo", "cpu")):
        if name in backend:
            return device
    raise AccoConfigError(f"process_group: backend {backend!r}; pass mesh= (a 1-D DeviceMesh) instead")


def shard_model(model: nn.Module, mesh: Any, process_group: Optional[dist.ProcessGroup], mp_policy: Any) -> nn.Module:
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
    if mesh is None and process_group is None:
        mesh = init_device_mesh(device_type(dist.group.WORLD), (dist.get_world_size(),))
    elif mesh is None:
        mesh = DeviceMesh.from_group(process_group, device_type(process_group))
    if mesh.ndim != 1:
        raise AccoConfigError(f"mesh: got a {mesh.ndim}-D mesh; ds_acco.fsdp supports a 1-D data-parallel mesh only")
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy or MixedPrecisionPolicy())
    return model


