"""Which ``"acco"`` switches a front end refuses, and why: one table that the front ends enforce at start-up and
docs/configuration.md lists (generated from it), so the page cannot promise a switch a front end refuses.

Every field not listed here means the same on every front end (DeepSpeed, FSDP2, plain PyTorch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ds_acco.errors import AccoConfigError

FRONT_ENDS = {"deepspeed": "DeepSpeed (ds_acco.initialize)", "fsdp": "FSDP2 (ds_acco.fsdp.acco_fully_shard)",
              "plain": "plain PyTorch (ds_acco.plain.build)"}


@dataclass(frozen=True)
class Refusal:
    """``acco.<field>`` set to ``value`` is refused on ``front_end`` at start-up; ``allowed`` says what is allowed
    there instead, ``why`` why (and where the switch runs)."""

    front_end: str
    field: str
    value: Any
    allowed: str
    why: str

    def applies(self, config: Any) -> bool:
        value = config
        for part in self.field.split("."):
            value = getattr(value, part)
        return value == self.value


REFUSALS: tuple[Refusal, ...] = (
    Refusal("fsdp", "mode", "streaming", "'sync', 'dpu', 'acco', 'auto'",
            "Streaming DiLoCo keeps a full replica, a full-size inner optimizer and its own fp32 shards of the "
            "global parameters on every rank: FSDP2's sharded parameters and optimizer state would sit unused, and "
            "its DCP checkpoints would not hold the run. Run it on the unwrapped model with "
            "ds_acco.streaming.build(model, ...), or with DeepSpeed at zero_optimization.stage 0"),
    Refusal("fsdp", "auto.streaming", True, "false",
            "the streaming phase twins the shard optimizer as one full-size optimizer, gathering one flat master "
            "shard and its moments per parameter group, and writes them back at every checkpoint; FSDP2's masters "
            "are per-parameter dim-0 chunks (DTensors) packed rank-major per bucket, which the phase can neither "
            "gather nor write back into the DCP shards. mode 'auto' still chooses between sync and acco here; "
            "auto.streaming runs on DeepSpeed ZeRO-1 and ds_acco.plain.build(model=...)"),
)


def refuse_unsupported(front_end: str, config: Any) -> Any:
    """Raise :class:`AccoConfigError` for the first switch of ``config`` (an ``AccoConfig``) that ``front_end``
    refuses, naming the field, the value, what is allowed there and why; else return ``config``."""
    for r in REFUSALS:
        if r.front_end == front_end and config.enabled and r.applies(config):
            raise AccoConfigError(f"acco.{r.field}: got {r.value!r} on the {FRONT_ENDS[front_end]} front end; "
                                  f"allowed there: {r.allowed}. Why: {r.why}")
    return config
