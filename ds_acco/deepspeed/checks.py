"""What the DeepSpeed front end supports, checked before any process-group work.

DeepSpeed's own config parser has already accepted the file; these checks reject combinations the ACCO engine cannot
honour, naming the field, the value and what is allowed, so a job fails at start-up instead of after hours.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from deepspeed.runtime import lr_schedules

from ds_acco.config.schema import SCHEDULER_WARMUP, AccoConfig
from ds_acco.errors import AccoConfigError

SUPPORTED_DEEPSPEED = ((0, 19, 0), (0, 20, 0))  # [min, max) checked against the installed release


def check_deepspeed_version(version: str) -> None:
    """Raise unless ``version`` is in the range whose internals the adapter was tested on."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    lo, hi = SUPPORTED_DEEPSPEED
    if not (lo <= tuple(parts) < hi):
        raise RuntimeError(
            f"ds_acco supports deepspeed >= {'.'.join(map(str, lo))}, < {'.'.join(map(str, hi))}; "
            f"found {version}. Install a supported release (pip install 'deepspeed>=0.19,<0.20') or "
            'remove the "acco" block to train with stock DeepSpeed.'
        )


def _get(cfg: Mapping[str, Any], *path: str, default: Any = None) -> Any:
    node: Any = cfg
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def check_ds_config(raw: Mapping[str, Any], acco: AccoConfig) -> None:
    """Static checks on the raw DeepSpeed config dict (before the engine is built)."""
    problems = []
    if acco.backend != "deepspeed":
        problems.append(
            f"acco.backend: got {acco.backend!r}; ds_acco.initialize builds DeepSpeed engines (backend "
            "'deepspeed'); train FSDP2 models with ds_acco.fsdp.acco_fully_shard"
        )
    stage = _get(raw, "zero_optimization", "stage", default=0)
    if acco.mode == "streaming":
        problems.extend(_streaming_problems(raw, stage))
    elif stage != 1:
        problems.append(
            f"zero_optimization.stage: got {stage!r}; ACCO shards optimizer states ZeRO-1 style and "
            "needs stage 1 (stages 0, 2 and 3 are not supported with acco.mode "
            f"{acco.mode!r}; acco.mode 'streaming' runs on stage 0)"
        )
    for key in ("offload_optimizer", "offload_param"):
        device = _get(raw, "zero_optimization", key, "device", default="none")
        if device not in (None, "none"):
            problems.append(f"zero_optimization.{key}.device: got {device!r}; ACCO supports only 'none'")
    if _get(raw, "zero_optimization", "cpu_offload", default=False):
        problems.append("zero_optimization.cpu_offload: got true; ACCO supports only false")
    if _get(raw, "zero_optimization", "zenflow") is not None:
        problems.append("zero_optimization.zenflow: ZenFlow and ACCO both replace the ZeRO step; remove one")
    if _get(raw, "hybrid_engine", "enabled", default=False):
        problems.append("hybrid_engine.enabled: got true; ACCO supports only false")
    if _get(raw, "managed_gradient_accumulation", default=True) is False:
        problems.append(
            "managed_gradient_accumulation: got false; ACCO decides round boundaries itself, "
            "remove the key or set it to true"
        )
    if _get(raw, "fp16", "enabled", default=False) and not acco.check_finite:
        problems.append("acco.check_finite: got false; fp16 loss scaling needs overflow detection, set it to true")
    G = raw.get("gradient_accumulation_steps")
    if isinstance(G, int) and not isinstance(G, bool) and acco.mode != "streaming":
        try:
            acco.check_accumulation(G)
        except AccoConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise AccoConfigError("DeepSpeed config not supported with ACCO:\n  " + "\n  ".join(problems))


def _streaming_problems(raw: Mapping[str, Any], stage: Any) -> list[str]:
    """Streaming keeps a full fp32 replica and a local inner optimizer on every rank."""
    problems = []
    if stage != 0:
        problems.append(
            f"zero_optimization.stage: got {stage!r}; acco.mode 'streaming' keeps a full replica and its own "
            "inner optimizer on every rank (only the global parameters and outer momentum are sharded, by "
            "ds_acco), so it needs stage 0: set zero_optimization.stage to 0 or remove the block"
        )
    for block in ("fp16", "bf16"):
        if _get(raw, block, "enabled", default=False):
            problems.append(
                f"{block}.enabled: got true; acco.mode 'streaming' trains fp32 replicas (DeepSpeed's {block} "
                "optimizer would keep master weights the fragment merges cannot reach). For "
                f"{'bfloat16' if block == 'bf16' else 'float16'} compute use "
                f'"torch_autocast": {{"enabled": true, "dtype": "{"bfloat16" if block == "bf16" else "float16"}"}}'
            )
    if _get(raw, "amp", "enabled", default=False):
        problems.append("amp.enabled: got true; acco.mode 'streaming' supports torch_autocast, not apex amp")
    return problems


def check_model(model: Any) -> None:
    from deepspeed.pipe import PipelineModule

    if isinstance(model, PipelineModule):
        raise AccoConfigError(
            "model: got a deepspeed PipelineModule; ACCO supports data parallelism only "
            '(no pipeline parallelism). Remove the "acco" block or pass a plain nn.Module.'
        )


def resolve_scheduler_warmup(ds_config: Any, block: Any) -> Any:
    """The ``"acco"`` block with ``warmup_steps: "scheduler"`` replaced by the scheduler's warm-up steps.

    Why: ACCO's one-step delay costs the most loss per step while the learning rate climbs (at 100 Mbit/s,
    0.93x sync low-bit's time to the loss against 0.97x for acco from step 2: BENCHMARKS.md, "Re-measured at
    100 Mbit/s"). Reading the number from the scheduler block keeps one number in the file. The default is
    DeepSpeed's own (the scheduler class's ``warmup_num_steps``), as DeepSpeed would build it.
    """
    if not isinstance(block, Mapping) or block.get("warmup_steps") != SCHEDULER_WARMUP:
        return block
    kind = _get(ds_config, "scheduler", "type")
    cls = getattr(lr_schedules, kind, None) if isinstance(kind, str) else None
    params = inspect.signature(cls.__init__).parameters if inspect.isclass(cls) else {}
    if "warmup_num_steps" not in params:
        found = "the config has no scheduler block" if kind is None else (
            f"scheduler.type is {kind!r}, which has no learning-rate warm-up")
        raise AccoConfigError(
            f"acco.warmup_steps: got 'scheduler', but {found}; allowed: 'scheduler' with a scheduler block of "
            "type WarmupLR, WarmupDecayLR or WarmupCosineLR (its params.warmup_num_steps), or an integer >= 0 "
            "(a scheduler passed to deepspeed.initialize as an object cannot be read: give its warm-up steps)"
        )
    steps = _get(ds_config, "scheduler", "params", "warmup_num_steps", default=params["warmup_num_steps"].default)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise AccoConfigError(
            f"scheduler.params.warmup_num_steps: got {steps!r}, read by acco.warmup_steps 'scheduler'; "
            "allowed: an integer >= 0"
        )
    return dict(block, warmup_steps=steps)
