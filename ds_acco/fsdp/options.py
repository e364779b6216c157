"""What a user configures the FSDP front end with, read and checked before any FSDP2 work.

Three ways in, one ``AccoConfig`` out: the ``"acco"`` block (whose ``"backend"`` must say
``"fsdp"``, so a block meant for DeepSpeed fails with the name of the right front end),
FSDP2's ``MixedPrecisionPolicy`` (its ``reduce_dtype`` becomes ``acco.grad_accum_dtype``:
FSDP2 would otherwise move each gradient into its own accumulator), and a DeepSpeed-style
JSON job file, so one file format drives either backend.

The ``"acco"`` block is the same one the DeepSpeed front end reads, plus
``"backend": "fsdp"``; what this front end refuses of it, and why, is one table
(:mod:`ds_acco.config.front_ends`) that docs/configuration.md lists. The top-level keys the FSDP front end
understands mean what they mean to DeepSpeed::

    train_micro_batch_size_per_gpu   micro-batch size (for your data loader)
    gradient_accumulation_steps      G
    gradient_clipping                clip_grad_norm
    optimizer {type, params}         AdamW, Adam (DeepSpeed's Adam is AdamW unless adam_w_mode is false), SGD
    scheduler {type, params}         WarmupLR (linear or log warm-up, then constant), WarmupDecayLR (then linear
                                     to 0 at total_num_steps)
    bf16 {enabled}                   MixedPrecisionPolicy(param_dtype=torch.bfloat16); fp32 master shards
    acco {...}                       ds_acco's block (see README)

Keys only DeepSpeed uses (``zero_optimization``, ``steps_per_print``, ...) are
listed in :attr:`FSDPJobConfig.ignored`; ``fp16`` is refused (no loss scaler here).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch import nn

from ds_acco.config import AccoConfig, parse_acco_config
from ds_acco.config.front_ends import refuse_unsupported
from ds_acco.errors import AccoConfigError
from ds_acco.numerics.dtypes import DTYPES, dtype_name

BACKENDS = ("deepspeed", "fsdp")


def split_backend(block: Any) -> tuple[str, Any]:
    """Read ``"backend"`` out of an ``"acco"`` block; return it and the block without it.

    The FSDP front end checks the key itself so its error can say which front end to
    use; the rest goes to :func:`ds_acco.parse_acco_config`. A block without the key
    means ``"deepspeed"`` (``AccoConfig.backend``'s default).
    """
    if not isinstance(block, Mapping) or "backend" not in block:
        return "deepspeed", block
    rest = dict(block)
    backend = rest.pop("backend")
    if backend not in BACKENDS:
        raise AccoConfigError(f"acco.backend: got {backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    return backend, rest


def fsdp_config(block: Any) -> AccoConfig:
    backend, rest = split_backend(block)
    if isinstance(block, Mapping) and "backend" in block and backend != "fsdp":
        raise AccoConfigError(
            f"acco.backend: got {backend!r}, but this is the FSDP front end (ds_acco.fsdp.acco_fully_shard); "
            "use ds_acco.initialize for DeepSpeed, or set acco.backend to 'fsdp'"
        )
    return refuse_unsupported("fsdp", parse_acco_config(rest))  # what it refuses, and why: ds_acco/config/front_ends.py


def translate_mp_policy(mp_policy: Any, config: AccoConfig, model: nn.Module) -> tuple[Any, AccoConfig]:
    """FSDP2's ``reduce_dtype`` becomes ``acco.grad_accum_dtype`` and FSDP2 itself gets none: it would move each
    backward's gradient out of ``param.grad`` into its own accumulator; ACCO accumulates in its round buffers."""
    if mp_policy is None or mp_policy.reduce_dtype is None:
        return mp_policy, config
    compute = mp_policy.param_dtype or next(iter(model.parameters())).dtype
    if mp_policy.reduce_dtype != compute:
        name = dtype_name(mp_policy.reduce_dtype)
        if name not in DTYPES:
            raise AccoConfigError(f"mp_policy.reduce_dtype: got {mp_policy.reduce_dtype}; allowed: fp32, bf16, fp16")
        if config.grad_accum_dtype == "auto":
            config = config.model_copy(update={"grad_accum_dtype": name})
        elif config.grad_accum_dtype != name:
            raise AccoConfigError(
                f"mp_policy.reduce_dtype ({name}) and acco.grad_accum_dtype ({config.grad_accum_dtype!r}) disagree; "
                "set one of them"
            )
    return dataclasses.replace(mp_policy, reduce_dtype=None), config


_OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
_DEEPSPEED_ONLY_OPTIMIZER_PARAMS = ("torch_adam", "adam_w_mode", "fused")
_UNDERSTOOD = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping", "optimizer",
               "scheduler", "bf16", "fp16", "acco")


@dataclass
class FSDPJobConfig:
    """What :func:`load_job_config` read; :meth:`acco_kwargs` feeds :func:`ds_acco.fsdp.acco_fully_shard`."""

    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    clip_grad_norm: float = 0.0
    optimizer_cls: type = torch.optim.AdamW
    optimizer_kwargs: dict = field(default_factory=dict)
    lr_scheduler: Optional[Callable[[torch.optim.Optimizer], Any]] = None
    mp_policy: Any = None
    acco: Optional[dict] = None
    ignored: list = field(default_factory=list)

    def acco_kwargs(self) -> dict:
        return dict(acco_config=self.acco, gradient_accumulation_steps=self.gradient_accumulation_steps,
                    mp_policy=self.mp_policy, optimizer_cls=self.optimizer_cls,
                    optimizer_kwargs=self.optimizer_kwargs, clip_grad_norm=self.clip_grad_norm,
                    lr_scheduler=self.lr_scheduler)


def _positive_int(config: Mapping, key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AccoConfigError(f"{key}: got {value!r}; allowed: an integer >= 1")
    return value


_SCHEDULERS = ("WarmupLR", "WarmupDecayLR")
_WARMUP_DEFAULT = 1000
"""``WarmupLR``'s ``warmup_num_steps`` when its block gives none (DeepSpeed's default)."""


def warmup_lr(warmup_min_lr: float = 0.0, warmup_max_lr: float = 0.001, warmup_num_steps: int = _WARMUP_DEFAULT,
              warmup_type: str = "log", total_num_steps: Optional[int] = None,
              ) -> Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR]:
    """DeepSpeed's ``WarmupLR`` (or, with ``total_num_steps``, ``WarmupDecayLR``) as a torch ``LambdaLR`` factory
    (the optimizer's lr is set to ``warmup_max_lr``).

    Like DeepSpeed, the lr is ``warmup_min_lr`` until the first step, then after step ``s``
    ``min + (max - min) * gamma(s - 1)`` with ``gamma(i) = i / W`` (linear) or
    ``log(i + 1) / log(W)`` (log) for ``i < W = max(2, warmup_num_steps)``, then ``1``, or for the decay
    ``max(0, (T - i) / max(1, T - W))``: a budget's rate falls to ``min`` at its last step.
    """
    if total_num_steps is not None and (isinstance(total_num_steps, bool) or not isinstance(total_num_steps, int)
                                        or total_num_steps < 1):
        raise AccoConfigError(f"scheduler.params.total_num_steps: got {total_num_steps!r}; allowed: an integer >= 1")
    if warmup_type not in ("linear", "log"):
        raise AccoConfigError(f"scheduler.params.warmup_type: got {warmup_type!r}; allowed: 'linear', 'log'")
    if isinstance(warmup_num_steps, bool) or not isinstance(warmup_num_steps, int) or warmup_num_steps < 1:
        raise AccoConfigError(f"scheduler.params.warmup_num_steps: got {warmup_num_steps!r}; allowed: an integer >= 1")
    if warmup_max_lr <= 0:
        raise AccoConfigError(f"scheduler.params.warmup_max_lr: got {warmup_max_lr!r}; must be > 0")
    steps = max(2, warmup_num_steps)

    def factor(step: int) -> float:
        i = step - 1
        if i < 0:
            gamma = 0.0
        elif i >= steps:
            gamma = 1.0 if total_num_steps is None else max(0.0, (total_num_steps - i)
                                                            / max(1, total_num_steps - steps))
        else:
            gamma = i / steps if warmup_type == "linear" else math.log(i + 1) / math.log(steps)
        return (warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma) / warmup_max_lr

    def build(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        for group in optimizer.param_groups:
            group.update(lr=warmup_max_lr, initial_lr=warmup_max_lr)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    return build


def load_job_config(config: Union[str, os.PathLike, Mapping[str, Any]]) -> FSDPJobConfig:
    """Read a JSON file (or dict) in DeepSpeed's format for the FSDP front end."""
    if not isinstance(config, Mapping):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    job = FSDPJobConfig(
        micro_batch_size=_positive_int(config, "train_micro_batch_size_per_gpu", 1),
        gradient_accumulation_steps=_positive_int(config, "gradient_accumulation_steps", 1),
        ignored=sorted(k for k in config if k not in _UNDERSTOOD),
    )
    clip = config.get("gradient_clipping", 0.0)
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
        raise AccoConfigError(f"gradient_clipping: got {clip!r}; allowed: a number >= 0 (0 disables it)")
    job.clip_grad_norm = float(clip)
    if (config.get("fp16") or {}).get("enabled"):
        raise AccoConfigError("fp16.enabled: not supported by the FSDP backend (no loss scaler); use bf16")
    if (config.get("bf16") or {}).get("enabled"):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        job.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    opt = config.get("optimizer") or {"type": "AdamW", "params": {}}
    kind = str(opt.get("type", "")).lower()
    if kind not in _OPTIMIZERS:
        raise AccoConfigError(f"optimizer.type: got {opt.get('type')!r}; allowed: 'AdamW', 'Adam', 'SGD'")
    params = dict(opt.get("params") or {})
    if kind == "adam" and params.get("adam_w_mode", True):
        kind = "adamw"  # DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false
    if "betas" in params:
        params["betas"] = tuple(params["betas"])
    job.optimizer_cls = _OPTIMIZERS[kind]
    job.optimizer_kwargs = {k: v for k, v in params.items() if k not in _DEEPSPEED_ONLY_OPTIMIZER_PARAMS}
    sched = config.get("scheduler")
    if sched:
        job.lr_scheduler = _scheduler(sched)
    if "acco" in config:
        backend, _ = split_backend(config["acco"])
        if isinstance(config["acco"], Mapping) and "backend" in config["acco"] and backend != "fsdp":
            raise AccoConfigError(f"acco.backend: got {backend!r}; this config is read by the FSDP front end, "
                                  "which needs 'fsdp' (the DeepSpeed front end is ds_acco.initialize)")
        job.acco = _scheduler_warmup(dict(config["acco"]), sched)
    return job


def _scheduler(sched: Mapping) -> Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LambdaLR]:
    """The ``scheduler`` block's factory; a ``total_num_steps`` decides between WarmupLR and WarmupDecayLR, so a
    block whose type and steps disagree would train at another rate than the one DeepSpeed reads from it."""
    if sched.get("type") not in _SCHEDULERS:
        raise AccoConfigError(f"scheduler.type: got {sched.get('type')!r}; the FSDP backend reads "
                              f"{', '.join(map(repr, _SCHEDULERS))} (or pass lr_scheduler= to acco_fully_shard "
                              "yourself)")
    params = dict(sched.get("params") or {})
    if (sched["type"] == "WarmupDecayLR") != ("total_num_steps" in params):
        got = "given" if "total_num_steps" in params else "missing"
        raise AccoConfigError(f"scheduler.params.total_num_steps: {got} with type {sched['type']!r}; allowed: "
                              "WarmupDecayLR with it (DeepSpeed's has no default), WarmupLR without")
    return warmup_lr(**params)


def _scheduler_warmup(block: dict, sched: Optional[Mapping]) -> dict:
    """``warmup_steps: "scheduler"`` read from the ``WarmupLR`` block, as the DeepSpeed front end reads it (one number
    in the file)."""
    if block.get("warmup_steps") != "scheduler":
        return block
    if not sched:
        raise AccoConfigError("acco.warmup_steps: got 'scheduler', but the config has no scheduler block; allowed: "
                              "'scheduler' with a WarmupLR or WarmupDecayLR block (its params.warmup_num_steps), or "
                              "an integer >= 0")
    steps = (sched.get("params") or {}).get("warmup_num_steps", _WARMUP_DEFAULT)
    return dict(block, warmup_steps=steps)
