"""ACCO checkpoints in DeepSpeed's layout: exact resume, zero_to_fp32, and loading across stock ZeRO-1."""

from __future__ import annotations

import os

import pytest
import torch

from tests import ds_workloads as D
from tests.dist_harness import run_distributed

CFG = D.ds_config(4, {"mode": "acco", "warmup_steps": 1}, clip=0.5, scheduler=True)
# the low-bit preset's rounds: int8 reduce-scatter with error feedback, int8 delta all-gathers
LOWBIT = D.ds_config(4, {"mode": "acco", "warmup_steps": 1, "comm_quantization": "int8", "error_feedback": True,
                         "all_gather_quantization": "int8", "quantization_block_size": 8}, clip=0.5, scheduler=True)

# ...with int4 estimates, saved with an estimate in flight (what it lost is part of the round state)
LOWBIT_INT4 = D.ds_config(4, {"mode": "acco", "warmup_steps": 1, "comm_quantization": "int8", "error_feedback": True,
                              "all_gather_quantization": "int8", "estimate_quantization": "int4",
                              "quantization_block_size": 8}, clip=0.5, scheduler=True)


@pytest.mark.parametrize("save_at, config", [(14, CFG), (13, LOWBIT), (11, LOWBIT_INT4)],
                         ids=["acco", "lowbit", "lowbit_int4"])
def test_resume_is_bit_identical_and_zero_to_fp32_reads_it(tmp_path, save_at, config):
    ckpt = str(tmp_path / "ckpt")
    full = run_distributed(D.train_ds, 2, config=config, steps=8, timeout=300)[0]["trajectory"]
    saved = run_distributed(D.train_ds, 2, config=config, steps=8, save_at=save_at, ckpt_dir=ckpt, timeout=300)[0]
    tag = open(os.path.join(ckpt, "latest")).read().strip()
    files = sorted(os.listdir(os.path.join(ckpt, tag)))
    assert "mp_rank_00_model_states.pt" in files
    assert {"acco_round_state_dp_rank_0.pt", "acco_round_state_dp_rank_1.pt"} <= set(files)
    assert not [f for f in files if ".tmp" in f]

    resumed = run_distributed(D.train_ds, 2, config=config, steps=8, ckpt_dir=ckpt, resume=True, timeout=300)[0]
    assert len(resumed["trajectory"]) == len(full) == 8
    for t, (a, b) in enumerate(zip(resumed["trajectory"], full)):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"step {t} differs after resume"

    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    fp32 = get_fp32_state_dict_from_zero_checkpoint(ckpt)
    assert set(fp32) == set(saved["masters"])
    for name, value in saved["masters"].items():
        assert torch.equal(fp32[name].float(), value), name


def test_stock_zero1_checkpoint_loads_into_acco_and_back(tmp_path):
    stock_cfg = {k: v for k, v in CFG.items() if k != "acco"}
    stock_dir, acco_dir = str(tmp_path / "stock"), str(tmp_path / "acco")
    stock = run_distributed(D.train_ds, 2, config=stock_cfg, steps=8, save_at=10, ckpt_dir=stock_dir,
                            use_ds_acco=False, timeout=300)[0]
    into_acco = run_distributed(D.train_ds, 2, config=CFG, steps=6, ckpt_dir=stock_dir, resume=True, timeout=300)
    r0 = into_acco[0]
    for a, b in zip(r0["loaded_params"], stock["saved_params"]):
        assert torch.equal(a, b)
    assert r0["loaded_steps"] == 2 and len(r0["trajectory"]) == 6
    assert all(torch.isfinite(p).all() for p in r0["trajectory"][-1])
    # ...and an ACCO checkpoint loads into stock DeepSpeed
    run_distributed(D.train_ds, 2, config=CFG, steps=6, save_at=14, ckpt_dir=acco_dir, timeout=300)
    back = run_distributed(D.train_ds, 2, config=stock_cfg, steps=6, ckpt_dir=acco_dir, resume=True,
                           use_ds_acco=False, timeout=300)[0]
    assert back["loaded_steps"] >= 2 and len(back["trajectory"]) == 6
    assert all(torch.isfinite(p).all() for p in back["trajectory"][-1])


def test_crash_during_save_keeps_last_good_checkpoint_and_resume_is_exact(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    full = run_distributed(D.train_ds, 2, config=CFG, steps=8, timeout=300)[0]["trajectory"]
    # checkpoints at steps 2 and 4; both ranks die in the middle of writing the one at step 6
    run_distributed(D.train_ds, 2, config=CFG, steps=8, ckpt_dir=ckpt, save_every=2, kill_in_save=3,
                    expect_dead=[0, 1], timeout=300)
    assert open(os.path.join(ckpt, "latest")).read().strip() == "global_step4"
    assert os.path.isdir(os.path.join(ckpt, "global_step6.partial"))
    assert not os.path.exists(os.path.join(ckpt, "global_step6"))
    resumed = run_distributed(D.train_ds, 2, config=CFG, steps=8, ckpt_dir=ckpt, resume=True, timeout=300)[0]
    assert resumed["loaded_steps"] == 4
    for t, (a, b) in enumerate(zip(resumed["trajectory"], full)):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"step {t} differs after crash and resume"
    assert len(resumed["trajectory"]) == 8


@pytest.mark.parametrize("new_world, single_group", [(3, True), (1, False)])
def test_checkpoint_loads_with_another_world_size(tmp_path, new_world, single_group):
    # (With 3 ranks the 8-element bias group would leave one rank only padding, which
    # DeepSpeed's universal loader cannot handle; one 43-element group gives every rank data.)
    ckpt = str(tmp_path / "ckpt")
    saved = run_distributed(D.train_ds, 2, config=CFG, steps=8, save_at=14, ckpt_dir=ckpt,
                            single_group=single_group, timeout=300)[0]
    res = run_distributed(D.train_ds, new_world, config=CFG, steps=6, ckpt_dir=ckpt, resume=True,
                          single_group=single_group, timeout=300)
    r0 = res[0]
    assert r0["probe_loss"] == saved["probe_loss"]  # same weights, same loss right after resume
    for a, b in zip(r0["loaded_params"], saved["saved_params"]):
        assert torch.equal(a, b)
    assert set(r0["loaded_masters"]) == set(saved["masters"])
    for name, value in saved["masters"].items():  # fp32 masters re-partitioned for the new world
        assert torch.equal(r0["loaded_masters"][name], value), name
    assert r0["loaded_steps"] == saved["trajectory"].__len__()
    assert len(r0["trajectory"]) == 6 and all(torch.isfinite(p).all() for p in r0["trajectory"][-1])
