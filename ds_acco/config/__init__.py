"""Layer 1, config: the ``"acco"`` block, validated before any process-group work.

Owns the schema (pydantic models that forbid unknown keys, as DeepSpeed's own blocks do: the nested blocks in
:mod:`~ds_acco.config.blocks`, the top level in :mod:`~ds_acco.config.schema`), the parser that turns validation errors
into messages naming the field, the value and what is allowed, and the comparison of a saved or a peer's block with this
job's (:mod:`~ds_acco.config.compare`).

May import: ``ds_acco.errors`` and pydantic.
"""

from ds_acco.config.blocks import (AutoConfig, CheckpointConfig, PreemptionConfig, StreamingConfig, TelemetryConfig,
                                   check_writable_folder)
from ds_acco.config.compare import check_saved_state_fits, no_preemption_dir
from ds_acco.config.schema import AccoConfig, parse_acco_config
from ds_acco.errors import AccoConfigError

__all__ = ["AccoConfig", "AutoConfig", "AccoConfigError", "CheckpointConfig", "PreemptionConfig", "StreamingConfig",
           "TelemetryConfig", "check_saved_state_fits", "check_writable_folder", "no_preemption_dir",
           "parse_acco_config"]
