"""ds_acco: hide data-parallel communication behind computation (ACCO) in DeepSpeed and PyTorch jobs."""

from .comm_thread import AccoRoundError, AccoTimeoutError
from .config import AccoConfig, AccoConfigError, parse_acco_config
from .flat_buffer import FlatLayout, ShardedGroup, build_sharded_groups
from .round_engine import RoundEngine
from .shard_optimizer import ShardOptimizer
from .telemetry import RoundRecord, Telemetry

__version__ = "0.1.0"

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
    "parse_acco_config",
]
