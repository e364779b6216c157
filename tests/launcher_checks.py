"""What tests/test_launchers.py and tests/test_mpi_launch.py check on a run of examples.train_lm, launched or pooled,
a launch that never hangs, and the pooled run itself.

A launch proves what its launcher does (the ranks it starts, their variables, exit statuses, DeepSpeed's
shared-memory segments); the numbers a config trains to are train_lm's and the engine's, and come out the same on
pooled ranks, which :func:`train_lm_on_rank` runs train_lm's own ``main`` on at the cost of the training alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess

from tests.dist_harness import free_port
from tests.helpers import run_group

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "ds_configs")
LAUNCHERS = os.path.join(REPO, "launchers")
LAUNCH_TIMEOUT_S = 240  # generous: a missing JIT cache costs ~2 min on 2 cores
LN_VOCAB = math.log(257)  # loss of a uniform guess over the byte vocabulary
STEPS = 8
TRAIN_ARGS = ["--model-size", "tiny", "--seq-len", "64", "--steps", str(STEPS), "--eval-every", "4",
              "--eval-batches", "2", "--no-progress"]
SUMMARY = re.compile(
    r"\[train_lm\] done: steps (?P<steps>\d+) \| ranks (?P<ranks>\d+) \| final train loss (?P<loss>\S+) \| "
    r"val loss (?P<val>\S+) \| tokens/s (?P<tps>\S+) \| comm hidden (?P<hidden>n/a|[\d.]+%)"
)


def summary_of(returncode: int, stdout: str) -> dict:
    """Rank 0's summary line, the only one (rank 0 alone prints it), as numbers."""
    tail = stdout[-6000:]
    assert returncode == 0, f"exit {returncode}:\n{tail}"
    found = SUMMARY.findall(stdout)
    assert len(found) == 1, f"expected one summary line (rank 0 only), got {len(found)}:\n{tail}"
    steps, ranks, loss, val, tps, hidden = found[0]
    return {"steps": int(steps), "ranks": int(ranks), "loss": float(loss), "val": float(val),
            "tokens_per_s": float(tps), "hidden": None if hidden == "n/a" else float(hidden.rstrip("%"))}


def streaming_config(path, **streaming) -> str:
    """ds_configs/streaming_int8.json with its streaming block changed by ``streaming``, written to ``path``."""
    with open(os.path.join(CONFIGS, "streaming_int8.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["acco"]["streaming"].update(streaming)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return str(path)


def check_trained(s: dict, log_path, config: str, min_rounds: int = STEPS) -> None:
    """A TRAIN_ARGS run of ``config`` (a path): rank 0's summary ``s`` and its JSONL log say two ranks trained."""
    with open(config, encoding="utf-8") as f:
        cfg = json.load(f)
    assert s["steps"] == STEPS and s["ranks"] == 2, s
    assert math.isfinite(s["loss"]) and s["loss"] < LN_VOCAB, s
    assert math.isfinite(s["val"]) and s["val"] < LN_VOCAB, s
    assert s["tokens_per_s"] > 0, s
    acco = "acco" in cfg
    if acco:
        assert s["hidden"] is not None and 0.0 <= s["hidden"] <= 100.0, s
    else:
        assert s["hidden"] is None, s  # stock DeepSpeed engine: nothing to measure

    with open(log_path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f.read().splitlines()]
    steps = [r for r in records if "step" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # one line per optimizer step, rank 0 only
    assert steps[-1]["loss"] < steps[0]["loss"], "training did not reduce the loss"
    assert sum(1 for r in steps if "val_loss" in r) == 1  # --eval-every 4 of 8 steps: step 4 (the end is the summary)
    indices = [r["micro_batch_index"] for r in steps]
    assert indices == sorted(indices) and len(set(indices)) == STEPS
    if cfg.get("acco", {}).get("policy") != "adaptive":  # fixed quota: 4 micro-batches per step and rank
        assert indices[-1] >= STEPS * 4
    summary = records[-1]
    assert summary["event"] == "summary" and summary["ranks"] == 2
    # Both ranks' tokens are counted: more than rank 0's micro-batches x 4 sequences x 64 tokens.
    assert summary["tokens"] > indices[-1] * 4 * 64
    if acco:
        assert summary["acco"]["rounds"] >= min_rounds, summary["acco"]


def train_lm_on_rank(rank, world, *, argv):
    """``examples.train_lm``'s ``main(argv)`` on a pooled rank, whose process group DeepSpeed takes as a launched
    rank's; returns the exit code and what it printed."""
    import contextlib
    import io

    from ds_acco.comm.engine_lifecycle import EXIT_ORDER
    from examples import train_lm

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_lm.main(argv)
    EXIT_ORDER.teardown()  # what a launched rank's exit does: the round in flight drained, the engine closed
    return {"code": code, "stdout": out.getvalue()}


def clean_env() -> dict:
    env = dict(os.environ)
    for key in list(env):
        if key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_SIZE",
                   "CUDA_VISIBLE_DEVICES") or key.startswith(("PMI_", "PMIX_", "OMPI_")):
            del env[key]
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(launcher: str, config: str, *args: str, timeout: float = LAUNCH_TIMEOUT_S, env: dict | None = None,
           port: int | None = None) -> subprocess.CompletedProcess:
    """Run ``launchers/<launcher> -n 2 -p <port> <config> args...``; never hangs."""
    cmd = ["bash", os.path.join(LAUNCHERS, launcher), "-n", "2", "-p", str(port or free_port()), config, *args]
    return run_group(cmd, env or clean_env(), timeout)


def summary(result: subprocess.CompletedProcess) -> dict:
    return summary_of(result.returncode, result.stdout)


def deepspeed_segments(port: int) -> list:
    """DeepSpeed's shared-memory segments of the job on ``port`` (named ``..._<MASTER_ADDR>_<MASTER_PORT>_<rank>``;
    other jobs on this machine have segments of their own)."""
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix) and n.split("_")[-2] == str(port))


def train_launch(launcher: str, config: str, tmp, *args: str) -> dict:
    port = free_port()
    log = tmp / "steps.jsonl"
    result = launch(launcher, config, *TRAIN_ARGS, "--log-jsonl", str(log), *args, port=port)
    return {"result": result, "config": config, "log": log, "leftover_segments": deepspeed_segments(port)}
