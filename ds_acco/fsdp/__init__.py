"""Layer 4, the FSDP2 front end: ACCO rounds for a model sharded with ``fully_shard``.

Owns the translation of FSDP2's options (mesh, mixed precision, optimizer groups)
into round-engine groups, the packing of ``fully_shard`` units into buckets, the
shard optimizer over FSDP2's DTensor parameters, DCP checkpoints, and the
``"enabled": false`` stock FSDP2 path behind the same calls. Every FSDP2 internal it
touches is in :mod:`ds_acco.fsdp._fsdp2`.

May import: layers 0-3 and torch. Never ``ds_acco.deepspeed`` or ``ds_acco.plain``.
"""

from ds_acco.fsdp._fsdp2 import TORCH_RANGE, check_torch_version
from ds_acco.fsdp.acco_fsdp import AccoFSDP, StockFSDP, acco_fully_shard

__all__ = ["AccoFSDP", "StockFSDP", "TORCH_RANGE", "acco_fully_shard", "check_torch_version"]
