"""ds_acco: hide data-parallel communication behind computation (ACCO) in DeepSpeed and PyTorch jobs."""

from .comm_thread import AccoRoundError, AccoTimeoutError
from .config import AccoConfig, AccoConfigError, parse_acco_config
from .flat_buffer import FlatLayout, ShardedGroup, build_sharded_groups
from .round_engine import RoundEngine
from .shard_optimizer import ShardOptimizer
from .telemetry import RoundRecord, Telemetry

__version__ = "0.1.0"


def initialize(*args, **kwargs):
    """``deepspeed.initialize`` with ACCO from the config's ``"acco"`` block (see ds_acco.deepspeed_init)."""
    from .deepspeed_init import initialize as _initialize

    return _initialize(*args, **kwargs)


def patch_deepspeed() -> None:
    """Route ``deepspeed.initialize`` through :func:`initialize` so unmodified scripts get ACCO."""
    from .deepspeed_init import patch_deepspeed as _patch

    _patch()

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
    "build_sharded_groups",
    "initialize",
    "patch_deepspeed",
    "parse_acco_config",
]


def acco_fully_shard(*args, **kwargs):
    """ACCO for a PyTorch FSDP2 (``fully_shard``) model (see ds_acco.fsdp.acco_fully_shard)."""
    from .fsdp import acco_fully_shard as _acco_fully_shard

    return _acco_fully_shard(*args, **kwargs)


__all__.append("acco_fully_shard")
