"""Exports give the committed parameters, and taking them changes nothing; LR schedules follow tokens.

Real DeepSpeed engines (ZeRO-1, gloo, 2 pooled ranks) of the tiny job in tests/workloads.py.
"""

from __future__ import annotations

import pytest
import torch

from tests import ds_workloads as D
from tests.dist_harness import run_distributed

FIXED = D.ds_config(4, {"mode": "acco"}, clip=0.5)
ADAPTIVE = D.ds_config(4, {"mode": "acco", "policy": "adaptive"}, clip=0.5)
INT8_ALL_GATHER = D.ds_config(4, {"mode": "acco", "all_gather_quantization": "int8"}, clip=0.5)


def test_state_dict_after_the_loop_equals_zero_to_fp32_of_a_checkpoint_saved_after_it(tmp_path):
    # G = 4: rounds launch every 2 micro-batches; after 10 an estimate is in flight, after 12 a commit,
    # after 13 a commit with one micro-batch accumulated on top.
    # int8 parameter all-gathers: the compute parameters trail the masters, so the export gathers them
    ranks = run_distributed(D.exports_after_loop, 2, configs={"fixed": FIXED, "adaptive": ADAPTIVE,
                                                              "int8_all_gather": INT8_ALL_GATHER},
                            micro_batches=[10, 12, 13], ckpt_root=str(tmp_path), timeout=300)
    rows = [dict(row, rank=rank) for rank, rank_rows in enumerate(ranks) for row in rank_rows]
    fixed_in_flight = {r["micro_batches"]: r["in_flight"] for r in rows if r["config"] == "fixed"}
    assert fixed_in_flight == {10: "estimate", 12: "commit", 13: "commit"}
    differs = 0
    for row in rows:
        where = f"rank {row['rank']}: {row['config']} after {row['micro_batches']} micro-batches ({row['path']})"
        fp32 = row["zero_to_fp32"]
        assert set(fp32) == set(row["exported"]), where
        for name, value in fp32.items():
            assert torch.equal(row["exported"][name], value), (where, name)
            assert torch.equal(row["model16"][name], value), (where, "save_16bit_model", name)
            differs += not torch.equal(row["compute"][name], value)
    assert differs, "the module never held anything but the committed parameters: the test shows nothing"


@pytest.mark.parametrize("micro_batches,behind", [(5, "commit"), (4, "estimate")])
def test_a_rank_a_round_behind_exports_the_committed_parameters_too(tmp_path, micro_batches, behind):
    # Under the adaptive policy the export first lets a rank that is a round behind launch it (the catch-up),
    # which swaps its round in: state_dict's entries, taken before, viewed the replaced buffer (a commit
    # swapped in that way exported zeros).
    cfg = dict(ADAPTIVE, acco=dict(ADAPTIVE["acco"], max_micro_batches_per_round=1))
    ranks = run_distributed(D.export_after_a_rank_ran_ahead, 2, config=cfg, micro_batches=micro_batches,
                            ckpt_dir=str(tmp_path), timeout=300)
    ahead = {"commit": "estimate", "estimate": "commit"}[behind]
    assert ranks[0]["before"][1] == ahead and ranks[1]["before"] == (ranks[0]["before"][0] - 1, behind)
    assert ranks[0]["after"] == ranks[1]["after"] == ranks[0]["before"]  # rank 1 caught up; nothing else ran
    fp32 = ranks[0]["zero_to_fp32"]
    for rank, out in enumerate(ranks):
        assert set(out["exported"]) == set(fp32)
        for name, value in fp32.items():
            assert torch.equal(out["exported"][name], value), (rank, name)
            assert torch.equal(out["masters"][name], value), (rank, name)
            assert torch.equal(out["finished"][name], out["finished_masters"][name]), (rank, "finish", name)
            assert torch.equal(out["finished"][name], ranks[0]["finished"][name]), (rank, "finish", name)
    assert torch.equal(ranks[0]["evaluated"], ranks[1]["evaluated"])
    assert ranks[0]["steps"] == ranks[1]["steps"]
    assert any(v.abs().sum() > 0 for v in fp32.values())


def test_exports_in_the_middle_of_training_leave_the_trajectory_bit_identical(tmp_path):
    runs = run_distributed(D.trajectory_with_exports, 2, config=FIXED, steps=6, export_every=3,
                           ckpt_dir=str(tmp_path), timeout=300)[0]
    assert len(runs["plain"]) == len(runs["exports"]) == 6
    for t, (a, b) in enumerate(zip(runs["plain"], runs["exports"])):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"commit {t} differs"


def test_adaptive_policy_advances_the_lr_schedule_by_committed_micro_batches():
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    steps = 6
    # A fast link, made deterministic: every round ends after one micro-batch per rank, so a commit
    # (estimate + commit round) covers 4 micro-batches, half of G x N = 8: two commits per nominal step.
    cfg = dict(ADAPTIVE, acco=dict(ADAPTIVE["acco"], max_micro_batches_per_round=1), scheduler={"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 0.02, "warmup_num_steps": 2, "total_num_steps": steps}})
    out = run_distributed(D.adaptive_schedule, 2, config=cfg, steps=steps, timeout=300)[0]
    G, world = out["G"], 2
    assert out["committed"] == steps * G * world  # finish() committed every micro-batch
    assert out["advances"] == out["committed"] // (G * world) == steps == out["summary"]["nominal_steps"]
    assert out["summary"]["commits"] == 2 * steps
    reference = WarmupDecayLR(torch.optim.SGD([torch.zeros(1)], lr=0.02), total_num_steps=steps, warmup_min_lr=0.0,
                              warmup_max_lr=0.02, warmup_num_steps=2)
    for _ in range(steps):
        reference.step()
    assert out["lr"] == pytest.approx(reference.get_last_lr()[0], abs=0.0)
