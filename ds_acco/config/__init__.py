"""Layer 1, config: the ``"acco"`` block, validated before any process-group work.

Owns the schema (pydantic models that forbid unknown keys, as DeepSpeed's own
blocks do), the parser that turns validation errors into messages naming the field,
the value and what is allowed, and the comparison of a saved block with this job's.

May import: ``ds_acco.errors`` and pydantic.
"""

from ds_acco.config.schema import (AccoConfig, CheckpointConfig, StreamingConfig, TelemetryConfig,
                                   check_saved_state_fits, check_writable_folder, parse_acco_config)
from ds_acco.errors import AccoConfigError

__all__ = ["AccoConfig", "AccoConfigError", "CheckpointConfig", "StreamingConfig", "TelemetryConfig",
           "check_saved_state_fits", "check_writable_folder", "parse_acco_config"]
