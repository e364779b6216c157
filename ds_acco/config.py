"""The ``"acco"`` config block, validated before any process-group work.

Why pydantic: DeepSpeed validates its own blocks with pydantic models that forbid
unknown keys (``deepspeed/runtime/config_utils.py``). The ``"acco"`` block sits
next to them in the same JSON file, so it is checked the same way, and a typo
such as ``"polcy"`` fails at start-up instead of silently training in the
default mode. Errors are re-raised as :class:`AccoConfigError` (a ``ValueError``)
whose message names the field, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MODES = ("sync", "dpu", "acco")
POLICIES = ("fixed", "adaptive")
DTYPE_NAMES = ("auto", "fp32", "bf16", "fp16")


class AccoConfigError(ValueError):
    """A value in the ``"acco"`` block is wrong; the message says which and why."""


class _Block(BaseModel):
    # strict: a JSON config says true/false and numbers; "3" or 0.0 for a flag is a mistake, not a value
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class TelemetryConfig(_Block):
    """Per-round measurements (compute, wait, round time, bytes, counts)."""

    enabled: bool = True
    """Record one :class:`ds_acco.telemetry.RoundRecord` per round."""
    log_every: int = Field(default=0, ge=0)
    """Log a summary line every this many commits on rank 0 (0: never)."""
    jsonl_path: Optional[str] = None
    """If set, every rank appends its round records to ``<jsonl_path>.rank<r>``."""
    keep_last: int = Field(default=10_000, ge=1)
    """How many round records stay in memory; older ones are dropped (sums are kept)."""


class AccoConfig(_Block):
    """Options of the ACCO round engine; see ``shared/ALGORITHMS.md`` for the rules."""

    enabled: bool = True
    """False makes the front ends behave exactly like the stock framework."""
    mode: Literal["sync", "dpu", "acco"] = "acco"
    """``sync``: ZeRO-1 reference, no overlap. ``dpu``: one-step delayed update.
    ``acco``: estimate/commit rounds that compensate the delay."""
    policy: Literal["fixed", "adaptive"] = "fixed"
    """``fixed``: each round waits for its micro-batch quota (deterministic).
    ``adaptive``: a round ends when its communication ends; workers contribute
    however many micro-batches they finished meanwhile."""
    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps run in ``sync`` mode before overlapped rounds start."""
    comm_dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Dtype of the gradient reduce-scatter payload (``auto``: the accumulation dtype)."""
    grad_accum_dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Dtype micro-batch gradients accumulate in (``auto``: the parameters' dtype)."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Limit for one collective and for the training thread's wait on a round."""
    max_micro_batches_per_round: Optional[int] = Field(default=None, ge=1)
    """Adaptive policy only: a worker stops to wait for the round after this many."""
    check_finite: bool = True
    """Skip a commit on every rank when any rank's gradients hold inf/NaN."""
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @model_validator(mode="after")
    def _combinations(self) -> "AccoConfig":
        if self.max_micro_batches_per_round is not None and self.policy != "adaptive":
            raise ValueError(
                "max_micro_batches_per_round only applies to policy 'adaptive' "
                f"(policy is {self.policy!r}); remove it or set policy to 'adaptive'"
            )
        return self

    def fingerprint(self) -> str:
        """A short hash of every field that must agree across ranks."""
        payload = self.model_dump(exclude={"telemetry"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def quota(self, gradient_accumulation_steps: int) -> int:
        """Micro-batches per worker per round in the fixed policy."""
        if self.mode == "acco":
            return gradient_accumulation_steps // 2
        return gradient_accumulation_steps

    def check_accumulation(self, gradient_accumulation_steps: int) -> None:
        """Reject a ``gradient_accumulation_steps`` that the mode cannot split."""
        if gradient_accumulation_steps < 1:
            raise AccoConfigError(
                f"gradient_accumulation_steps: got {gradient_accumulation_steps}; must be >= 1"
            )
        if self.mode == "acco" and gradient_accumulation_steps % 2:
            raise AccoConfigError(
                f"gradient_accumulation_steps: got {gradient_accumulation_steps}; acco.mode "
                "'acco' splits every optimizer step into an estimate and a commit half, so it "
                "must be even (2, 4, 6, ...)"
            )


def _describe(error: Mapping[str, Any], prefix: str) -> str:
    where = ".".join(str(p) for p in (prefix, *error.get("loc", ())) if p != "")
    kind = error.get("type", "")
    value = error.get("input")
    if kind == "extra_forbidden":
        return f"{where}: unknown key (value {value!r}); allowed keys: {_allowed_keys(error, prefix)}"
    msg = error.get("msg", "invalid value")
    return f"{where}: got {value!r}; {msg}"


def _allowed_keys(error: Mapping[str, Any], prefix: str) -> str:
    loc = tuple(error.get("loc", ()))[:-1]
    model: type[BaseModel] = AccoConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return ", ".join(sorted(model.model_fields))


def parse_acco_config(block: Any, prefix: str = "acco") -> AccoConfig:
    """Validate a user's ``"acco"`` block (dict, ``AccoConfig`` or ``None``).

    Raises:
        AccoConfigError: naming every wrong field, its value and what is allowed.
    """
    if isinstance(block, AccoConfig):
        return block
    if block is None:
        return AccoConfig(enabled=False)
    if not isinstance(block, Mapping):
        raise AccoConfigError(
            f"{prefix}: got {type(block).__name__} {block!r}; expected a JSON object such as "
            '{"mode": "acco", "policy": "fixed"}'
        )
    try:
        return AccoConfig.model_validate(dict(block))
    except ValidationError as exc:
        lines = [_describe(e, prefix) for e in exc.errors()]
        raise AccoConfigError("invalid acco config:\n  " + "\n  ".join(lines)) from None
