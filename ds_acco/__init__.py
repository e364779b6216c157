"""ds_acco: hide data-parallel communication behind computation (ACCO) in DeepSpeed and PyTorch jobs."""

from ds_acco.config.schema import AccoConfig, parse_acco_config
from ds_acco.errors import AccoConfigError, AccoRoundError, AccoTimeoutError
from ds_acco.layout.flat_buffer import FlatLayout
from ds_acco.layout.sharded_group import ShardedGroup, build_sharded_groups
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.rounds.engine import RoundEngine
from ds_acco.telemetry.records import RoundRecord, Telemetry

__version__ = "0.1.0"


def initialize(*args, **kwargs):
    """``deepspeed.initialize`` with ACCO from the config's ``"acco"`` block (see ds_acco.deepspeed.initialize)."""
    from ds_acco.deepspeed.initialize import initialize as _initialize

    return _initialize(*args, **kwargs)


def patch_deepspeed() -> None:
    """Route ``deepspeed.initialize`` through :func:`initialize` so unmodified scripts get ACCO."""
    from ds_acco.deepspeed.initialize import patch_deepspeed as _patch

    _patch()


def acco_fully_shard(*args, **kwargs):
    """ACCO for a PyTorch FSDP2 (``fully_shard``) model (see ds_acco.fsdp.acco_fully_shard)."""
    from ds_acco.fsdp.api import acco_fully_shard as _acco_fully_shard

    return _acco_fully_shard(*args, **kwargs)


__all__ = [
    "AccoConfig",
    "AccoConfigError",
    "AccoRoundError",
    "AccoTimeoutError",
    "FlatLayout",
    "RoundEngine",
    "RoundRecord",
    "ShardOptimizer",
    "ShardedGroup",
    "Telemetry",
    "acco_fully_shard",
    "build_sharded_groups",
    "initialize",
    "patch_deepspeed",
    "parse_acco_config",
]
