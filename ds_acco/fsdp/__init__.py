"""Layer 4, the FSDP2 front end: ACCO rounds for a model sharded with ``fully_shard``.

Owns the translation of what a user configures (the ``"acco"`` block, FSDP2's mixed
precision, a DeepSpeed-style JSON job file: :mod:`~ds_acco.fsdp.options`) into an
``AccoConfig``, putting the model on a 1-D mesh (:mod:`~ds_acco.fsdp.mesh`), the optimizer
groups and the entry point (:mod:`~ds_acco.fsdp.api`), the packing of ``fully_shard`` units
into buckets (:mod:`~ds_acco.fsdp.buckets`), the two trainers behind the same calls
(:class:`AccoFSDP`, and :class:`StockFSDP` for ``"enabled": false``), the shard optimizer
over FSDP2's DTensor parameters, and DCP checkpoints (ds_acco's own, and stock FSDP2's).
Every FSDP2 internal it touches is in :mod:`ds_acco.fsdp._fsdp2`.

May import: layers 0-3 and torch. Never ``ds_acco.deepspeed`` or ``ds_acco.plain``.
"""

from ds_acco.fsdp._fsdp2 import TORCH_RANGE, check_torch_version
from ds_acco.fsdp.acco_fsdp import AccoFSDP
from ds_acco.fsdp.api import acco_fully_shard
from ds_acco.fsdp.options import load_job_config
from ds_acco.fsdp.stock_fsdp import StockFSDP

__all__ = ["AccoFSDP", "StockFSDP", "TORCH_RANGE", "acco_fully_shard", "check_torch_version", "load_job_config"]
