"""The DeepSpeed front end: stock ZeRO-1 parity in sync mode, the reference in acco/dpu, dtypes, backward styles."""

from __future__ import annotations

import os

import pytest
import torch

from tests import ds_workloads as D
from tests import workloads as W
from tests.dist_harness import run_distributed
from tests.helpers import BF16_ATOL, assert_follows_rules, assert_trajectories_equal, reference

STEPS = 12


def test_sync_reproduces_stock_deepspeed_zero1_step_for_step():
    cfg = D.ds_config(4, clip=0.05, scheduler=True)
    stock = run_distributed(D.train_ds, 2, config=cfg, steps=STEPS, use_ds_acco=False, timeout=300)[0]
    acco = run_distributed(D.train_ds, 2, config=dict(cfg, acco={"mode": "sync"}), steps=STEPS, timeout=300)[0]
    assert stock["optimizer"] == acco["optimizer"] == "DeepSpeedZeroOptimizer"
    assert_trajectories_equal(acco["trajectory"], stock["trajectory"], atol=1e-6, rtol=1e-5)
    assert acco["global_samples"] == stock["global_samples"] == STEPS * 4 * 4 * 2
    assert acco["lr"] == pytest.approx(stock["lr"])
    assert acco["summary"]["rounds"] == STEPS


@pytest.mark.parametrize("mode, world", [("acco", 2), ("dpu", 3)])
def test_overlapped_modes_equal_core_reference(mode, world):
    G = 4
    got = run_distributed(D.train_ds, world, config=D.ds_config(G, {"mode": mode}), steps=STEPS, timeout=300)
    assert_trajectories_equal(got[0]["trajectory"], reference(mode, world, G, steps=STEPS))
    for other in got[1:]:
        assert_trajectories_equal(other["trajectory"], got[0]["trajectory"], atol=0, rtol=0)


def test_torch_style_backward_equals_engine_backward():
    cfg = D.ds_config(4, {"mode": "acco"})
    a = run_distributed(D.train_ds, 2, config=cfg, steps=6, torch_style_backward=True, timeout=300)[0]
    assert_trajectories_equal(a["trajectory"], reference("acco", 2, 4, steps=6))


def test_bf16_acco_tracks_stock_bf16():
    cfg = D.ds_config(4, dtype="bf16")
    stock = run_distributed(D.train_ds, 2, config=cfg, steps=8, use_ds_acco=False, timeout=300)[0]
    acco = run_distributed(D.train_ds, 2, config=dict(cfg, acco={"mode": "sync", "grad_accum_dtype": "fp32"}),
                           steps=8, timeout=300)[0]
    assert acco["optimizer"] == "DeepSpeedZeroOptimizer"
    # stock bf16 sums micro-batch gradients in bf16; ACCO here accumulates them in fp32, so a parameter may round
    # to the neighbouring bf16 value: 2.0e-3 apart at most in 8 steps (measured; an ulp in [0.25, 0.5) is 2^-9),
    # well inside the 1.3e-2 that separates the sync and acco references on this job
    assert_trajectories_equal(acco["trajectory"], stock["trajectory"], atol=4e-3, rtol=0)
    assert_follows_rules(acco["trajectory"], "sync", 2, 4, 8, atol=BF16_ATOL)
    # the ACCO paper's setting: bf16 accumulators (p.grad are their views) and a bf16 payload, in mode acco
    half = run_distributed(D.train_ds, 2, config=dict(cfg, acco={"mode": "acco", "grad_accum_dtype": "bf16"}),
                           steps=8, timeout=300)[0]
    assert half["accum_dtypes"] == ["torch.bfloat16"] and acco["accum_dtypes"] == ["torch.float32"]
    assert_follows_rules(half["trajectory"], "acco", 2, 4, 8, atol=BF16_ATOL)


fp16_ok = pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_fp16_supported(),
                             reason="DeepSpeed refuses fp16 on CPUs without native fp16 support")


@fp16_ok
def test_fp16_overflow_skips_consistently_and_lowers_the_loss_scale_like_stock():
    cfg = D.ds_config(2, dtype="fp16")
    kw = dict(steps=6, poison=(1, 5), timeout=300)  # inf in rank 1's 6th micro-batch: step 2 overflows
    stock = run_distributed(D.train_ds, 2, config=cfg, use_ds_acco=False, **kw)
    acco = run_distributed(D.train_ds, 2, config=dict(cfg, acco={"mode": "sync"}), **kw)
    for s, a in zip(stock, acco):
        assert a["skipped_steps"] == s["skipped_steps"] == 1
        assert a["loss_scale"] == s["loss_scale"] == 2.0 ** 8 / 2
        # fp16 parameters: one ulp is 4.9e-4 in [0.5, 1) and 9.8e-4 in [1, 2); where the two engines' fp32 sums
        # differ in their last bit a parameter may round to its neighbour (not measurable on a CPU without fp16)
        assert_trajectories_equal(a["trajectory"], s["trajectory"], atol=1e-3, rtol=1e-3)
    overlapped = run_distributed(D.train_ds, 2, config=dict(cfg, acco={"mode": "dpu"}), **kw)
    for r in overlapped:
        assert r["skipped_steps"] == 1 and r["loss_scale"] == 2.0 ** 7
        assert all(torch.isfinite(p).all() for p in r["trajectory"][-1])


def _segments_after_initialize(rank, world, *, acco):
    """A fresh rank whose launcher said every rank is local (``LOCAL_SIZE``, as the ``deepspeed`` launcher sets it):
    DeepSpeed creates its shared-memory segment at its first initialisation. Is its name still there after
    ``ds_acco.initialize``?"""
    os.environ["LOCAL_SIZE"] = str(world)
    import ds_acco
    from ds_acco.deepspeed import _internals
    from ds_acco.deepspeed.shm import segment_path

    model = W.make_model()
    engine, *_ = ds_acco.initialize(model=model, model_parameters=W.param_groups(model),
                                    config=D.ds_config(4, acco))
    made = _internals.shm_segments_made()
    left = os.path.exists(segment_path(rank))
    engine.destroy()
    return made, left


@pytest.mark.parametrize("acco", [None, {"mode": "acco"}], ids=["stock", "acco"])
def test_deepspeed_shared_memory_segments_are_unlinked_with_acco_on_or_off(acco):
    """Fresh processes (DeepSpeed creates its segments once per process): with no ``acco`` block too, ds_acco
    unlinks them, or every stock job launched through it leaves 66 MB per rank in /dev/shm."""
    got = run_distributed(_segments_after_initialize, 2, acco=acco, fresh=True, timeout=180)
    assert got == [(True, False), (True, False)], got
