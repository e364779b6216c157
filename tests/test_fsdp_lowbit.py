"""The FSDP2 front end with ``all_gather_quantization: "int8"`` and ``estimate_quantization: "int4"``: the delta is
taken in the rank-major layout FSDP2 shards in, replicas stay bit-identical, commits follow the reference rules, and
a checkpoint saved with a round in flight resumes bit for bit (2 real gloo ranks, one job for the file)."""

from __future__ import annotations

import pytest
import torch

from ds_acco.numerics.quantization import block_absmax
from ds_acco.reference import ReferenceRun, reference_schedule
from tests import fsdp_lowbit_workers as L
from tests import workloads as W
from tests.dist_harness import run_distributed

WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_lowbit")
    return run_distributed(L.lowbit_job, WORLD, ckpt=str(out / "step"), out=str(out), timeout=300)


def _delta_bound(delta_rows: torch.Tensor, block: int) -> torch.Tensor:
    """Half an int8 step of each element's block, for ``(ranks, shard)`` deltas, flattened."""
    scales = block_absmax(delta_rows, block).repeat_interleave(block, dim=-1)[..., :delta_rows.shape[1]]
    return (scales / 254 * (1 + 1e-5)).reshape(-1) + 1e-7


def _full_master(runs: list, swap: int, group: int) -> torch.Tensor:
    """Every rank's master shard of bucket ``group``, rank-major: the whole bucket as FSDP2's all-gather packs it."""
    return torch.cat([r["swaps"][swap]["master"][group] if swap is not None else r["final"]["master"][group]
                      for r in runs])


@pytest.mark.parametrize("name", ["acco_int8_ag", "dpu_int8_ag", "sync_int8_ag", "acco_int4_estimate", "bf16_int8_ag"])
def test_replicas_are_bit_identical_after_every_swap(results, name):
    runs = [r[name] for r in results]
    assert len(runs[0]["swaps"]) >= 4
    for i, swap in enumerate(runs[0]["swaps"]):
        assert all(torch.equal(a, b) for a, b in zip(runs[1]["swaps"][i]["flat"], swap["flat"])), (name, i)
        assert all(torch.isfinite(t).all() for t in swap["flat"]), (name, i)


@pytest.mark.parametrize("name", ["acco_int8_ag", "sync_int8_ag"])
def test_replicas_stay_within_half_an_int8_step_of_the_masters_in_fsdp2s_layout(results, name):
    """After a commit every rank holds ``base + dequant(int8(θ - base))``, the delta cut into blocks of each rank's
    rank-major shard (its FSDP2 chunks, concatenated): every element within half a step of its block's delta. A
    delta taken in the param-major layout of the compute buffers would be off by whole parameters here."""
    runs = [r[name] for r in results]
    worst = 0.0
    for i, swap in enumerate(runs[0]["swaps"]):
        if swap["kind"] != "commit":
            continue
        for g, (flat, base) in enumerate(zip(swap["flat"], swap["base"])):
            master = _full_master(runs, i, g)
            err = (flat - master).abs()
            assert (err <= _delta_bound((master - base).view(WORLD, -1), L.BLOCK) + 1e-7 * master.abs()).all(), \
                (name, i, g)
            worst = max(worst, float(err.max()))
    assert 0 < worst < 0.02 / 50, worst  # quantised, and far below an lr step
    if name == "acco_int8_ag":
        assert runs[0]["buckets"] == 2  # two fully_shard units, two packed groups
    final = runs[0]["final"]  # finish() makes the compute parameters exactly the masters
    assert all(torch.equal(flat, _full_master(runs, None, g)) for g, flat in enumerate(final["flat"]))


def test_int4_estimate_commits_follow_the_rules_from_where_estimates_landed(results):
    """As on the DeepSpeed and plain front ends (tests/test_lowbit.py): given where each int4 estimate landed, every
    commit equals the reference rules to fp32 rounding, since the commit sends on what the int4 reduce-scatter lost;
    the estimates themselves landed off the fp32 lookahead."""
    run, fp32 = results[0]["acco_int4_estimate"], results[0]["acco_fp32"]
    model = W.make_model()
    ref = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer, WORLD)
    landed = [s["params"] for s in run["swaps"] if s["kind"] == "estimate"]
    want = reference_schedule(ref, ["acco"] * L.STEPS, L.G, estimate_at=landed)
    got = [s["params"] for s in run["swaps"] if s["kind"] == "commit"]
    assert len(got) == L.STEPS
    for t, (a, b) in enumerate(zip(got, want)):
        assert max(float((x - y).abs().max()) for x, y in zip(a, b)) < 2e-6, t
    exact = [s["params"] for s in fp32["swaps"] if s["kind"] == "estimate"]
    assert max(float((x - y).abs().max()) for a, b in zip(landed, exact) for x, y in zip(a, b)) > 1e-5


def test_low_bit_rounds_send_fewer_bytes_and_say_so_at_start_up(results):
    r = results[0]
    wire = {n: r[n]["startup"]["param_all_gather"] for n in ("acco_fp32", "acco_int8_ag", "acco_int4_estimate")}
    assert wire == {"acco_fp32": "fp32", "acco_int8_ag": "int8 delta",
                    "acco_int4_estimate": "int4 delta (estimates), fp32 (commits)"}
    per_round = {n: r[n]["bytes_sent"] / len(r[n]["swaps"]) for n in ("acco_fp32", "acco_int4_estimate")}
    assert per_round["acco_int4_estimate"] < per_round["acco_fp32"]


def test_resume_under_every_low_bit_switch_is_bit_identical(results):
    """Saved mid-step with a round in flight (int8 reduce-scatter with error feedback, int8 all-gathers, int4
    estimates), resumed into fresh objects: the same commits and the same compute parameters, bit for bit."""
    for r in results:
        assert r["saved"]["in_flight"], "the checkpoint should have been taken with a round in flight"
        full, resumed = r["full"], r["resumed"]
        assert len(full["trajectory"]) == len(resumed["trajectory"]) == L.STEPS
        for t, (a, b) in enumerate(zip(resumed["trajectory"], full["trajectory"])):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {t} differs after resume"
        assert all(torch.equal(x, y) for x, y in zip(resumed["compute"], full["compute"]))


def test_a_damaged_round_state_is_refused_on_every_rank_naming_the_file(results):
    errors = [r["damaged"]["error"] for r in results]
    name = results[0]["damaged"]["file"]
    assert name == "__1_0.distcp"  # rank 1's round state lies in its own DCP file
    assert errors[0] == errors[1], errors
    assert errors[0] is not None and errors[0].startswith("CheckpointError") and f"{name}: expected xxh3_64" in errors[0], \
        errors[0]


# ----------------------------------------------------------------- what the front end takes (in process)
LOWBIT_SWITCHES = {"comm_quantization": "int8", "error_feedback": True, "all_gather_quantization": "int8",
                   "estimate_quantization": "int4", "quantization_block_size": 64}


@pytest.mark.parametrize("block", [
    LOWBIT_SWITCHES, {"all_gather_quantization": "int8_estimate"},
    dict(LOWBIT_SWITCHES, mode="fastest", policy="fastest", auto={"streaming": False}),
])
def test_the_fsdp_front_end_takes_every_low_bit_switch(block):
    from ds_acco.fsdp.options import fsdp_config

    config = fsdp_config(dict(block, backend="fsdp"))
    assert {k: getattr(config, k) for k in block if k not in ("auto",)} == \
        {k: "auto" if v == "fastest" else v for k, v in block.items() if k not in ("auto",)}


@pytest.mark.parametrize("block, field, value, allowed", [
    ({"mode": "streaming"}, "acco.mode", "'streaming'", "allowed there: 'sync', 'dpu', 'acco', 'auto'"),
    ({"mode": "fastest", "auto": {"streaming": True}}, "acco.auto.streaming", "True", "allowed there: false"),
])
def test_streaming_is_refused_at_start_up_naming_the_field_and_why(block, field, value, allowed):
    """Refused before any process group or FSDP2 work (this process has none), by acco_fully_shard itself."""
    from ds_acco.config.front_ends import REFUSALS
    from ds_acco.errors import AccoConfigError
    from ds_acco.fsdp import acco_fully_shard, load_job_config

    with pytest.raises(AccoConfigError) as exc:
        acco_fully_shard(W.make_model(), acco_config=dict(block, backend="fsdp"), gradient_accumulation_steps=2)
    message = str(exc.value)
    assert message.startswith(f"{field}: got {value} on the FSDP2 (ds_acco.fsdp.acco_fully_shard) front end")
    assert allowed in message and "Why: " in message
    assert [r.why for r in REFUSALS if f"acco.{r.field}" == field][0] in message
    # "enabled": false is stock FSDP2: the block's switches are not read
    assert load_job_config({"acco": dict(block, backend="fsdp", enabled=False)}).acco["enabled"] is False


def test_the_low_bit_preset_reads_as_the_deepspeed_one():
    """ds_configs/fsdp_auto_lowbit.json is auto_lowbit.json's acco block for FSDP2 (no auto.streaming), and
    ``warmup_steps: "scheduler"`` reads the WarmupLR block's steps, as on DeepSpeed."""
    import json
    import os

    from ds_acco.errors import AccoConfigError
    from ds_acco.fsdp.options import fsdp_config, load_job_config

    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds_configs")
    job = load_job_config(os.path.join(configs, "fsdp_auto_lowbit.json"))
    with open(os.path.join(configs, "auto_lowbit.json"), encoding="utf-8") as f:
        deepspeed = json.load(f)["acco"]
    assert {k: v for k, v in job.acco.items() if k != "backend"} == deepspeed
    config = fsdp_config(job.acco)
    assert (config.mode, config.all_gather_quantization, config.estimate_quantization) == ("auto", "int8", "int4")
    with open(os.path.join(configs, "fsdp_acco.json"), encoding="utf-8") as f:
        raw = json.load(f)
    raw["acco"]["warmup_steps"] = "scheduler"
    assert load_job_config(raw).acco["warmup_steps"] == raw["scheduler"]["params"]["warmup_num_steps"] == 10
    with pytest.raises(AccoConfigError, match="acco.warmup_steps: got 'scheduler', but the config has no scheduler"):
        load_job_config(dict(raw, scheduler=None))
