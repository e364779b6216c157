"""Switching ACCO on from the config alone: validation, patching, the deepspeed launcher, rounds in flight at exit
(HF Trainer: tests/test_hf_trainer.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

import ds_acco
from ds_acco import AccoConfigError
from tests import workloads as W
from tests.clean_exit_checks import busy_loop, finished_cleanly, launch
from tests.dist_harness import free_port
from tests.launcher_checks import clean_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "torch_adam": True}}}


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"zero_optimization": {"stage": 2}}, ["zero_optimization.stage: got 2", "needs stage 1"]),
        ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}},
         ["zero_optimization.offload_optimizer.device: got 'cpu'", "'none'"]),
        ({"gradient_accumulation_steps": 3}, ["gradient_accumulation_steps: got 3", "even"]),
        ({"acco": {"mode": "acco", "polcy": "fixed"}}, ["acco.polcy", "unknown key"]),
        ({"acco": {"mode": "fast"}}, ["acco.mode", "'fast'", "'sync', 'dpu', 'acco', 'auto' or 'streaming'"]),
        ({"managed_gradient_accumulation": False}, ["managed_gradient_accumulation: got false"]),
        ({"acco": {"backend": "fsdp"}}, ["acco.backend: got 'fsdp'", "acco_fully_shard"]),
        ({"fp16": {"enabled": True}, "acco": {"check_finite": False}}, ["acco.check_finite: got false"]),
        ({"acco": {"warmup_steps": "scheduler"}}, ["acco.warmup_steps: got 'scheduler'", "no scheduler block"]),
        ({"acco": {"warmup_steps": "scheduler"}, "scheduler": {"type": "OneCycle", "params": {}}},
         ["scheduler.type is 'OneCycle', which has no learning-rate warm-up", "WarmupLR"]),
        ({"acco": {"warmup_steps": "scheduler"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2.5}}},
         ["scheduler.params.warmup_num_steps: got 2.5", "integer >= 0"]),
    ],
)
def test_bad_config_fails_before_any_process_group_work(change, needles):
    cfg = {**BASE, "acco": {"mode": "acco"}, **change}
    with pytest.raises(AccoConfigError) as info:
        ds_acco.initialize(model=W.make_model(), config=cfg)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert not dist.is_initialized()


@pytest.mark.parametrize("scheduler, steps", [
    ({"type": "WarmupLR", "params": {"warmup_num_steps": 7}}, 7),
    ({"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 3}}, 3),
    ({"type": "WarmupDecayLR", "params": {"total_num_steps": 5000}}, 1000),  # DeepSpeed's own default
])
def test_warmup_steps_scheduler_reads_the_scheduler_block(scheduler, steps):
    import ds_acco.plain
    from ds_acco.deepspeed.initialize import acco_config_of

    cfg = {**BASE, "scheduler": scheduler, "acco": {"mode": "acco", "warmup_steps": "scheduler"}}
    assert acco_config_of(config=cfg).warmup_steps == steps
    # the other front ends have no DeepSpeed scheduler block: the string is refused, naming the field
    with pytest.raises(AccoConfigError, match="acco.warmup_steps: got 'scheduler'.*integer >= 0"):
        ds_acco.plain.build(W.make_model().parameters(), config={"warmup_steps": "scheduler"},
                            gradient_accumulation_steps=2)


def test_config_file_path_is_read_like_deepspeed(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**BASE, "zero_optimization": {"stage": 3}, "acco": {}}))

    class Args:
        deepspeed_config = str(path)

    with pytest.raises(AccoConfigError, match="zero_optimization.stage: got 3"):
        ds_acco.initialize(args=Args(), model=W.make_model())


def test_patch_deepspeed_routes_initialize():
    import deepspeed

    from ds_acco.deepspeed import initialize as deepspeed_init

    stock = deepspeed.initialize
    try:
        ds_acco.patch_deepspeed()
        assert deepspeed.initialize is deepspeed_init.initialize
        with pytest.raises(AccoConfigError):
            deepspeed.initialize(model=W.make_model(), config={**BASE, "zero_optimization": {"stage": 0},
                                                               "acco": {}})
    finally:
        deepspeed_init.unpatch_deepspeed()
    assert deepspeed.initialize is stock


def _result(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_unmodified_deepspeed_script_under_deepspeed_launcher(tmp_path):
    """A launch: an unmodified script under the ``deepspeed`` launcher, routed by ``ds_acco.run``, to exit 0 (the
    same engines' teardown under a busy loop: the HF Trainer launch below)."""
    cfg = tmp_path / "acco.json"
    cfg.write_text(json.dumps({**BASE, "acco": {"mode": "acco", "policy": "fixed"}}))
    proc = launch(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "--module", "ds_acco.run",
                    "tests/scripts/plain_ds_script.py", "--steps", "3", "--deepspeed", "--deepspeed_config", str(cfg)])
    finished_cleanly(proc)
    res = _result(proc.stdout)
    assert res["engine"] == "AccoDeepSpeedEngine" and res["world"] == 2
    assert res["global_steps"] == 3
    assert res["telemetry"]["rounds"] >= 6 and res["telemetry"]["bytes_sent"] > 0
    assert res["last_loss"] < res["first_loss"]


@pytest.fixture(scope="module")
def exit_mid_round():
    """One ``torchrun`` launch of tests/scripts/exit_mid_round_script.py (an acco and a streaming engine, each with
    a round in flight when the script ends), while a busy loop takes a core."""
    with busy_loop():
        return launch(["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()),
                        "tests/scripts/exit_mid_round_script.py"], timeout=120)


@pytest.mark.parametrize("mode", ["acco", "streaming"])
def test_round_in_flight_at_interpreter_exit_is_finished_on_every_rank(exit_mid_round, mode):
    """A launch: interpreter exit, where only the exit hook can finish the round, and the exit status 0 it leaves
    (no abort at teardown) under a contended CPU."""
    finished_cleanly(exit_mid_round)
    exits = [json.loads(m) for m in re.findall(r"EXIT (\{[^}]*\})", exit_mid_round.stdout)]  # lines may interleave
    exits = [e for e in exits if e["mode"] == mode]
    assert sorted(e["rank"] for e in exits) == [0, 1]
    for e in exits:
        assert e["in_flight_before"] and e["closed"] and e["rounds"] >= 1, e


@pytest.mark.parametrize("version, ok", [("0.19.8", True), ("0.19.0+abc", True), ("0.18.9", False), ("0.20.0", False)])
def test_supported_deepspeed_range(version, ok):
    from ds_acco.deepspeed.checks import check_deepspeed_version

    if ok:
        check_deepspeed_version(version)
    else:
        with pytest.raises(RuntimeError, match=rf">= 0\.19\.0, < 0\.20\.0; found {version}"):
            check_deepspeed_version(version)


STOCK_EXIT_PROBE = """
import atexit, json, sys, torch, torch.distributed as dist
atexit.register(lambda: print('AT_EXIT', dist.is_initialized(), flush=True))  # registered first: runs last
import ds_acco
from ds_acco.comm.engine_lifecycle import EXIT_ORDER
model = torch.nn.Linear(4, 4)
engine, *_ = ds_acco.initialize(model=model, model_parameters=model.parameters(), config=json.loads(sys.argv[1]))
loss = engine(torch.randn(2, 4)).sum()
engine.backward(loss)
engine.step()
print('STOCK', type(engine).__name__, EXIT_ORDER.owns_default_group, flush=True)
"""


def test_a_stock_job_whose_group_ds_acco_initialize_made_is_torn_down_before_finalization():
    """A fresh one-rank interpreter, no ``acco`` block: ``ds_acco.initialize`` is stock DeepSpeed, but the default
    group DeepSpeed made inside it is destroyed at exit while the interpreter is whole (a stock mpirun launch once
    aborted at finalization in CI; engine_lifecycle's [Note: the order at exit]). A pooled rank cannot show it: its
    group exists before the call, and its interpreter does not exit."""
    env = dict(clean_env(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    cfg = {**BASE, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0}
    proc = subprocess.run([sys.executable, "-c", STOCK_EXIT_PROBE, json.dumps(cfg)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "STOCK DeepSpeedEngine True" in proc.stdout, proc.stdout[-2000:]
    assert "AT_EXIT False" in proc.stdout, proc.stdout[-2000:]
