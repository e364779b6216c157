"""The DeepSpeed configs a benchmark compares, generated from the ``ds_configs/`` templates.

Every config shares ``zero1_baseline.json``'s optimizer, scheduler, clipping and
ZeRO-1 block, and the benchmark's micro-batch size and accumulation steps, so the
model, data, seed, micro-batch and tokens per optimizer step are the same in every
run; only how gradients travel differs:

==================  ============================================================
``zero1``           stock DeepSpeed ZeRO-1, ``overlap_comm: false``
``zero1_overlap``   stock DeepSpeed ZeRO-1, ``overlap_comm: true`` (zero1_overlap.json)
``sync``            ds_acco ``mode: sync`` (its ZeRO-1 reference, no overlap)
``dpu``             ds_acco ``mode: dpu`` (one-step delayed update; dpu.json)
``acco_fixed``      ds_acco ``mode: acco``, ``policy: fixed`` (acco_fixed.json)
``acco_adaptive``   ds_acco ``mode: acco``, ``policy: adaptive`` (acco_adaptive.json)
``zero1_bf16``      stock DeepSpeed ZeRO-1 in bf16 (bf16 gradients and parameters
                    on the wire: the bytes of bf16 DDP; zero1_bf16.json)
``acco_bf16``       ds_acco ``mode: acco`` fixed, bf16 parameters, bf16 gradient
                    accumulation and payload (the ACCO paper's setting; acco_bf16.json
                    with ``grad_accum_dtype: "bf16"``)
``acco_bf16_fp32acc`` the same with fp32 accumulation and a bf16 payload (acco_bf16.json)
``streaming_int8``  ds_acco ``mode: streaming`` on stage 0, int8 pseudo-gradients,
                    bf16 all-gather (streaming_int8.json, :data:`STREAMING_BLOCK`)
``streaming_fp32``  the same schedule with fp32 both ways (what int8 saves)
``streaming_int8_half``  streaming_int8 at half the accumulation steps (inner steps of half the batch, the
                    same H in inner steps), twice the scheduler's steps: the batch auto with streaming
                    may run its inner steps at, by hand (does streaming at that batch beat the overlap?)
``sync_lowbit``     ds_acco ``mode: sync`` with the low-bit rounds of
                    acco_lowbit.json (int8 reduce-scatter with error feedback,
                    int8 delta all-gather): ZeRO-1 steps at ACCO's bytes
``acco_lowbit_fixed``     acco_lowbit.json (``mode: acco``, ``policy: fixed``)
``acco_lowbit_adaptive``  acco_lowbit.json with ``policy: adaptive`` and
                    acco_adaptive.json's ``max_micro_batches_per_round``
``auto_lowbit``     ds_configs/auto_lowbit.json as measured before ``policy: auto``: ``mode: auto``
                    with ``policy: fixed``, sync while the learning rate warms up
                    (``warmup_steps: "scheduler"``), a 5% delay penalty
``auto_lowbit_adaptive``  the same with ``policy: adaptive`` and acco_adaptive.json's
                    ``max_micro_batches_per_round``
``auto_lowbit_policy``  the same with ``policy: auto`` (auto also chooses fixed or adaptive,
                    pricing adaptive's smaller batches with the measured gradient noise scale)
``auto_lowbit_policy_early``  ds_configs/auto_lowbit.json as shipped until int4 estimates: ``policy:
                    auto``, choosing from the benchmark's warm-up step on (no sync steps for the
                    learning-rate warm-up), int8 estimates
``acco_lowbit_int4_fixed``  acco_lowbit_fixed with ``estimate_quantization: "int4"``: the estimate
                    round's reduce-scatter and all-gather in int4 (the commit's stay int8)
``acco_lowbit_int4_adaptive``  acco_lowbit_adaptive with the same int4 estimates
``acco_lowbit_int4_fixed_half``  acco_lowbit_int4_fixed at half the accumulation steps (rounds of a
                    quarter of them), twice the scheduler's and the sync warm-up's steps: the overlap
                    at sync_lowbit_half's batch (is the overlap worth more where the batch is smaller?)
``auto_lowbit_int4``  ds_configs/auto_lowbit.json as shipped: auto_lowbit_policy_early with int4
                    estimates (auto's acco candidates are the int4 ones, priced with the estimate's
                    byte fraction)
``auto_lowbit_int4_streaming``  ds_configs/auto_lowbit_streaming.json: auto_lowbit_int4 with
                    ``auto.streaming`` (auto may switch the job to streaming, with streaming_int8's
                    schedule and wire formats)
``acco_lowbit_lrwarm``    acco low-bit fixed whose ``warmup_steps`` (sync steps) last as long
                    as the scheduler's learning-rate warm-up: ACCO's one-step delay costs most
                    while the learning rate climbs, so those steps run sync
``sync_lowbit_half``  sync low-bit at half the accumulation steps and twice the
                    scheduler's warm-up steps: the smaller batch the adaptive policy
                    commits, as a control (is adaptive faster for its overlap or for
                    its smaller batches?)
``<config>_lr05x``, ``_lr2x``, ``_lr4x``  a config at 0.5, 2 and 4 times the peak learning rate (the optimizer's
                    ``lr`` and the scheduler's ``warmup_max_lr``; :data:`LR_SCALED`): is the rate every
                    config shares tuned, at either batch, and would the overlap prefer another one?
==================  ============================================================

The streaming configs keep the optimizer, scheduler, clipping, micro-batch and
accumulation, so an inner step sees the same tokens as a ZeRO-1 step.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE_DIR = os.path.join(REPO, "ds_configs")

CONFIGS = ("zero1", "zero1_overlap", "sync", "dpu", "acco_fixed", "acco_adaptive", "zero1_bf16", "streaming_int8",
           "streaming_fp32", "sync_lowbit", "acco_lowbit_fixed", "acco_lowbit_adaptive", "acco_bf16",
           "acco_bf16_fp32acc", "auto_lowbit", "sync_lowbit_half", "acco_lowbit_lrwarm", "auto_lowbit_adaptive",
           "auto_lowbit_policy", "auto_lowbit_policy_early", "acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive",
           "auto_lowbit_int4", "auto_lowbit_int4_streaming", "acco_lowbit_int4_fixed_half", "streaming_int8_half")
LR_SCALES = {"_lr05x": 0.5, "_lr2x": 2.0, "_lr4x": 4.0}
"""Suffixes of a config at a scaled peak learning rate, and the scale."""
LR_SCALED = tuple(base + suffix for base in ("sync_lowbit_half", "acco_lowbit_int4_fixed_half", "sync_lowbit",
                                             "acco_lowbit_int4_fixed") for suffix in LR_SCALES)
"""The learning-rate check's configs: the long runs' best-tuned sync and the overlap at its batch, and the two at the
bed's batch, each at half, twice and four times the rate all configs share (``zero1_baseline.json``'s ``lr``)."""
CONFIGS += LR_SCALED


def lr_scaled(name: str) -> Optional[tuple[str, float]]:
    """``(base config, scale)`` of a config at a scaled learning rate (:data:`LR_SCALES`), else None."""
    for suffix, scale in LR_SCALES.items():
        if name.endswith(suffix):
            return name[:-len(suffix)], scale
    return None


HALF_BATCH = ("sync_lowbit_half", "acco_lowbit_int4_fixed_half", "torchft_diloco_half", "streaming_int8_half")
HALF_BATCH += tuple(c for c in LR_SCALED if lr_scaled(c)[0] in HALF_BATCH)
"""Configs at half the accumulation steps, with twice the scheduler's steps: the same tokens."""
STOCK = ("zero1", "zero1_overlap", "zero1_bf16")
STREAMING_COMPARISON = ("zero1", "zero1_bf16", "acco_fixed", "streaming_int8", "streaming_fp32")
"""The configs of the sweep part ``streaming`` (not in the default bandwidth comparison)."""
DEFAULT_CONFIGS = ("zero1", "zero1_overlap", "sync", "dpu", "acco_fixed", "acco_adaptive")
TIME_TO_LOSS = ("zero1", "sync", "zero1_bf16", "sync_lowbit", "sync_lowbit_half", "dpu", "acco_fixed",
                "acco_adaptive", "acco_lowbit_fixed", "acco_lowbit_adaptive", "auto_lowbit", "streaming_int8")
"""The configs of the sweep part ``time_to_loss`` (seconds to ZeRO-1's final validation loss)."""
"""What ``--configs`` means when not given, for every part but ``streaming``."""
STREAMING_BLOCK = {"fragments": 4, "sync_every": 40, "overlap_steps": 2, "alpha": 0.5, "outer_lr": 0.7,
                   "outer_momentum": 0.9}
"""H = 40 inner steps per fragment, P = 4: a fragment round every 10 inner steps, merged 2 steps later."""
LABELS = {
    "zero1": "DeepSpeed ZeRO-1",
    "zero1_overlap": "DeepSpeed ZeRO-1 overlap_comm",
    "sync": "ds_acco sync",
    "dpu": "ds_acco dpu",
    "acco_fixed": "ds_acco acco fixed",
    "acco_adaptive": "ds_acco acco adaptive",
    "zero1_bf16": "DeepSpeed ZeRO-1 bf16",
    "streaming_int8": "ds_acco streaming int8",
    "streaming_fp32": "ds_acco streaming fp32",
    "streaming_int8_half": "ds_acco streaming int8, half batch",
    "sync_lowbit": "ds_acco sync low-bit",
    "acco_lowbit_fixed": "ds_acco acco low-bit fixed",
    "acco_lowbit_adaptive": "ds_acco acco low-bit adaptive",
    "acco_bf16": "ds_acco acco bf16 (bf16 accumulation)",
    "acco_bf16_fp32acc": "ds_acco acco bf16 (fp32 accumulation)",
    "auto_lowbit": "ds_acco auto low-bit",
    "auto_lowbit_adaptive": "ds_acco auto low-bit, adaptive policy",
    "auto_lowbit_policy": "ds_acco auto low-bit, policy auto",
    "auto_lowbit_policy_early": "ds_acco auto low-bit, policy auto, no LR warm-up in sync",
    "sync_lowbit_half": "ds_acco sync low-bit, half batch",
    "acco_lowbit_lrwarm": "ds_acco acco low-bit fixed, sync while the LR warms up",
    "acco_lowbit_int4_fixed": "ds_acco acco low-bit fixed, int4 estimates",
    "acco_lowbit_int4_adaptive": "ds_acco acco low-bit adaptive, int4 estimates",
    "acco_lowbit_int4_fixed_half": "ds_acco acco low-bit fixed, int4 estimates, half batch",
    "auto_lowbit_int4": "ds_acco auto low-bit, policy auto, int4 estimates",
    "auto_lowbit_int4_streaming": "ds_acco auto low-bit, int4 estimates, may switch to streaming",
}
LABELS.update({c: f"{LABELS[base]}, {scale:g}x the learning rate" for c in LR_SCALED
               for base, scale in [lr_scaled(c)]})
_ACCO_TEMPLATE = {"sync": "acco_fixed.json", "dpu": "dpu.json", "acco_fixed": "acco_fixed.json",
                  "acco_adaptive": "acco_adaptive.json", "sync_lowbit": "acco_lowbit.json",
                  "acco_lowbit_fixed": "acco_lowbit.json", "acco_lowbit_adaptive": "acco_lowbit.json",
                  "acco_bf16": "acco_bf16.json", "acco_bf16_fp32acc": "acco_bf16.json",
                  "auto_lowbit": "auto_lowbit.json", "sync_lowbit_half": "acco_lowbit.json",
                  "acco_lowbit_lrwarm": "acco_lowbit.json", "auto_lowbit_adaptive": "auto_lowbit.json",
                  "auto_lowbit_policy": "auto_lowbit.json", "auto_lowbit_policy_early": "auto_lowbit.json",
                  "acco_lowbit_int4_fixed": "acco_lowbit.json", "acco_lowbit_int4_adaptive": "acco_lowbit.json",
                  "acco_lowbit_int4_fixed_half": "acco_lowbit.json",
                  "auto_lowbit_int4": "auto_lowbit.json", "auto_lowbit_int4_streaming": "auto_lowbit_streaming.json"}


def _load(name: str, template_dir: str) -> dict:
    with open(os.path.join(template_dir, name), encoding="utf-8") as f:
        return json.load(f)


def make_config(name: str, *, micro_batch: int, grad_accum: int, warmup_steps: Optional[int] = None,
                telemetry_jsonl: Optional[str] = None, max_micro_batches_per_round: Optional[int] = None,
                streaming_sync_every: Optional[int] = None, template_dir: str = TEMPLATE_DIR,
                lr_schedule: Optional[str] = None, lr_total_steps: Optional[int] = None) -> dict:
    """The DeepSpeed config dict of benchmark config ``name`` (one of :data:`CONFIGS`).

    Args:
        micro_batch: ``train_micro_batch_size_per_gpu``.
        grad_accum: ``gradient_accumulation_steps`` (even, for acco fixed).
        warmup_steps: ``acco.warmup_steps`` (None: the template's).
        telemetry_jsonl: ``acco.telemetry.jsonl_path`` (one record per round per rank).
        max_micro_batches_per_round: adaptive cap (None: the template's).
        streaming_sync_every: streaming ``H`` (None: :data:`STREAMING_BLOCK`'s); ``overlap_steps``
            drops to 0 when ``H / P`` leaves no room for it.
        lr_schedule: None or ``""``: the template's scheduler, untouched; ``decay`` or ``cosine``:
            :func:`decayed_scheduler` over ``lr_total_steps`` nominal steps (a config at half the batch,
            ``sync_lowbit_half``, gets twice the steps: the same tokens).

    Raises:
        ValueError: unknown name or a bad number.
    """
    if name not in CONFIGS:
        raise ValueError(f"config: got {name!r}; allowed: {', '.join(CONFIGS)}")
    scaled = lr_scaled(name)
    if scaled is not None:
        cfg = make_config(scaled[0], micro_batch=micro_batch, grad_accum=grad_accum, warmup_steps=warmup_steps,
                          telemetry_jsonl=telemetry_jsonl, max_micro_batches_per_round=max_micro_batches_per_round,
                          streaming_sync_every=streaming_sync_every, template_dir=template_dir,
                          lr_schedule=lr_schedule, lr_total_steps=lr_total_steps)
        cfg["optimizer"]["params"]["lr"] *= scaled[1]
        params = cfg["scheduler"]["params"]
        for key in ("warmup_min_lr", "warmup_max_lr"):  # (WarmupCosineLR's are ratios of the optimizer's)
            if key in params:
                params[key] *= scaled[1]
        return cfg
    for field, value in (("micro_batch", micro_batch), ("grad_accum", grad_accum)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}: got {value!r}; allowed: an integer >= 1")
    cfg = _load("zero1_baseline.json", template_dir)
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["gradient_accumulation_steps"] = grad_accum
    cfg.pop("train_batch_size", None)
    cfg["steps_per_print"] = 10 ** 9  # keep DeepSpeed's periodic prints out of the logs
    if lr_schedule:
        cfg["scheduler"] = decayed_scheduler(cfg["scheduler"], lr_schedule, lr_total_steps)
    if name == "zero1_overlap":
        cfg["zero_optimization"] = copy.deepcopy(_load("zero1_overlap.json", template_dir)["zero_optimization"])
    if name in ("zero1_bf16", "acco_bf16", "acco_bf16_fp32acc"):
        cfg["bf16"] = copy.deepcopy(_load("zero1_bf16.json", template_dir)["bf16"])
    if name.startswith("streaming"):
        template = _load("streaming_int8.json", template_dir)
        cfg["zero_optimization"] = copy.deepcopy(template["zero_optimization"])
        acco = copy.deepcopy(template["acco"])
        acco["streaming"].update(STREAMING_BLOCK)
        block = acco["streaming"]
        if streaming_sync_every is not None:
            block["sync_every"] = streaming_sync_every
            if block["overlap_steps"] * block["fragments"] >= streaming_sync_every:
                block["overlap_steps"] = 0
        if name == "streaming_fp32":
            acco["streaming"].update(quantize="none", all_gather_dtype="fp32")
        if name in HALF_BATCH:
            _halve(cfg)
        acco["telemetry"] = dict(acco.get("telemetry", {}), log_every=0,
                                 **({"jsonl_path": telemetry_jsonl} if telemetry_jsonl else {}))
        cfg["acco"] = acco
    if name in _ACCO_TEMPLATE:
        acco = copy.deepcopy(_load(_ACCO_TEMPLATE[name], template_dir)["acco"])
        if name == "acco_bf16":
            acco.update(grad_accum_dtype="bf16", comm_dtype="bf16")
        if name in ("sync", "sync_lowbit", "sync_lowbit_half"):
            acco["mode"] = "sync"
            acco.pop("max_micro_batches_per_round", None)
        if name in HALF_BATCH:
            if name == "acco_lowbit_int4_fixed_half" and grad_accum % 4:
                raise ValueError(f"grad_accum: got {grad_accum} for {name}; allowed: a multiple of 4 (acco fixed "
                                 "at half the accumulation needs an even count per round)")
            _halve(cfg)
        if name == "auto_lowbit":
            acco.update(mode="auto", policy="fixed")
            acco.pop("max_micro_batches_per_round", None)
        if name in ("auto_lowbit", "auto_lowbit_adaptive", "auto_lowbit_policy"):
            acco["warmup_steps"] = "scheduler"  # as these were measured; the preset now starts choosing at step 2
        acco["estimate_quantization"] = "int4" if "int4" in name else "same"  # the preset's int4 is auto_lowbit_int4
        if name in ("acco_lowbit_adaptive", "auto_lowbit_adaptive", "auto_lowbit_policy", "auto_lowbit_policy_early",
                    "acco_lowbit_int4_adaptive", "auto_lowbit_int4", "auto_lowbit_int4_streaming"):
            acco["policy"] = "adaptive" if "adaptive" in name else "auto"  # the preset's own, or adaptive
            acco["max_micro_batches_per_round"] = _load("acco_adaptive.json", template_dir)["acco"][
                "max_micro_batches_per_round"]
        if warmup_steps is not None and acco.get("warmup_steps") != "scheduler":  # a preset's "scheduler" stays
            acco["warmup_steps"] = warmup_steps * (2 if name == "acco_lowbit_int4_fixed_half" else 1)  # same tokens
        if "streaming" in acco and streaming_sync_every is not None:  # the phase auto may switch to
            acco["streaming"]["sync_every"] = streaming_sync_every
            if acco["streaming"]["overlap_steps"] * acco["streaming"]["fragments"] >= streaming_sync_every:
                acco["streaming"]["overlap_steps"] = 0
        if name == "acco_lowbit_lrwarm":
            acco["warmup_steps"] = "scheduler"  # sync for the scheduler's warm-up (ds_acco.deepspeed.checks)
        _cap_commits(acco, max_micro_batches_per_round)
        telemetry = dict(acco.get("telemetry", {}))
        telemetry["log_every"] = 0
        if telemetry_jsonl:
            telemetry["jsonl_path"] = telemetry_jsonl
        acco["telemetry"] = telemetry
        cfg["acco"] = acco
    return cfg


def _halve(cfg: dict) -> None:
    """Half the accumulation steps and twice the scheduler's steps: the same warm-up and decay in tokens."""
    cfg["gradient_accumulation_steps"] = max(1, cfg["gradient_accumulation_steps"] // 2)
    cfg["scheduler"]["params"]["warmup_num_steps"] *= 2
    if "total_num_steps" in cfg["scheduler"]["params"]:
        cfg["scheduler"]["params"]["total_num_steps"] *= 2


LR_SCHEDULES = ("decay", "cosine")
"""The decayed schedules :func:`make_config` can put in place of the templates' constant rate after warm-up."""
COSINE_MIN_RATIO = 0.1
"""Where ``cosine`` ends, as a fraction of the peak rate (LLM pre-training's usual floor); ``decay`` ends at 0."""


def decayed_scheduler(scheduler: dict, kind: str, total_steps: Optional[int]) -> dict:
    """The template's WarmupLR block with the same warm-up, then a decay that ends at ``total_steps``.

    Why here and not in the templates: the comparison must decay every config at once, over the sweep's own
    budget. DeepSpeed steps it once per optimizer step; ds_acco once per commit, or, under the adaptive and auto
    policies, by committed tokens (:mod:`ds_acco.optim.lr_schedule`), so it ends at the same token count in every
    config whose step holds ``grad_accum`` micro-batches per worker.
    """
    if kind not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule: got {kind!r}; allowed: '', {', '.join(LR_SCHEDULES)}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"lr_total_steps: got {total_steps!r}; allowed: an integer >= 1 with lr_schedule {kind!r}")
    p = scheduler["params"]
    if kind == "decay":
        return {"type": "WarmupDecayLR", "params": dict(p, total_num_steps=total_steps)}
    return {"type": "WarmupCosineLR", "params": {  # a ratio of the optimizer's rate, which is warmup_max_lr
        "total_num_steps": total_steps, "warmup_min_ratio": p["warmup_min_lr"] / p["warmup_max_lr"],
        "warmup_num_steps": p["warmup_num_steps"], "cos_min_ratio": COSINE_MIN_RATIO, "warmup_type": p["warmup_type"]}}


def validate(cfg: dict) -> None:
    """Check the ``"acco"`` block the way ds_acco will at start-up (raises AccoConfigError)."""
    if "acco" in cfg:
        from ds_acco.deepspeed.initialize import acco_config_of

        acco_config_of(config=cfg)


FSDP_CONFIGS = ("fsdp_stock", "fsdp_sync", "fsdp_dpu", "fsdp_acco_fixed", "fsdp_acco_adaptive", "fsdp_sync_lowbit",
                "fsdp_acco_fixed_lowbit", "fsdp_acco_adaptive_lowbit", "fsdp_auto")
"""The FSDP2 front end against stock FSDP2 (``examples.train_lm_fsdp --shard-blocks``, ds_configs/fsdp_acco.json); the
low-bit ones carry the DeepSpeed low-bit configs' blocks (``sync_lowbit``, ``acco_lowbit_int4_fixed``,
``acco_lowbit_int4_adaptive``), ``fsdp_auto`` ds_configs/fsdp_auto_lowbit.json's (auto_lowbit.json's, backend fsdp).
Streaming is refused on FSDP2 (ds_acco.config.front_ends), so no FSDP config streams."""
FSDP_TIME_TO_LOSS = ("fsdp_stock", "fsdp_sync", "fsdp_sync_lowbit", "fsdp_acco_fixed_lowbit",
                     "fsdp_acco_adaptive_lowbit", "fsdp_auto")
"""The configs of the sweep part ``fsdp_time_to_loss``."""
FSDP_LABELS = {"fsdp_stock": "stock FSDP2", "fsdp_sync": "ds_acco-FSDP sync", "fsdp_dpu": "ds_acco-FSDP dpu",
               "fsdp_acco_fixed": "ds_acco-FSDP acco fixed", "fsdp_acco_adaptive": "ds_acco-FSDP acco adaptive",
               "fsdp_sync_lowbit": "ds_acco-FSDP sync low-bit",
               "fsdp_acco_fixed_lowbit": "ds_acco-FSDP acco low-bit fixed, int4 estimates",
               "fsdp_acco_adaptive_lowbit": "ds_acco-FSDP acco low-bit adaptive, int4 estimates",
               "fsdp_auto": "ds_acco-FSDP auto low-bit (fsdp_auto_lowbit.json)"}
LABELS.update(FSDP_LABELS)
_FSDP_LOWBIT = {"fsdp_sync_lowbit": "sync_lowbit", "fsdp_acco_fixed_lowbit": "acco_lowbit_int4_fixed",
                "fsdp_acco_adaptive_lowbit": "acco_lowbit_int4_adaptive"}


def _cap_commits(acco: dict, max_micro_batches_per_round: Optional[int]) -> None:
    """A workload's adaptive cap, in an ``acco`` block whose policy has one (adaptive, auto); None: the block's."""
    if max_micro_batches_per_round is not None and acco.get("policy") in ("adaptive", "auto"):
        acco["max_micro_batches_per_round"] = max_micro_batches_per_round


def make_fsdp_config(name: str, template_dir: str = TEMPLATE_DIR, lr_schedule: Optional[str] = None,
                     lr_total_steps: Optional[int] = None, micro_batch: Optional[int] = None,
                     grad_accum: Optional[int] = None, max_micro_batches_per_round: Optional[int] = None) -> dict:
    """The job config of FSDP benchmark config ``name`` (one of :data:`FSDP_CONFIGS`): fsdp_acco.json with
    only the gradient path changed; ``lr_schedule``: as :func:`make_config`'s (the FSDP front end reads
    WarmupDecayLR too); ``micro_batch``, ``grad_accum``: the workload's (None: the template's), which a token
    budget is counted in; ``max_micro_batches_per_round``: the adaptive cap (None: the config's own)."""
    block = {"backend": "fsdp", "warmup_steps": 2, "telemetry": {"log_every": 0}}
    kind = name.removeprefix("fsdp_")
    if kind == "stock":
        block["enabled"] = False
    elif kind in ("sync", "dpu"):
        block["mode"] = kind
    elif kind == "acco_fixed":
        block.update(mode="acco", policy="fixed")
    elif kind == "acco_adaptive":
        block.update(mode="acco", policy="adaptive", max_micro_batches_per_round=16)
    elif name in _FSDP_LOWBIT:  # the DeepSpeed config's block, so both front ends run the same rounds
        ds = make_config(_FSDP_LOWBIT[name], micro_batch=4, grad_accum=4, template_dir=template_dir)["acco"]
        block = dict(ds, backend="fsdp", telemetry={"log_every": 0})
    elif kind == "auto":
        block = dict(_load("fsdp_auto_lowbit.json", template_dir)["acco"], telemetry={"log_every": 0})
    else:
        raise ValueError(f"config: got {name!r}; allowed: {', '.join(FSDP_CONFIGS)}")
    _cap_commits(block, max_micro_batches_per_round)
    cfg = _load("fsdp_acco.json", template_dir)
    cfg["acco"] = block
    cfg["train_micro_batch_size_per_gpu"] = micro_batch or cfg["train_micro_batch_size_per_gpu"]
    cfg["gradient_accumulation_steps"] = grad_accum or cfg["gradient_accumulation_steps"]
    if lr_schedule:
        cfg["scheduler"] = decayed_scheduler(cfg["scheduler"], lr_schedule, lr_total_steps)
    return cfg


TORCHFT_CONFIGS = ("torchft_diloco", "torchft_streaming_diloco", "torchft_diloco_half")
"""The external peer: torchft 0.2.0's DiLoCo and Streaming DiLoCo (``examples/train_lm_torchft.py``), on zero1's
model, data, inner optimizer, schedule, clipping and batch, with :data:`STREAMING_BLOCK`'s H, fragments, overlap
and mixing where torchft has the same knob; ``torchft_diloco_half``: DiLoCo at half the accumulation steps (twice
the scheduler's steps, H in inner steps as ever), the peer at the batch auto may stream at."""
TORCHFT_LABELS = {"torchft_diloco": "torchft DiLoCo", "torchft_streaming_diloco": "torchft Streaming DiLoCo",
                  "torchft_diloco_half": "torchft DiLoCo, half batch"}
LABELS.update(TORCHFT_LABELS)
TORCHFT_SOURCES = {
    "outer_optimizer": "torchft's DiLoCo example and tests (torchft/_test/diloco_trainer.py): SGD lr 0.7, momentum "
                       "0.9, nesterov; = STREAMING_BLOCK's outer_lr and outer_momentum",
    "sync_every": "STREAMING_BLOCK sync_every (H); torchft syncs one fragment every H / fragments inner steps",
    "fragments": "STREAMING_BLOCK fragments (Streaming DiLoCo); 1 for DiLoCo",
    "fragment_sync_delay": "STREAMING_BLOCK overlap_steps (tau); 0 for DiLoCo, and 0 where tau * fragments >= H, "
                           "as ds_acco's make_config drops it",
    "fragment_update_alpha": "STREAMING_BLOCK alpha (theta_i <- alpha theta_i + (1 - alpha) theta_g, torchft's "
                             "lerp); torchft's default 0.0 (the global model) for DiLoCo",
    "use_bucketization": "torchft's default (one all-reduce per parameter tensor)",
    "should_quantize": "torchft's default; its fp8 quantisation needs triton and a GPU, so fp32 travels on CPU",
    "timeouts": "ours: long enough for a whole-model fp32 all-reduce at 10 Mbit/s and a half-speed host's quorum",
}


def make_torchft_config(name: str, base: dict, sync_every: Optional[int] = None) -> dict:
    """``base`` (zero1's DeepSpeed config: optimizer, scheduler, clipping, batch) with the ``"torchft"`` block of
    torchft config ``name`` (one of :data:`TORCHFT_CONFIGS`); ``sync_every``: H instead of STREAMING_BLOCK's.

    Raises:
        ValueError: unknown name, or an H that the fragments do not divide (torchft requires it).
    """
    if name not in TORCHFT_CONFIGS:
        raise ValueError(f"config: got {name!r}; allowed: {', '.join(TORCHFT_CONFIGS)}")
    h = STREAMING_BLOCK["sync_every"] if sync_every is None else sync_every
    streaming = name.removesuffix("_half") == "torchft_streaming_diloco"
    fragments = STREAMING_BLOCK["fragments"] if streaming else 1
    delay = STREAMING_BLOCK["overlap_steps"] if streaming else 0
    if isinstance(h, bool) or not isinstance(h, int) or h < fragments or h % fragments:
        raise ValueError(f"sync_every: got {h!r}; allowed: a multiple of the {fragments} fragment(s) (torchft)")
    if delay * fragments >= h:
        delay = 0
    cfg = copy.deepcopy(base)
    cfg.pop("acco", None)
    if name in HALF_BATCH:
        _halve(cfg)
    cfg["torchft"] = {
        "algorithm": "streaming_diloco" if streaming else "diloco", "sync_every": h, "fragments": fragments,
        "fragment_sync_delay": delay, "fragment_update_alpha": STREAMING_BLOCK["alpha"] if streaming else 0.0,
        "outer_optimizer": {"type": "SGD", "lr": STREAMING_BLOCK["outer_lr"],
                            "momentum": STREAMING_BLOCK["outer_momentum"], "nesterov": True},
        "use_bucketization": False, "bucket_cap_mb": None, "should_quantize": False,
        "timeout_s": 600, "quorum_timeout_s": 1800, "join_timeout_ms": 60000, "quorum_tick_ms": 100,
        "sources": TORCHFT_SOURCES}
    return cfg
