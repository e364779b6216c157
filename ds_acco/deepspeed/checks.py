"""What the DeepSpeed front end supports, checked before any process-group work.

DeepSpeed's own config parser has already accepted the file; these checks
reject combinations the ACCO engine cannot honour, naming the field, the value
and what is allowed, so a job fails at start-up instead of after hours.
"""

from __future__ import annotations

from typing import Any, Mapping

from ds_acco.config.schema import AccoConfig
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
