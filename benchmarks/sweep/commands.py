"""The command lines a sweep run is launched with, and its run folder with its config.

Shared by the runner (one launch per run) and :mod:`benchmarks.sweep.shared_launch` (the smoke sweep's runs in
one launch); a module of its own so that neither imports the other's module back.
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.cluster.units import parse_rate

from . import configs as cfgs
from .specs import RunSpec, Workload

REPO = cfgs.REPO
LAUNCHER = os.path.join(REPO, "launchers", "local_cluster.py")



def fsdp_args(wl: Workload, config_path: str, run_dir: str) -> list[str]:
    return ["--config", config_path, "--shard-blocks", "--model-size", wl.model_size, "--steps", str(wl.steps),
            "--seq-len", str(wl.seq_len), "--eval-every", str(wl.eval_every), "--eval-batches", str(wl.eval_batches),
            "--seed", str(wl.seed), "--compute-delay-ms", wl.compute_delay_ms, "--log-every", "0",
            "--max-tokens", str(wl.max_tokens), "--eval-every-tokens", str(wl.eval_every_tokens),
            "--metrics-out", run_dir]


def train_args(wl: Workload, config_path: str, run_dir: str) -> list[str]:
    return ["--deepspeed_config", config_path, "--model-size", wl.model_size, "--seq-len", str(wl.seq_len),
            "--steps", str(wl.steps), "--eval-every", str(wl.eval_every), "--eval-batches", str(wl.eval_batches),
            "--seed", str(wl.seed), "--compute-delay-ms", wl.compute_delay_ms,
            "--max-tokens", str(wl.max_tokens), "--eval-every-tokens", str(wl.eval_every_tokens),
            "--log-jsonl", os.path.join(run_dir, "train.jsonl"), "--no-progress"]


def torchft_args(wl: Workload, config_path: str, run_dir: str) -> list[str]:
    """``examples.train_lm_torchft``: train_lm's workload options, per-rank records in the run folder."""
    return ["--config", config_path, "--model-size", wl.model_size, "--seq-len", str(wl.seq_len),
            "--steps", str(wl.steps), "--eval-every", str(wl.eval_every), "--eval-batches", str(wl.eval_batches),
            "--seed", str(wl.seed), "--compute-delay-ms", wl.compute_delay_ms,
            "--max-tokens", str(wl.max_tokens), "--eval-every-tokens", str(wl.eval_every_tokens),
            "--log-jsonl", os.path.join(run_dir, "train.jsonl"), "--metrics-out", run_dir]


def is_torchft(spec: RunSpec) -> bool:
    """The external peer's runs: a torchft config, whatever front end the sweep's shared workload names."""
    return spec.config in cfgs.TORCHFT_CONFIGS or spec.workload.frontend == "torchft"


def launcher_args(spec: RunSpec, log_dir: str, *, netns: bool, timeout_s: float,
                  python: str = sys.executable) -> list[str]:
    """``local_cluster.py`` and its options for ``spec``'s cluster, up to and including ``--``."""
    cmd = [python, LAUNCHER, "--hosts", str(spec.hosts), "--quiet", "--log-dir", log_dir,
           "--stats-json", os.path.join(log_dir, "cluster.json"), "--timeout", str(int(timeout_s))]
    if not netns:
        cmd.append("--no-netns")
    if spec.rate and parse_rate(spec.rate) is not None:
        cmd += ["--rate", spec.rate]
    if spec.mtu:
        cmd += ["--mtu", str(spec.mtu)]
    if spec.delay:
        cmd += ["--delay", spec.delay]
    for i, q in spec.cpu_quota:
        cmd += ["--cpu-quota", f"host{i}={q:g}"]
    for i, cpus in spec.cpus:
        cmd += ["--cpus", f"host{i}={':'.join(map(str, cpus))}"]
    return cmd + ["--"]


def launch_command(spec: RunSpec, run_dir: str, config_path: str, *, netns: bool, timeout_s: float,
                   python: str = sys.executable) -> list[str]:
    cmd = launcher_args(spec, run_dir, netns=netns, timeout_s=timeout_s, python=python)
    if is_torchft(spec):
        return cmd + [python, "-m", "examples.train_lm_torchft"] + torchft_args(spec.workload, config_path, run_dir)
    if spec.workload.frontend == "fsdp":
        return cmd + [python, "-m", "examples.train_lm_fsdp"] + fsdp_args(spec.workload, config_path, run_dir)
    cmd += [python, "-m", "benchmarks.sweep.worker", "--out", run_dir, "--"]
    return cmd + train_args(spec.workload, config_path, run_dir)


def prepare_run(spec: RunSpec, out_dir: str) -> tuple[str, str]:
    run_dir = os.path.join(os.path.abspath(out_dir), "runs", spec.run_id)
    os.makedirs(run_dir, exist_ok=True)
    for name in os.listdir(run_dir):  # a re-run starts clean (jsonl files append)
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    wl = spec.workload
    if wl.frontend == "fsdp":
        cfg = cfgs.make_fsdp_config(spec.config, lr_schedule=wl.lr_schedule, lr_total_steps=wl.lr_total_steps or None,
                                    micro_batch=wl.micro_batch, grad_accum=wl.grad_accum,
                                    max_micro_batches_per_round=wl.max_micro_batches_per_round)
    else:
        cfg = cfgs.make_config("zero1" if is_torchft(spec) else spec.config, micro_batch=wl.micro_batch,
                               grad_accum=wl.grad_accum, warmup_steps=wl.warmup_steps,
                               telemetry_jsonl=os.path.join(run_dir, "telemetry.jsonl"),
                               max_micro_batches_per_round=wl.max_micro_batches_per_round,
                               streaming_sync_every=wl.streaming_sync_every, lr_schedule=wl.lr_schedule,
                               lr_total_steps=wl.lr_total_steps or None)
        cfgs.validate(cfg)
    if is_torchft(spec):  # zero1's optimizer, schedule, clipping and batch around torchft's outer loop
        cfg = cfgs.make_torchft_config(spec.config, cfg, sync_every=wl.streaming_sync_every)
    config_path = os.path.join(run_dir, "config.json")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    return run_dir, config_path
