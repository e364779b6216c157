"""``acco.mode: "streaming"`` through ds_acco.initialize: DeepSpeed's stage-0 engine trains local
replicas, equals the single-process Streaming DiLoCo reference, issues no collective between
syncs, and resumes bit-identically (int8 + error feedback, a round in flight at the save)."""

from __future__ import annotations

import os

import pytest
import torch

from ds_acco import AccoConfigError
from ds_acco.deepspeed.initialize import acco_config_of
from ds_acco.reference.streaming import streaming_reference
from tests import ds_streaming_workers as S
from tests import int8_workers as I
from tests import workloads as W
from tests.dist_harness import run_distributed

WORLD, STEPS = 2, 12
FRAGMENTS = dict(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5, quantize="none", all_gather_dtype="fp32")


def test_equals_streaming_reference_and_syncs_on_schedule():
    runs = run_distributed(S.train_ds_streaming, WORLD, config=S.ds_streaming_config(FRAGMENTS), steps=STEPS,
                           timeout=300)
    fragments = runs[0]["fragments"]
    assert fragments == [[0, 1], [2, 3]]
    model = W.make_model(seed=0)
    want = streaming_reference(list(model.parameters()), I.streaming_grad_fn(model), I.make_inner_optimizer,
                               WORLD, fragments, STEPS, sync_every=4, overlap_steps=1, alpha=0.5)
    for rank in range(WORLD):
        got = runs[rank]["trajectory"]
        assert len(got) == STEPS
        for step, (g_step, w_step) in enumerate(zip(got, want.workers), start=1):
            for g, w in zip(g_step, w_step[rank]):
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5, msg=lambda m: f"rank {rank} step {step}: {m}")
    # fragment p launches at inner steps t = p*H/P (mod H) and merges tau = 1 step later
    # (the round launched at step 12 is still in flight when the run ends: neither lists it)
    schedule = [(2, 1, 3), (4, 0, 5), (6, 1, 7), (8, 0, 9), (10, 1, 11)]
    assert want.syncs == [(s, f, a) for s, f, a, _ in runs[0]["records"]] == schedule
    assert runs[0]["global_steps"] == STEPS


def test_no_collective_between_syncs_unlike_stock_stage0():
    """Between fragment syncs a streaming rank talks to nobody (stock stage 0 all-reduces every step)."""
    block = dict(FRAGMENTS, fragments=1, sync_every=100, overlap_steps=0)
    streaming, stock = (
        run_distributed(S.train_ds_streaming, WORLD, config=S.ds_streaming_config(b, G=2, clip=0.5), steps=4,
                        count_collectives=True, use_ds_acco=b is not None, timeout=300)[0]
        for b in (block, None)
    )
    assert stock["collectives"], "the counter saw nothing: it would not catch a collective either"
    assert streaming["collectives"] == []
    assert not torch.equal(streaming["trajectory"][-1][0], stock["trajectory"][-1][0])


def test_resume_mid_round_with_int8_error_feedback_is_bit_identical(tmp_path):
    block = dict(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5, quantize="int8", all_gather_dtype="bf16")
    cfg = S.ds_streaming_config(block, G=2, clip=0.5, scheduler=True,
                                acco_extra={"error_feedback": True, "quantization_block_size": 8})
    ckpt = str(tmp_path / "ckpt")
    full = run_distributed(S.train_ds_streaming, WORLD, config=cfg, steps=STEPS, timeout=300)
    saved = run_distributed(S.train_ds_streaming, WORLD, config=cfg, steps=STEPS, save_at_step=4, ckpt_dir=ckpt,
                            timeout=300)
    assert saved[0]["in_flight_at_save"], "step 4 launches fragment 0; its merge is due at step 5"
    files = set(os.listdir(os.path.join(ckpt, "global_step4")))
    assert {"mp_rank_00_model_states.pt", "acco_streaming_state_dp_rank_0.pt",
            "acco_streaming_state_dp_rank_1.pt"} <= files
    resumed = run_distributed(S.train_ds_streaming, WORLD, config=cfg, steps=STEPS, ckpt_dir=ckpt, resume=True,
                              timeout=300)
    for rank in range(WORLD):
        assert resumed[rank]["loaded_steps"] == 4
        a, b = resumed[rank]["trajectory"], full[rank]["trajectory"]
        assert len(a) == len(b) == STEPS
        for t, (x, y) in enumerate(zip(a, b), start=1):
            if t <= 4 and rank:
                continue  # steps before the save come from the client state, which DeepSpeed keeps for rank 0 only
            for u, v in zip(x, y):
                assert torch.equal(u, v), f"rank {rank} inner step {t} differs after resume"
    assert resumed[0]["lr"] == full[0]["lr"]
    # the replicas differ (their own data), so each rank really restored its own replica
    assert not torch.equal(full[0]["trajectory"][5][0], full[1]["trajectory"][5][0])


def test_resume_on_another_world_size_reshards_the_global_state(tmp_path):
    block = dict(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5, quantize="int8", all_gather_dtype="bf16")
    cfg = S.ds_streaming_config(block, acco_extra={"error_feedback": True, "quantization_block_size": 8})
    ckpt = str(tmp_path / "ckpt")
    saved = run_distributed(S.train_ds_streaming, 2, config=cfg, steps=8, save_at_step=4, ckpt_dir=ckpt, timeout=300)
    want = saved[0]["saved_global"]
    assert all(momentum is not None for _, momentum in want)  # both fragments have synced by step 4
    for world in (3, 1):
        runs = run_distributed(S.train_ds_streaming, world, config=cfg, steps=8, ckpt_dir=ckpt, resume=True,
                               timeout=300)
        for rank, run in enumerate(runs):
            assert run["loaded_steps"] == 4 and len(run["trajectory"]) == 8
            for (m, mom), (m0, mom0) in zip(run["loaded_global"], want):
                assert torch.equal(m, m0) and torch.equal(mom, mom0), f"world {world} rank {rank}"
            assert all(torch.isfinite(p).all() for p in run["trajectory"][-1])
        if world == 3:  # rank 2 continues saved rank 0's replica, rank 1 its own
            same = [torch.equal(a, b) for a, b in zip(runs[2]["loaded_replica"], runs[0]["loaded_replica"])]
            assert all(same)
            assert not torch.equal(runs[1]["loaded_replica"][0], runs[0]["loaded_replica"][0])


def test_resume_under_a_changed_streaming_block_carries_on_or_names_the_layout_field(tmp_path):
    block = dict(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5, quantize="int8", all_gather_dtype="bf16")
    cfg = S.ds_streaming_config(block, acco_extra={"error_feedback": True, "quantization_block_size": 8})
    ckpt = str(tmp_path / "ckpt")
    saved = run_distributed(S.train_ds_streaming, WORLD, config=cfg, steps=8, save_at_step=4, ckpt_dir=ckpt,
                            timeout=300)
    assert saved[0]["in_flight_at_save"]
    changed = dict(block, sync_every=6, alpha=0.3, quantize="none", all_gather_dtype="fp32")
    cfg2 = S.ds_streaming_config(changed, acco_extra={"error_feedback": False, "quantization_block_size": 8,
                                                      "streaming": dict(changed, outer_lr=0.5)})
    runs = run_distributed(S.train_ds_streaming, WORLD, config=cfg2, steps=10, ckpt_dir=ckpt, resume=True,
                           timeout=300)
    for rank, run in enumerate(runs):
        assert run["loaded_steps"] == 4 and len(run["trajectory"]) == 10
        for (m, mom), (m0, mom0) in zip(run["loaded_global"], saved[rank]["saved_global"]):
            assert torch.equal(m, m0) and torch.equal(mom, mom0), f"rank {rank}: the global state did not carry on"
        assert all(torch.isfinite(p).all() for p in run["trajectory"][-1])
        # the round in flight at the save merged at its step (5); then fragment syncs on the new H = 6
        assert [r[:3] for r in run["records"] if r[0] > 4] == [(6, 0, 7), (9, 1, 10)], run["records"]
        lines = [w for w in run["warnings"] if "changed acco block" in w]
        if rank == 0:
            assert len(lines) == 1, run["warnings"]
            for field in ("acco.streaming.sync_every: saved 4, now 6", "acco.streaming.alpha: saved 0.5, now 0.3",
                          "acco.streaming.quantize: saved 'int8', now 'none'", "acco.streaming.outer_lr: saved 0.7, "
                          "now 0.5", "acco.error_feedback: saved True, now False"):
                assert field in lines[0], lines[0]
        else:
            assert lines == []
    other = S.ds_streaming_config(dict(block, fragments=1), acco_extra={"error_feedback": True,
                                                                        "quantization_block_size": 8})
    with pytest.raises(RuntimeError, match=r"acco.streaming.fragments: saved 2, now 1"):
        run_distributed(S.train_ds_streaming, WORLD, config=other, steps=8, ckpt_dir=ckpt, resume=True, timeout=300)


def test_consolidate_gives_every_rank_the_exact_global_parameters():
    block = dict(fragments=2, sync_every=4, overlap_steps=1, alpha=0.5, quantize="int8", all_gather_dtype="bf16")
    runs = run_distributed(S.train_ds_streaming, WORLD, config=S.ds_streaming_config(block), steps=6,
                           consolidate=True, timeout=300)
    fragments = runs[0]["fragments"]
    for rank in range(WORLD):
        got = runs[rank]["consolidated"]
        for frag, (theta_g, _) in zip(fragments, runs[rank]["global_after"]):
            flat = torch.cat([got[i].reshape(-1) for i in frag])
            assert torch.equal(flat, theta_g), f"rank {rank}: not θ_g"  # fp32, not the bf16 all-gather
        assert all(torch.equal(a, b) for a, b in zip(got, runs[0]["consolidated"]))
    # the replicas differed before (they train on their own data)
    assert not torch.equal(runs[0]["trajectory"][-1][0], runs[1]["trajectory"][-1][0])


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c["zero_optimization"].update(stage=1), ["zero_optimization.stage: got 1", "stage 0"]),
    (lambda c: c.update(bf16={"enabled": True}), ["bf16.enabled: got true", "torch_autocast"]),
    (lambda c: c.update(fp16={"enabled": True}), ["fp16.enabled: got true", '"dtype": "float16"']),
    (lambda c: c["acco"]["streaming"].update(overlap_steps=2), ["acco.streaming.overlap_steps: got 2"]),
    (lambda c: c["acco"]["streaming"].update(fragment_modules=[["0"]]), ["acco.streaming.fragment_modules",
                                                                        "one list of module names per fragment"]),
])
def test_bad_streaming_deepspeed_configs_fail_before_start(edit, needles):
    cfg = S.ds_streaming_config(FRAGMENTS)
    edit(cfg)
    with pytest.raises(AccoConfigError) as info:
        acco_config_of(config=cfg)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_fragment_modules_by_name():
    from ds_acco.layout.fragments import named_fragments

    model = W.make_model()
    names = [n for n, _ in model.named_children()]
    frags = named_fragments([[names[0]], names[1:]], model, 2)
    params = list(model.parameters())
    assert [[id(p) for p in f] for f in frags] == [[id(p) for p in params[:2]], [id(p) for p in params[2:]]]
    with pytest.raises(ValueError, match=r"fragment_modules\[1\]\[0\]: got 'nope'"):
        named_fragments([[names[0]], ["nope"]], model, 2)
    with pytest.raises(ValueError, match="trainable parameters in no fragment"):
        named_fragments([["0.weight"], ["2"]], model, 2)
