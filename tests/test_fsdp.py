"""ACCO on FSDP2 (ds_acco.fsdp): exactness, stock-FSDP2 parity, DCP checkpoints, a GPT under torchrun.

Real gloo processes. Starting them is most of the cost on a small machine, so
each job runs several scenarios (tests/fsdp_workloads.py) and the tests read the
results of two module-scoped jobs: two ranks (every mode, stock FSDP2, and a run
checkpointed mid-step then resumed into fresh objects) and three ranks (every
mode, and a resharded load of the two-rank checkpoint); plus a one-rank job
(resharded load, checkpoints exchanged with stock FSDP2, refused set-ups) and
one torchrun launch of the example.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from ds_acco.config import AccoConfig
from ds_acco.errors import AccoConfigError
from tests import fsdp_workloads as F
from tests.dist_harness import run_distributed
from tests.helpers import BF16_ATOL, assert_follows_rules, assert_trajectories_equal, reference

G, STEPS = 4, 8
RESUME_STEPS, SAVE_AT = 8, 13  # micro-batch 13 of RESUME's job: mid-step, a round in flight
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fsdp_ckpt") / "step")


@pytest.fixture(scope="module")
def two(ckpt):
    results = run_distributed(F.first_job, 2, G=G, steps=STEPS, resume_steps=RESUME_STEPS, save_at=SAVE_AT,
                              ckpt=ckpt, timeout=240)
    for other in results[1:]:  # every rank computes with the same parameters
        for mode in F.MODES:
            assert_trajectories_equal(other["modes"][mode], results[0]["modes"][mode], atol=0, rtol=0)
    return results[0]


@pytest.fixture(scope="module")
def three(two, ckpt):
    return run_distributed(F.third_job, 3, G=G, steps=STEPS, ckpt=ckpt, timeout=240)[0]


def _modes(world, two, three):
    return (two if world == 2 else three)["modes"]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", F.MODES)
def test_fixed_policy_matches_reference(mode, world, two, three):
    got = _modes(world, two, three)
    assert_trajectories_equal(got[mode], reference(mode, world, G, steps=STEPS))
    assert got[mode + "_grads_bound"] == [True] * 4  # backward accumulated straight into the round buffers
    if mode == "acco":
        assert got["acco_kinds"][:4] == ["estimate", "commit", "estimate", "commit"]
        assert all(c == [G // 2] * world for c in got["acco_counts"])


def test_layer_by_layer_bf16_adaptive_and_frozen(two):
    got = two["variants"]
    assert got["nested_groups"] == 2
    assert_trajectories_equal(got["nested"], reference("acco", 2, G, steps=STEPS))
    # with commit STEPS + 1 in flight, the state dict and committed_parameters() hold its result,
    # while the model computes with the estimate
    exports, want = got["exports"], reference("acco", 2, G, steps=STEPS + 1)[-1]
    assert_trajectories_equal([exports["state_dict"]], [want])
    assert_trajectories_equal([exports["committed"]], [exports["state_dict"]], atol=0, rtol=0)
    assert any(not torch.equal(a, b) for a, b in zip(exports["compute"], exports["committed"]))
    # bf16 compute parameters, fp32 masters (FSDP2's sharded parameters), fp32 accumulation from reduce_dtype
    assert got["bf16_dtypes"] == {"compute": {"torch.bfloat16"}, "master": {"torch.float32"},
                                  "accumulator": "torch.float32", "grads_bound": False}
    assert_follows_rules(got["bf16"], "acco", 2, G, STEPS, atol=BF16_ATOL)
    # adaptive policy: the slow rank contributes less; the update follows the recorded counts
    counts = got["adaptive_counts"]
    assert sum(c[0] for c in counts[1:]) > sum(c[1] for c in counts[1:]) and all(min(c) >= 1 for c in counts)
    assert_trajectories_equal(got["adaptive"], reference("acco", 2, G, steps=4, counts=counts))
    # a frozen parameter is in no round-engine group and keeps its value (order: 0.w, 2.w, 0.b, 2.b);
    # the three trainable ones form one group, the root unit's
    assert got["frozen"] == {"groups": 1, "changed": [True, True, False, True]}


@pytest.mark.parametrize("bucketing", ["per_unit", "default"])
def test_a_round_issues_two_collectives_per_bucket_of_fully_shard_units(bucketing, two):
    """FSDP2's batching: one reduce-scatter and one all-gather per unit (bucket_cap_mb=0), not per
    parameter; by default small consecutive units share one bucket, so one of each per round."""
    got = two["collectives"][bucketing]
    rounds, buckets, calls = got["rounds"], got["buckets"], got["calls"]
    assert (got["units"], got["params"]) == (2, 4) and rounds >= 6
    assert buckets == (2 if bucketing == "per_unit" else 1), got
    assert calls["reduce_scatter_sum"] == calls["all_gather"] == rounds * buckets, got
    assert calls["all_gather_small"] == calls["all_reduce_sum"] == rounds, got  # counts; clipping's norm
    # on gloo a reduce-scatter runs as all-to-all inside reduce_scatter_sum (ds_acco/comm/collectives.py)
    assert calls["all_to_all"] == 0, got
    assert got["wire_calls"] == rounds * (2 * buckets + 2)  # the collectives that went on the wire
    assert got["wire_pieces"] == got["wire_calls"], got  # small buffers, unpaced loopback: one gloo call each


def test_adamw_commit_on_local_tensors_is_the_dtensor_step(two):
    """The commit skips DTensor dispatch (ds_acco/fsdp/shard_optimizer.py) and changes no bit."""
    for foreach, got in two["local_adam"].items():
        assert got["functional"], (foreach, got)  # the commit took the functional path
        assert got["changed"] >= 12 and got["equal"], (foreach, got)  # 4 masters, 2 moments each, steps


@pytest.mark.parametrize("world", [2, 3])
def test_sync_equals_stock_fsdp2_and_disabled_is_stock(world, two, three):
    got = _modes(world, two, three)
    assert_trajectories_equal(got["sync"], got["stock"])
    assert_trajectories_equal(got["disabled"], got["stock"], atol=0, rtol=0)  # documented: exactly stock FSDP2
    assert_trajectories_equal(got["stock"], reference("sync", world, G, steps=STEPS))
    # the modes differ, so the comparisons above can fail
    with pytest.raises(AssertionError):
        assert_trajectories_equal(got["acco"], got["stock"])


@pytest.mark.parametrize("mode", F.MODES)
def test_close_hands_back_committed_parameters(mode, two):
    closed = two["modes"][mode + "_closed"]
    assert closed["sharded"]
    # close() drains the round in flight: in dpu that is one more commit
    want = reference(mode, 2, G, steps=STEPS + (mode == "dpu"))[-1]
    assert_trajectories_equal([closed["params"]], [want])


def test_resume_is_bit_identical(two):
    resumed, full = two["resumed"], two["full"]
    assert len(resumed) == len(full) == RESUME_STEPS
    for t, (a, b) in enumerate(zip(resumed, full)):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"step {t} differs after resume"
    assert two["saved"]["in_flight"], "the checkpoint should have been taken with a round in flight"


def _assert_loaded(loaded, saved):
    for key in ("masters", "exp_avg", "exp_avg_sq"):
        for a, b in zip(loaded[key], saved[key]):
            assert torch.equal(a, b), key
    assert loaded["lr"] == saved["lr"]
    assert loaded["extra_k"] == SAVE_AT
    # rounds bootstrap afresh: the compute parameters are the loaded masters, and training goes on
    for compute, master in zip(loaded["compute"], loaded["masters"]):
        assert torch.equal(compute, master)
    assert loaded["continued"] == 2


def test_resharded_load_on_three_ranks(two, three):
    loaded = three["resharded"]
    _assert_loaded(loaded, two["saved"])
    assert loaded["commits"] >= two["saved"]["commits"]


def test_resharded_load_on_one_rank_and_stock_fsdp2_interchange(two, ckpt, tmp_path):
    got = run_distributed(F.one_rank_job, 1, ckpt=ckpt, ckpt2=str(tmp_path / "stock"), timeout=120)[0]
    _assert_loaded(got["resharded"], two["saved"])
    # stock FSDP2 ("enabled": false) loads the ACCO checkpoint ...
    for a, b in zip(got["stock_loaded"]["masters"], two["saved"]["masters"][0::2]):  # param group 0: weights
        assert torch.equal(a, b)
    # ... and ACCO loads stock FSDP2's checkpoint: its compute parameters are the saved masters
    assert got["acco_from_stock"]["commits"] == got["stock_saved"]["commits"]
    for a, b in zip(got["acco_from_stock"]["full"], got["stock_saved"]["full"]):
        assert torch.equal(a, b)
    # unsupported set-ups fail at start-up, saying what is wrong
    refused = got["refused"]
    assert refused["2d_mesh"].startswith("AccoConfigError: mesh: got a 2-D mesh"), refused
    assert refused["offload"].startswith("AccoConfigError: offload_policy: CPUOffloadPolicy"), refused
    assert refused["reduce_dtype"].startswith("AccoConfigError: mp_policy.reduce_dtype: got torch.float32"), refused
    assert refused["unsharded_params"].startswith("AccoConfigError: param_groups: a parameter"), refused
    assert refused["odd_G"].startswith("AccoConfigError: gradient_accumulation_steps: got 3"), refused
    assert refused["bucket_cap"].startswith("AccoConfigError: bucket_cap_mb: got -1; must be"), refused


# ----------------------------------------------------------------- in-process checks (no processes)


def test_backend_is_read_from_the_acco_block():
    from ds_acco.fsdp.options import fsdp_config as _fsdp_config
    from ds_acco.fsdp.options import split_backend

    assert split_backend({"mode": "acco"}) == ("deepspeed", {"mode": "acco"})
    assert split_backend({"backend": "fsdp", "mode": "dpu"}) == ("fsdp", {"mode": "dpu"})
    assert _fsdp_config({"backend": "fsdp", "mode": "dpu"}).mode == "dpu"
    with pytest.raises(AccoConfigError, match="acco.backend: got 'deepspeed'"):
        _fsdp_config({"backend": "deepspeed"})
    with pytest.raises(AccoConfigError, match="acco.backend: got 'megatron'; allowed: 'deepspeed', 'fsdp'"):
        split_backend({"backend": "megatron"})
    with pytest.raises(AccoConfigError, match="polcy"):
        _fsdp_config({"backend": "fsdp", "polcy": "fixed"})


def test_torch_range_is_checked():
    """Untested releases start with a warning; a missing FSDP2 internal fails, naming torch and the attribute."""
    from ds_acco.fsdp._fsdp2 import check_fsdp2, check_torch_version

    assert check_torch_version("2.13.0+cpu") and check_torch_version("2.14.1+cu130")
    for other in ("2.12.1", "2.15.0", "3.0.0"):
        with pytest.warns(RuntimeWarning, match=r"tested with torch >=2\.13,<2\.15; installed torch is " + other):
            assert not check_torch_version(other)

    class OldFSDPParam:  # an FSDPParam of a release that renamed its padded shard
        sharded_param = mesh_info = fsdp_placement = offload_to_cpu = is_dtensor = reduce_dtype = None
        param_dtype = orig_dtype = unsharded_param = free_unsharded_param = None

    with pytest.raises(RuntimeError, match=rf"torch {re.escape(torch.__version__)} lacks FSDP2 internals ds_acco "
                                           r"relies on: FSDPParam\._sharded_param_data \(tested with torch"):
        check_fsdp2(None, OldFSDPParam())
    with pytest.raises(RuntimeError, match=r"FSDPState\._lazy_init, FSDPState\._is_root"):
        check_fsdp2(object())


def test_reduce_dtype_becomes_grad_accum_dtype():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from ds_acco.fsdp.options import translate_mp_policy as _translate_mp_policy

    model = F.W.make_model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    new_policy, config = _translate_mp_policy(policy, AccoConfig(), model)
    assert new_policy.reduce_dtype is None and new_policy.param_dtype == torch.bfloat16
    assert config.grad_accum_dtype == "fp32"
    with pytest.raises(AccoConfigError, match="disagree"):
        _translate_mp_policy(policy, AccoConfig(grad_accum_dtype="bf16"), model)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_json_config_means_what_it_means_to_deepspeed():
    from deepspeed.runtime.lr_schedules import WarmupDecayLR, WarmupLR

    from ds_acco.fsdp.options import load_job_config, warmup_lr

    job = load_job_config(os.path.join(REPO, "ds_configs", "fsdp_acco.json"))
    assert (job.micro_batch_size, job.gradient_accumulation_steps, job.clip_grad_norm) == (4, 4, 1.0)
    assert job.optimizer_cls is torch.optim.AdamW and job.optimizer_kwargs["betas"] == (0.9, 0.95)
    assert job.acco["backend"] == "fsdp" and job.mp_policy is None and job.ignored == []
    assert load_job_config({"bf16": {"enabled": True}}).mp_policy.param_dtype == torch.bfloat16
    assert load_job_config({"optimizer": {"type": "Adam", "params": {"lr": 1.0}}}).optimizer_cls is torch.optim.AdamW
    assert load_job_config({"zero_optimization": {"stage": 1}}).ignored == ["zero_optimization"]
    with pytest.raises(AccoConfigError, match="fp16.enabled"):
        load_job_config({"fp16": {"enabled": True}})
    with pytest.raises(AccoConfigError, match="acco.backend: got 'deepspeed'"):
        load_job_config({"acco": {"backend": "deepspeed"}})
    with pytest.raises(AccoConfigError, match="total_num_steps: missing with type 'WarmupDecayLR'"):
        load_job_config({"scheduler": {"type": "WarmupDecayLR", "params": {}}})
    with pytest.raises(AccoConfigError, match="total_num_steps: given with type 'WarmupLR'"):
        load_job_config({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 9}}})
    decay = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-3, "warmup_num_steps": 5,
                                                 "warmup_type": "log", "total_num_steps": 9}}
    for kind, total in (("linear", None), ("log", None), ("linear", 9), ("log", 9)):
        # WarmupLR and WarmupDecayLR (read from a job file): the same learning rate at every step as DeepSpeed's
        ours, theirs = [torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.5) for _ in range(2)]
        kw = dict(warmup_min_lr=1e-4, warmup_max_lr=1e-3, warmup_num_steps=5, warmup_type=kind)
        if total is None:
            sched, ds = warmup_lr(**kw)(ours), WarmupLR(theirs, **kw)
        else:
            job = load_job_config({"scheduler": dict(decay, params=dict(decay["params"], warmup_type=kind))})
            sched, ds = job.lr_scheduler(ours), WarmupDecayLR(theirs, total_num_steps=total, **kw)
        lrs = []
        for _ in range(12):
            assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], rel=1e-12, abs=1e-15)
            lrs.append(ours.param_groups[0]["lr"])
            sched.step()
            ds.step()
        assert lrs[-1] == pytest.approx(1e-4 if total else 1e-3) and max(lrs) == pytest.approx(1e-3)  # decayed to min


def test_rank_major_packing_is_fsdp2s_chunk_layout():
    """Rank r's packed region is the concatenation of every parameter's r-th torch.chunk, zero-padded."""
    from ds_acco.layout.rank_major import RankMajorPacking

    shapes, world = [(5, 3), (1,), (7,), (2, 2, 2)], 3
    params = [torch.randn(s) for s in shapes]
    chunk_rows = [-(-s[0] // world) for s in shapes]

    def padded_chunk(p, c, r):
        rows = list(torch.chunk(p, world))[r] if r < len(torch.chunk(p, world)) else p[:0]
        out = torch.zeros((c, *p.shape[1:]))
        out[: rows.shape[0]] = rows
        return out.reshape(-1)

    masters = [padded_chunk(p, c, 1) for p, c in zip(params, chunk_rows)]
    packing = RankMajorPacking([p.shape for p in params], world, masters)
    flat = packing.layout.new_buffer(params[0])
    for view, p in zip(packing.layout.views(flat), params):
        view.copy_(p)
    packed = packing.pack(flat, torch.empty(packing.layout.padded_numel, dtype=torch.float64))
    assert packed.dtype == torch.float64
    for r in range(world):
        want = torch.cat([padded_chunk(p, c, r) for p, c in zip(params, chunk_rows)])
        region = packed[r * packing.shard_numel:(r + 1) * packing.shard_numel]
        assert torch.equal(region.float(), want) and torch.equal(packing.shard(flat, r), want)
    out = torch.empty(packing.shard_numel)
    packing.read_masters(out)
    assert torch.equal(out, packing.shard(flat, 1))
    assert [torch.equal(a, b) for a, b in zip(packing.split_shard(out), masters)] == [True] * 4
    back = torch.zeros_like(flat)
    packing.unpack(packed.float(), back)
    assert all(torch.equal(v, p) for v, p in zip(packing.layout.views(back), params))
    with pytest.raises(ValueError, match="not 1-D padded dim-0 chunks"):
        RankMajorPacking([p.shape for p in params], world, masters[:1] + [torch.zeros(3)] + masters[2:])


@pytest.mark.parametrize("world", [2, 3])
def test_functional_lookahead_on_packed_units_equals_snapshot(world, two, three):
    got = (two if world == 2 else three)["lookahead"]
    assert got["functional"]  # torch AdamW over FSDP2's fp32 DTensor shards: no 12 P/N snapshot
    assert got["equal"] == [True, True]  # step 1 (no state) and step 3, padding included
    assert got["moved"] == [True, True]
    assert got["untouched"] == [True, True]
