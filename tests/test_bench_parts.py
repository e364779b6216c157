"""The benchmark's pure parts, no launch: link and host units, the configs every sweep compares, the memory
model, the timeline plot's reconstruction, the sweep plans, and how a run's time to a loss is read. The emulated
cluster and the smoke sweep that launches jobs are in tests/test_bench_smoke.py.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.cluster import cli, hosts, units
from benchmarks.memory import model as memory
from benchmarks.report import plots
from benchmarks.sweep import configs, plans


def test_parsers_and_errors():
    assert units.parse_rate("100mbit") == 1e8 and units.parse_rate("1gbit") == 1e9
    assert units.parse_rate("2mbps") == 16e6 and units.parse_rate("unshaped") is None
    assert units.parse_delay("1ms") == pytest.approx(1e-3) and units.parse_delay(None) is None
    assert units.parse_host_map(["host1=50"], 2, "q") == {1: 50.0}
    assert units.parse_host_map(["host0=0:1,host1=1"], 2, "c", units.parse_cpu_list) == {0: (0, 1), 1: (1,)}
    for bad in ("fast", "-3mbit", "10 parsecs"):
        with pytest.raises(ValueError, match="rate"):
            units.parse_rate(bad)
    with pytest.raises(ValueError, match="host2 does not exist"):
        units.parse_host_map(["host2=50"], 2, "--cpu-quota")
    with pytest.raises(ValueError, match="loopback"):
        hosts.LocalCluster(2, rate=1e8, netns=False)
    with pytest.raises(ValueError, match=r"mtu: got 70000; allowed: 576..65535"):
        hosts.LocalCluster(2, mtu=70000)


def test_not_root_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["--hosts", "2", "--", "true"]) == 2
    assert "root is required" in capsys.readouterr().err


def test_configs_share_everything_but_the_gradient_path(tmp_path):
    from ds_acco.deepspeed.initialize import acco_config_of

    made = {name: configs.make_config(name, micro_batch=2, grad_accum=4, warmup_steps=1,
                                      telemetry_jsonl=str(tmp_path / "t.jsonl"))
            for name in configs.CONFIGS if name not in configs.LR_SCALED}  # (rate only: test_bench_protocol.py)
    for name, cfg in made.items():
        configs.validate(cfg)
        if name in configs.HALF_BATCH:  # half the batch, the same warm-up in tokens (and sync steps, in acco)
            assert cfg["gradient_accumulation_steps"] == 2 and cfg["scheduler"]["params"]["warmup_num_steps"] == (
                2 * made["zero1"]["scheduler"]["params"]["warmup_num_steps"])
            want = 2 if "acco" in name else 0 if name.startswith("streaming") else 1  # streaming has no sync steps
            assert acco_config_of(config=cfg).warmup_steps == want, name
            continue
        assert cfg["train_micro_batch_size_per_gpu"] == 2 and cfg["gradient_accumulation_steps"] == 4
        assert cfg["optimizer"] == made["zero1"]["optimizer"] and cfg["scheduler"] == made["zero1"]["scheduler"]
    assert "acco" not in made["zero1"] and made["zero1_overlap"]["zero_optimization"]["overlap_comm"] is True
    auto = {"fastest": "auto"}  # the preset's spelling of auto that HF Trainer's Accelerate lets through
    modes = {n: tuple(auto.get(v, v) for v in (c["acco"]["mode"], c["acco"].get("policy", "fixed")))
             for n, c in made.items() if "acco" in c}
    assert modes == {"sync": ("sync", "fixed"), "dpu": ("dpu", "fixed"), "acco_fixed": ("acco", "fixed"),
                     "acco_adaptive": ("acco", "adaptive"), "streaming_int8": ("streaming", "fixed"),
                     "streaming_fp32": ("streaming", "fixed"), "sync_lowbit": ("sync", "fixed"),
                     "acco_lowbit_fixed": ("acco", "fixed"), "acco_lowbit_adaptive": ("acco", "adaptive"),
                     "acco_bf16": ("acco", "fixed"), "acco_bf16_fp32acc": ("acco", "fixed"),
                     "auto_lowbit": ("auto", "fixed"), "sync_lowbit_half": ("sync", "fixed"),
                     "acco_lowbit_lrwarm": ("acco", "fixed"), "auto_lowbit_adaptive": ("auto", "adaptive"),
                     "auto_lowbit_policy": ("auto", "auto"), "auto_lowbit_policy_early": ("auto", "auto"),
                     "acco_lowbit_int4_fixed": ("acco", "fixed"), "acco_lowbit_int4_adaptive": ("acco", "adaptive"),
                     "auto_lowbit_int4": ("auto", "auto"), "auto_lowbit_int4_streaming": ("auto", "auto"),
                     "acco_lowbit_int4_fixed_half": ("acco", "fixed"), "streaming_int8_half": ("streaming", "fixed")}
    # int4 estimates: those five only, on the low-bit rounds
    assert {n for n, c in made.items() if c.get("acco", {}).get("estimate_quantization") == "int4"} == {
        "acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive", "auto_lowbit_int4", "auto_lowbit_int4_streaming",
        "acco_lowbit_int4_fixed_half"}
    half = dict(made["acco_lowbit_int4_fixed_half"]["acco"], warmup_steps=1)  # all else acco fixed's own
    assert half == made["acco_lowbit_int4_fixed"]["acco"]
    with pytest.raises(ValueError, match=r"grad_accum: got 6 for acco_lowbit_int4_fixed_half; allowed: a multiple"):
        configs.make_config("acco_lowbit_int4_fixed_half", micro_batch=2, grad_accum=6)
    # the preset that may switch to streaming: the shipped auto preset plus streaming_int8's schedule and wire
    streaming = made["auto_lowbit_int4_streaming"]["acco"]
    assert streaming.pop("auto") == dict(made["auto_lowbit_int4"]["acco"]["auto"], streaming=True)
    assert streaming.pop("streaming") == made["streaming_int8"]["acco"]["streaming"]
    assert streaming == {k: v for k, v in made["auto_lowbit_int4"]["acco"].items() if k != "auto"}
    # sync steps for as long as the learning rate warms up (lrwarm, and auto as measured before policy auto); the
    # others, the shipped auto preset among them, keep the benchmark's warm-up

    warm = made["zero1"]["scheduler"]["params"]["warmup_num_steps"]
    assert {n: acco_config_of(config=made[n]).warmup_steps for n in ("acco_lowbit_lrwarm", "auto_lowbit",
                                                                     "acco_lowbit_fixed", "auto_lowbit_policy_early")} == {
        "acco_lowbit_lrwarm": warm, "auto_lowbit": warm, "acco_lowbit_fixed": 1, "auto_lowbit_policy_early": 1}
    assert acco_config_of(config=made["auto_lowbit"]).auto.acco_step_penalty == 0.05
    for name in ("sync_lowbit", "acco_lowbit_fixed", "acco_lowbit_adaptive", "auto_lowbit", "sync_lowbit_half",
                 "acco_lowbit_lrwarm", "auto_lowbit_adaptive", "auto_lowbit_policy", "auto_lowbit_policy_early",
                 "acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive", "auto_lowbit_int4",
                 "auto_lowbit_int4_streaming", "acco_lowbit_int4_fixed_half"):
        acco = made[name]["acco"]
        assert (acco["comm_quantization"], acco["error_feedback"], acco["all_gather_quantization"]) == (
            "int8", True, "int8"), name
    assert made["zero1_bf16"]["bf16"] == {"enabled": True} and "bf16" not in made["zero1"]
    accum = {n: (made[n]["bf16"], made[n]["acco"]["grad_accum_dtype"], made[n]["acco"]["comm_dtype"])
             for n in ("acco_bf16", "acco_bf16_fp32acc")}
    assert accum == {"acco_bf16": ({"enabled": True}, "bf16", "bf16"),
                     "acco_bf16_fp32acc": ({"enabled": True}, "fp32", "bf16")}
    for name in ("streaming_int8", "streaming_fp32", "streaming_int8_half"):  # stage 0, the fragment schedule
        assert made[name]["zero_optimization"] == {"stage": 0}
        assert {k: made[name]["acco"]["streaming"][k] for k in configs.STREAMING_BLOCK} == configs.STREAMING_BLOCK
    assert made["streaming_int8"]["acco"]["streaming"]["quantize"] == "int8"
    assert made["streaming_fp32"]["acco"]["streaming"]["quantize"] == "none"
    assert made["streaming_int8_half"]["acco"] == made["streaming_int8"]["acco"]  # all but the batch and schedule
    assert all(c["acco"]["telemetry"]["jsonl_path"] == str(tmp_path / "t.jsonl") for c in made.values() if "acco" in c)


def test_memory_model():
    P, N = 1_000_000, 2
    assert memory.total("zero1", N, P) == pytest.approx(12 * P + 16 * P / N)
    assert memory.total("zero1_bf16", N, P) == pytest.approx(6 * P + 16 * P / N)
    assert memory.total("sync", N, P, constants=False) == pytest.approx(memory.total("zero1", N, P))
    assert memory.constant_bytes("sync", N, P) == 4 * min(P / N, 1 << 18)  # the chunked commit's scratch: a chunk
    # FSDP2 front end: a rank-major send buffer (comm dtype) and a publish shard on top
    packed = memory.total("acco_fixed", N, P, constants=False, packed=True)
    assert packed - memory.total("acco_fixed", N, P, constants=False) == pytest.approx(4 * P + 4 * P / N)
    assert memory.formula("acco_fixed") == "12·P + 20·P/N"
    for acco, full in (("acco_fixed", 0), ("acco_adaptive", 0), ("acco_bf16", 2 * P), ("acco_bf16_fp32acc", 4 * P)):
        base = memory.baseline(acco)
        extra = memory.total(acco, N, P) - memory.total(base, N, P) - memory.constant_bytes(acco, N, P)
        assert extra <= full + 4 * P / N + 2 * P / N * (acco == "acco_bf16"), acco  # the bounds
    # fp32: exactly the kept estimate shard; the chunked scratch is a constant
    assert memory.total("acco_fixed", N, P, constants=False) - memory.total("zero1", N, P) == pytest.approx(4 * P / N)
    assert memory.constant_bytes("acco_fixed", N, 10 ** 9) == memory.constant_bytes("acco_fixed", N, 10 ** 10)
    with pytest.raises(ValueError, match="config"):
        memory.total("streaming_int8", N, P)


def test_timeline_reconstruction():
    recs = [dict(index=0, kind="commit", mode="sync", counts=[2, 2], compute_s=1.0, round_s=0.5, waited_s=0.5),
            dict(index=1, kind="estimate", mode="acco", counts=[1, 1], compute_s=0.4, round_s=0.3, waited_s=0.0),
            dict(index=2, kind="commit", mode="acco", counts=[2, 2], compute_s=0.5, round_s=0.6, waited_s=0.1)]
    iv = plots.reconstruct(recs)
    assert iv[0]["comm"] == (1.0, 1.5) and iv[0]["wait"] == (1.0, 1.5)
    assert iv[1]["compute"] == (1.5, 1.9) and iv[1]["comm"][1] == pytest.approx(1.9)  # bootstrap: ends at swap
    assert iv[2]["comm"][0] == pytest.approx(1.9) and iv[2]["wait"] == (pytest.approx(2.4), pytest.approx(2.5))


def test_timeline_draws_the_fragment_rounds_of_auto_after_its_switch(tmp_path):
    """A sweep of one auto run that switched to streaming: its rounds after the switch are fragment rounds."""
    recs = [dict(index=0, kind="commit", mode="sync", counts=[4, 4], compute_s=1.0, round_s=1.4, waited_s=1.4),
            *(dict(index=i, kind="fragment", mode="streaming", counts=[4, 4], compute_s=1.3, round_s=0.4,
                   waited_s=0.0) for i in range(1, 5))]
    result = {"runs": [{"ok": True, "scenario": "time_to_loss", "config": "auto_lowbit_int4_streaming",
                        "rate": "25mbit", "timeline": [recs, recs]}]}
    path = plots.timeline(result, str(tmp_path / "timeline.png"))
    assert path and os.path.getsize(path) > 5000


def test_loopback_sweep_has_no_shaped_runs():
    sweep = plans.build_sweep("full", netns=False, root=False, rates=["unshaped", "10mbit"])
    assert {r.rate for r in sweep.runs if r.scenario == "bandwidth"} == {"unshaped"}
    assert {r.config for r in sweep.runs if r.scenario == "bandwidth"} == set(configs.DEFAULT_CONFIGS)
    streaming = [r for r in sweep.runs if r.scenario == "streaming"]
    assert {r.config for r in streaming} == set(configs.STREAMING_COMPARISON) and {r.rate for r in streaming} == {None}
    slow = [r for r in sweep.runs if r.scenario == "slow_host"]
    assert slow and all(not r.cpu_quota and r.workload.compute_delay_ms == "0,20" for r in slow)
    assert {r.workload.seed for r in sweep.runs} == {0}
    seeded = plans.build_sweep("full", netns=False, root=False, rates=["unshaped"], seed=3)
    assert [r.run_id for r in seeded.runs] == [r.run_id for r in plans.build_sweep(
        "full", netns=False, root=False, rates=["unshaped"]).runs] and {r.workload.seed for r in seeded.runs} == {3}
    with pytest.raises(ValueError, match="seed: got -1"):
        plans.build_sweep("full", netns=False, root=False, rates=["unshaped"], seed=-1)


def test_a_run_ends_when_its_slowest_rank_does():
    """Time to a loss reads validations at the slowest rank's clock (``val_train_s``, from ``examples/train_lm.py``)
    and the final validation at the summary's (the slowest rank's at the end). Rank 0's clock at its last step was
    what the final point used: a streaming rank 0 beside a slow host ended over a minute before the run did."""
    from benchmarks.report.time_to_loss import seconds_to, val_time_points

    run = {"train_s": 90.0, "val_loss": 2.5, "curve": [
        {"step": 5, "train_s": 12.0, "val_loss": 3.0, "val_train_s": 20.0},  # rank 0's clock and rank 1's
        {"step": 6, "train_s": 14.0},                    # rank 0's own clock at its last step
    ]}
    assert val_time_points(run) == [(20.0, 3.0), (90.0, 2.5)]
    assert seconds_to(val_time_points(run), 2.5) == pytest.approx(90.0)
    assert val_time_points({"val_loss": 2.5, "curve": [{"step": 1, "train_s": 3.0}]}) == [(3.0, 2.5)]  # no summary
