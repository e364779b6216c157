"""The ``"acco"`` config block, validated before any process-group work.

Why pydantic: DeepSpeed validates its own blocks with pydantic models that forbid unknown keys
(``deepspeed/runtime/config_utils.py``). The ``"acco"`` block sits next to them in the same JSON file, so it is checked
the same way, and a typo such as ``"polcy"`` fails at start-up instead of silently training in the default mode. Errors
are re-raised as :class:`AccoConfigError` (a ``ValueError``) whose message names the field, the value and what is
allowed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ds_acco.errors import AccoConfigError

from .compare import flatten
from .blocks import AutoConfig, CheckpointConfig, PreemptionConfig, StreamingConfig, TelemetryConfig, _Block

TIMEOUT_RANGE_S = (1.0, 7 * 24 * 3600.0)  # [min, max] of acco.timeout_s, see AccoConfig.timeout_s
SCHEDULER_WARMUP = "scheduler"
"""``acco.warmup_steps`` value: sync steps for as long as the DeepSpeed scheduler warms the learning rate up."""
FASTEST = "fastest"
"""``mode``/``policy`` ``"fastest"`` is ``"auto"`` under another name: HF Trainer's Accelerate refuses every ``"auto"``
in a DeepSpeed config that it cannot fill itself (``acco.mode`` not found in kwargs), so a Trainer job writes this."""
LOCAL_BLOCKS = {"telemetry", "checkpoint", "preemption"}
"""Blocks that may differ between ranks and between a save and its resume: they change no update."""


class AccoConfig(_Block):
    """Options of the ACCO round engine; see ``docs/algorithms.md`` for the rules."""

    enabled: bool = True
    """False makes the front ends behave exactly like the stock framework."""
    mode: Literal["sync", "dpu", "acco", "auto", "streaming"] = "acco"
    """``sync``: ZeRO-1 reference, no overlap. ``dpu``: one-step delayed update.
    ``acco``: estimate/commit rounds that compensate the delay. ``auto``: measures sync
    steps, then runs ``sync`` or ``acco`` (with ``policy``), whichever is predicted to reach
    a loss sooner, and re-checks every ``auto.check_every`` steps (``"fastest"``: the same, a
    spelling HF Trainer's Accelerate lets through). ``streaming``:
    Streaming DiLoCo (``ds_acco.streaming.build``, configured by ``streaming``)."""
    policy: Literal["fixed", "adaptive", "auto"] = "fixed"
    """``fixed``: each round waits for its micro-batch quota (deterministic).
    ``adaptive``: a round ends when its communication ends; workers contribute
    however many micro-batches they finished meanwhile. ``auto`` (with ``mode: "auto"``):
    auto chooses the policy too, pricing the adaptive policy's smaller batches with the
    gradient noise scale it measures (``ds_acco.rounds.auto.noise_scale``), and may run sync or acco
    fixed at half the accumulation (acco there: ``gradient_accumulation_steps`` a multiple of 4; docs/modes.md,
    "Letting auto choose the policy too"); ``"fastest"`` is the same."""
    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps run in ``sync`` mode before overlapped rounds start. ``"scheduler"`` (DeepSpeed
    front end): as many as the config's scheduler warms the learning rate up for, resolved before this
    block is parsed (:func:`ds_acco.deepspeed.checks.resolve_scheduler_warmup`)."""
    backend: Literal["deepspeed", "fsdp"] = "deepspeed"
    """Front end the block is meant for: ``ds_acco.initialize`` (DeepSpeed) or
    ``ds_acco.fsdp`` (PyTorch FSDP2); each rejects a block meant for the other."""
    comm_dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Dtype of the gradient reduce-scatter payload (``auto``: the accumulation dtype)."""
    grad_accum_dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Dtype micro-batch gradients accumulate in (``auto``: the parameters' dtype)."""
    timeout_s: float = 600.0
    """Seconds, 1 to 604800 (7 days): the limit for one collective and for the training thread's wait on a
    round; under ``ds_acco.initialize`` also for every rank to arrive when it creates the process group
    (unless ``DEEPSPEED_TIMEOUT`` is set), so a rank that died before start-up ends its peers too."""
    max_micro_batches_per_round: Optional[int] = Field(default=None, ge=1)
    """Adaptive policy only (or ``policy: "auto"``): a worker stops to wait for the round after this many
    micro-batches. None: no cap."""
    check_finite: bool = True
    """Skip a commit on every rank when any rank's gradients hold inf/NaN."""
    comm_quantization: Literal["none", "int8"] = "none"
    """Gradient reduce-scatter of sync/dpu/acco rounds: ``int8`` sends blockwise int8
    with fp32 scales through an all-to-all and sums in fp32 on the shard's owner.
    Parameters are all-gathered as ``all_gather_quantization`` says."""
    all_gather_quantization: Literal["none", "int8_estimate", "int8"] = "none"
    """Parameter all-gather of sync/dpu/acco rounds. ``none``: every round sends the
    new parameters exactly, in the compute dtype. ``int8_estimate`` (mode ``acco``
    only): an estimate round sends its lookahead as a blockwise int8 *delta* from the
    parameters every rank already holds; commits stay exact. ``int8``: every round
    sends an int8 delta, commits included; each rank applies the same dequantised
    delta, so all replicas stay bit-identical and their distance to the fp32 master
    is one quantisation step of the last delta (the next delta carries the error)."""
    estimate_quantization: Literal["same", "int4"] = "same"
    """Mode ``acco`` (or ``auto``): what an *estimate* round puts on the wire. ``same``: what
    ``comm_quantization`` and ``all_gather_quantization`` say. ``int4``: its gradient reduce-scatter and
    its all-gather (a delta, as ``int8_estimate``) in blockwise int4, half the bytes of int8; the estimate
    only steers where the next gradients are computed, and the commit sends each rank's int4 residual on
    with its own gradients, so the commit steps on the same sum as without it (its rules stay exact)."""
    quantization_block_size: int = Field(default=256, ge=1)
    """Elements per int8 block (one fp32 scale each), for every int8 exchange."""
    error_feedback: bool = False
    """Keep each rank's int8 quantisation residual and add it to the next round's
    input (one fp32 buffer the size of the gradients per parameter group)."""
    streaming: StreamingConfig = Field(default_factory=StreamingConfig)
    """Options of ``mode: "streaming"`` (ignored by the other modes)."""
    auto: AutoConfig = Field(default_factory=AutoConfig)
    """Options of ``mode: "auto"`` (ignored by the other modes)."""
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    """Per-round measurements and their log line (local to a rank: may differ between ranks)."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """How checkpoints are written and verified (local to a rank: may differ between ranks)."""
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    """What a SIGTERM does (local to a rank: may differ between ranks)."""

    @field_validator("mode", "policy", mode="before")
    @classmethod
    def _fastest_is_auto(cls, value: Any) -> Any:
        return "auto" if value == FASTEST else value

    @field_validator("warmup_steps", mode="before")
    @classmethod
    def _unresolved_scheduler(cls, value: Any) -> Any:
        if value == SCHEDULER_WARMUP:
            raise ValueError(
                "'scheduler' (sync steps while the learning rate warms up) is read from a DeepSpeed config's "
                "scheduler block by ds_acco.initialize; this front end has no such block: allowed here, an "
                "integer >= 0 (your scheduler's warm-up steps)"
            )
        return value

    @field_validator("timeout_s")
    @classmethod
    def _timeout_range(cls, value: float) -> float:
        lo, hi = TIMEOUT_RANGE_S
        if not lo <= value <= hi:  # NaN fails too
            raise ValueError(
                f"allowed: {lo:g} <= timeout_s <= {hi:g} seconds (7 days). Below 1 s gloo cannot connect the "
                "round process group; above 7 days the limit only hides a hang (and timedelta overflows near 1e14)"
            )
        return value

    @model_validator(mode="after")
    def _combinations(self) -> "AccoConfig":
        if self.max_micro_batches_per_round is not None and self.policy == "fixed":
            raise ValueError(
                "max_micro_batches_per_round only applies to policy 'adaptive' (or 'auto') "
                f"(policy is {self.policy!r}); remove it or set policy to 'adaptive'"
            )
        if self.policy == "auto" and self.mode != "auto":
            raise ValueError(
                f"acco.policy: got 'auto' (or 'fastest') with mode {self.mode!r}; the policy is chosen only by mode "
                "'auto'. Allowed: 'fixed' or 'adaptive' (or set acco.mode to 'auto')"
            )
        if self.mode == "streaming" and self.comm_quantization != "none":
            raise ValueError(
                f"acco.comm_quantization: got {self.comm_quantization!r} with mode 'streaming'; it applies to "
                "gradient rounds (sync/dpu/acco). Streaming quantises with acco.streaming.quantize"
            )
        if self.comm_quantization == "int8" and self.comm_dtype not in ("auto", "fp32"):
            raise ValueError(
                f"acco.comm_dtype: got {self.comm_dtype!r} with comm_quantization 'int8', whose payload is int8; "
                "allowed with int8: 'auto' or 'fp32'"
            )
        if self.all_gather_quantization != "none" and self.mode == "streaming":
            raise ValueError(
                f"acco.all_gather_quantization: got {self.all_gather_quantization!r} with mode 'streaming'; it "
                "applies to gradient rounds (sync/dpu/acco). Streaming sets its all-gather with "
                "acco.streaming.all_gather_dtype"
            )
        if self.all_gather_quantization == "int8_estimate" and self.mode not in ("acco", "auto"):
            raise ValueError(
                f"acco.all_gather_quantization: got 'int8_estimate' with mode {self.mode!r}, which has no "
                "estimate rounds; allowed with sync/dpu: 'none' or 'int8'"
            )
        if self.estimate_quantization == "int4" and self.mode not in ("acco", "auto"):
            raise ValueError(
                f"acco.estimate_quantization: got 'int4' with mode {self.mode!r}, which has no estimate rounds; "
                "allowed with sync/dpu/streaming: 'same' (or set acco.mode to 'acco' or 'auto')"
            )
        quantized = self.streaming.quantize == "int8" if self.mode == "streaming" else self.comm_quantization == "int8"
        if self.error_feedback and not quantized:
            where = "acco.streaming.quantize" if self.mode == "streaming" else "acco.comm_quantization"
            raise ValueError(
                f"acco.error_feedback: got True, but {where} is not 'int8'; error feedback only applies to "
                f"int8 exchanges: set {where} to 'int8' or error_feedback to false"
            )
        return self

    def fingerprint(self) -> str:
        """A short hash of every field that must agree across ranks."""
        payload = self.model_dump(exclude=LOCAL_BLOCKS)
        # Fields added after the first release leave the hash unchanged at their defaults,
        # so round states saved before them still load.
        for key, default in _LATER_DEFAULTS.items():
            if payload.get(key) == default:
                payload.pop(key)
        if payload.get("auto", {}).get("streaming") is False:
            payload["auto"].pop("streaming")  # added later too: round states saved before it keep their hash
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def compared_fields(self) -> dict:
        """``{"acco.<field>": value}`` of every field the fingerprint covers (nested blocks dotted), so a
        mismatch can name what differs."""
        return flatten(self.model_dump(exclude=LOCAL_BLOCKS), "acco")

    def quota(self, gradient_accumulation_steps: int) -> int:
        """Micro-batches per worker per round in the fixed policy."""
        if self.mode in ("acco", "auto"):  # auto: the quota once it runs acco
            return gradient_accumulation_steps // 2
        return gradient_accumulation_steps

    def check_accumulation(self, gradient_accumulation_steps: int) -> None:
        """Reject a ``gradient_accumulation_steps`` that the mode cannot split, and the ``streaming`` mode, whose rounds
        are not gradient rounds (every front end that starts a round engine calls this first)."""
        if self.mode == "streaming":
            raise AccoConfigError(
                "acco.mode: got 'streaming'; Streaming DiLoCo runs through ds_acco.streaming.build(model, ...) "
                "or ds_acco.initialize with zero_optimization.stage 0, not the gradient round engine. "
                "Allowed here: 'sync', 'dpu', 'acco', 'auto'"
            )
        if gradient_accumulation_steps < 1:
            raise AccoConfigError(
                f"gradient_accumulation_steps: got {gradient_accumulation_steps}; must be >= 1"
            )
        if self.mode in ("acco", "auto") and gradient_accumulation_steps % 2:
            raise AccoConfigError(
                f"gradient_accumulation_steps: got {gradient_accumulation_steps}; acco.mode "
                f"{self.mode!r} {'may run' if self.mode == 'auto' else 'runs'} 'acco', which splits every "
                "optimizer step into an estimate and a commit half, so it must be even (2, 4, 6, ...)"
            )


_LATER_DEFAULTS = {
    "backend": "deepspeed",
    "comm_quantization": "none",
    "quantization_block_size": 256,
    "all_gather_quantization": "none",
    "error_feedback": False,
    "estimate_quantization": "same",
    "streaming": StreamingConfig().model_dump(),
    "auto": AutoConfig().model_dump(),
}


def _describe(error: Mapping[str, Any], prefix: str) -> str:
    where = ".".join(str(p) for p in (prefix, *error.get("loc", ())) if p != "")
    value = error.get("input")
    if error.get("type", "") == "extra_forbidden":
        return f"{where}: unknown key (value {value!r}); allowed keys: {_allowed_keys(error)}"
    return f"{where}: got {value!r}; {error.get('msg', 'invalid value')}"


def _allowed_keys(error: Mapping[str, Any]) -> str:
    loc = tuple(error.get("loc", ()))[:-1]
    model: type[BaseModel] = AccoConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return ", ".join(sorted(model.model_fields))


def parse_acco_config(block: Any, prefix: str = "acco") -> AccoConfig:
    """Validate a user's ``"acco"`` block (dict, ``AccoConfig`` or ``None``); an :class:`AccoConfigError` names
    every wrong field."""
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
