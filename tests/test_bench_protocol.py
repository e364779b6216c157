"""The long-run protocol without launching anything: which runs its parts plan (every config on every bed and link,
one workload per bed, budgets equal in tokens, the rate decayed to the budget's end in every config, the other
sweeps' configs untouched) and the driver's plan, estimate and resume. Its report: tests/test_long_runs_report.py.
No launch: a smoke-sized protocol (``python -m benchmarks.protocol --steps 6 ...``) takes minutes of launches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re

import pytest
import torch
from deepspeed.runtime import lr_schedules

from benchmarks import results_file
from benchmarks.protocol import driver as protocol
from benchmarks.protocol import plans as plans_long
from benchmarks.report.repeats import bed_of
from benchmarks.sweep import configs as cfgs
from benchmarks.sweep import plans
from benchmarks.sweep.commands import launcher_args, prepare_run
from benchmarks.sweep.specs import spec_of
from ds_acco.optim.lr_schedule import LrScheduleClock

LINKS = {"long-real": {None, "100mbit", "25mbit"}, "long-real-host1@50%": {None, "100mbit"},
         "long-sleep": {None, "100mbit"}, "long-workers-2h": {None, "100mbit"}, "long-workers-4h": {None, "100mbit"},
         "long-workers-8h": {None, "100mbit"}, "long-workers-4h-slow": {None, "100mbit"}}
HOSTS = {"long-workers-4h": 4, "long-workers-8h": 8, "long-workers-4h-slow": 4}


def _bed(spec) -> str:
    return spec.note + "".join(f"-host{h}@{q:g}%" for h, q in spec.cpu_quota)


def _long(**kw):
    return plans.build_sweep("full", netns=True, root=True, only=list(plans_long.PARTS), **kw)


def test_every_config_runs_on_every_bed_and_link_with_one_workload_per_bed(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    sweep = _long(seed=3)
    assert sweep.timeout_s >= 2400 and "workers_real_4 skipped: 4 hosts need a core each" in sweep.description
    every = set(plans_long.LONG) | set(plans_long.torchft_configs())
    beds = {}
    for spec in sweep.runs:
        beds.setdefault(_bed(spec), []).append(spec)
    assert set(beds) == set(LINKS)
    for bed, specs in beds.items():
        wanted = every if bed in ("long-real", "long-real-host1@50%", "long-sleep") else set(plans_long.WORKERS)
        assert {(s.config, s.rate) for s in specs} == {(c, r) for c in wanted for r in LINKS[bed]}, bed
        same = {dataclasses.replace(s.workload, frontend="deepspeed") for s in specs}  # torchft: another script
        assert len(same) == 1, bed
        (wl,) = same
        hosts = HOSTS.get(bed, 2)
        assert {s.hosts for s in specs} == {hosts}
        nominal = wl.micro_batch * wl.grad_accum * wl.seq_len * hosts
        steps = 100 if bed.startswith("long-real") else 300
        assert (wl.lr_schedule, wl.lr_total_steps, wl.max_tokens, wl.seed) == ("decay", steps, steps * nominal, 3)
        assert wl.max_tokens // wl.eval_every_tokens == (20 if steps == 100 else 30)
        assert {s.workload.frontend for s in specs if s.config.startswith("torchft")} <= {"torchft"}
    sleep = {_bed(s): (s.workload.compute_delay_ms, s.workload.micro_batch, s.workload.seq_len) for s in sweep.runs
             if "real" not in s.note}
    assert sleep == {"long-sleep": ("30", 4, 128), "long-workers-2h": ("80", 2, 64), "long-workers-4h": ("80", 2, 64),
                     "long-workers-8h": ("80", 2, 64), "long-workers-4h-slow": ("80,80,80,160", 2, 64)}
    assert len({s.run_id for s in sweep.runs}) == len(sweep.runs)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    four = plans.build_sweep("full", netns=True, root=True, only=["workers_real_4"])
    assert {(s.note, s.hosts, s.config) for s in four.runs} == {("long-real-4h", 4, c) for c in plans_long.WORKERS}


def test_the_plan_adapts_to_the_machine_and_leaves_the_other_sweeps_alone():
    """No root: the slow host sleeps instead; no namespaces: unshaped runs only; the smoke sweep refuses a long part;
    no other part's runs carry a schedule, and the default parts are unchanged."""
    slow = plans.build_sweep("full", netns=True, root=False, only=["long_real_slow_host"]).runs
    assert {(s.note, s.cpu_quota, s.workload.compute_delay_ms) for s in slow} == {("long-real-delay", (), "0,250")}
    assert {s.rate for s in plans.build_sweep("full", netns=False, root=True, only=["long_real"]).runs} == {None}
    picked = plans.build_sweep("full", netns=True, root=True, only=["long_sleep"], configs=["sync", "sync_lowbit"],
                               rates=["unshaped", "25mbit"], steps=6).runs
    assert {(s.config, s.rate, s.workload.lr_total_steps) for s in picked} == {
        (c, r, 6) for c in ("sync", "sync_lowbit") for r in (None, "25mbit")}
    with pytest.raises(ValueError, match="run in sweep 'full'"):
        plans.build_sweep("smoke", netns=True, root=True, only=["long_sleep"])
    assert not set(plans_long.PARTS) & set(plans.DEFAULT_PARTS)
    decayed = ("fsdp_time_to_loss",)  # the FSDP2 comparison follows the protocol: its budget decays too
    others = [p for p in plans.PARTS if p not in plans_long.PARTS + decayed]
    for name in ("smoke", "full"):
        runs = plans.build_sweep(name, netns=True, root=True, only=others).runs
        assert runs and all(r.workload.lr_schedule == "" and r.workload.lr_total_steps == 0 for r in runs)
        fsdp = plans.build_sweep(name, netns=True, root=True, only=list(decayed)).runs
        assert fsdp and all(r.workload.lr_schedule == "decay" and r.workload.lr_total_steps > 0 for r in fsdp)


def _tokens_per_schedule_step(cfg: dict, hosts: int, seq_len: int) -> int:
    return cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * seq_len * hosts


def test_the_decayed_schedule_is_the_only_change_and_ends_at_the_budget_in_tokens():
    """Every config's schedule spans the same tokens (sync at half the batch: twice the steps); the option changes
    nothing but the scheduler, and without it the templates' scheduler is untouched."""
    for kind in cfgs.LR_SCHEDULES:
        for name in [c for c in plans_long.LONG if c in cfgs.CONFIGS]:
            plain = cfgs.make_config(name, micro_batch=8, grad_accum=4, warmup_steps=2)
            assert cfgs.make_config(name, micro_batch=8, grad_accum=4, warmup_steps=2, lr_schedule="") == plain
            assert plain["scheduler"]["type"] == "WarmupLR"
            cfg = cfgs.make_config(name, micro_batch=8, grad_accum=4, warmup_steps=2, lr_schedule=kind,
                                   lr_total_steps=100)
            cfgs.validate(cfg)
            assert {k: v for k, v in cfg.items() if k != "scheduler"} == {
                k: v for k, v in plain.items() if k != "scheduler"}, name
            params = cfg["scheduler"]["params"]
            per = _tokens_per_schedule_step(cfg, 2, 128)
            assert (cfg["scheduler"]["type"], params["total_num_steps"] * per) == (
                {"decay": "WarmupDecayLR", "cosine": "WarmupCosineLR"}[kind], 100 * 8 * 4 * 128 * 2), name
            assert params["warmup_num_steps"] * per == 10 * 8 * 4 * 128 * 2, name  # the same warm-up in tokens
            if kind == "decay":
                assert params == dict(plain["scheduler"]["params"], total_num_steps=params["total_num_steps"])
    for bad, match in ((("linear", 10), "lr_schedule"), (("decay", None), "lr_total_steps"),
                       (("cosine", 0), "lr_total_steps")):
        with pytest.raises(ValueError, match=match):
            cfgs.make_config("sync", micro_batch=1, grad_accum=2, lr_schedule=bad[0], lr_total_steps=bad[1])


@pytest.mark.parametrize("kind", cfgs.LR_SCHEDULES)
def test_a_config_at_a_scaled_learning_rate_differs_from_its_base_in_the_rate_alone(kind):
    """The learning-rate check's configs: the optimizer's rate and the schedule's peak scaled, the schedule's shape
    (warm-up, decay, its end in tokens) and everything else the base config's; DeepSpeed's scheduler then peaks at
    the scaled rate."""
    for name in cfgs.LR_SCALED:
        base, scale = cfgs.lr_scaled(name)
        assert name in cfgs.CONFIGS and scale in (0.5, 2.0, 4.0) and base in plans_long.LONG
        assert (name in cfgs.HALF_BATCH) == (base in cfgs.HALF_BATCH)
        kw = dict(micro_batch=8, grad_accum=4, warmup_steps=2, lr_schedule=kind, lr_total_steps=100)
        cfg, plain = cfgs.make_config(name, **kw), cfgs.make_config(base, **kw)
        cfgs.validate(cfg)
        assert cfg["optimizer"]["params"].pop("lr") == pytest.approx(scale * plain["optimizer"]["params"].pop("lr"))
        params, base_params = cfg["scheduler"]["params"], plain["scheduler"]["params"]
        if kind == "decay":
            assert params.pop("warmup_max_lr") == pytest.approx(scale * base_params.pop("warmup_max_lr"))
        assert cfg == plain, name
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=cfgs.make_config(name, **kw)["optimizer"]["params"]["lr"])
        sched = cfgs.make_config(name, **kw)["scheduler"]
        lr_at = getattr(lr_schedules, sched["type"])(opt, **sched["params"])
        peak = 0.0
        for _ in range(sched["params"]["warmup_num_steps"] + 1):
            opt.step()
            lr_at.step()
            peak = max(peak, opt.param_groups[0]["lr"])
        assert peak == pytest.approx(scale * 1e-3, rel=0.02), (name, kind)
    assert cfgs.lr_scaled("sync_lowbit_half") is None


@pytest.mark.parametrize("name", ["sync_lowbit", "sync_lowbit_half", "acco_lowbit_int4_fixed",
                                  "acco_lowbit_int4_adaptive", "auto_lowbit_int4"])
def test_the_rate_reaches_its_end_at_the_budget_under_each_lr_clock(name):
    """DeepSpeed's WarmupDecayLR stepped as ds_acco steps it: once per commit (fixed policy and sync), or by
    committed tokens (adaptive and auto) with commits of any size. In every config the scheduler has taken one step
    per step's worth of committed tokens, so it takes its last step when the budget's tokens are in: the rate stays
    above 0 until then and is 0 from the step after (DeepSpeed's first step sets iteration 0)."""
    G, N, budget_steps = 4, 2, 30
    cfg = cfgs.make_config(name, micro_batch=1, grad_accum=G, lr_schedule="decay", lr_total_steps=budget_steps)
    g, params = cfg["gradient_accumulation_steps"], cfg["scheduler"]["params"]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg["optimizer"]["params"]["lr"])
    sched = lr_schedules.WarmupDecayLR(opt, **params)
    clock = LrScheduleClock(g * N, by_tokens=cfg["acco"].get("policy", "fixed") != "fixed")
    sizes = [3, 9, 1, 14, 6, 8, 2, 11] if clock.by_tokens else [g * N]
    budget, committed, trace = budget_steps * G * N, 0, []
    assert params["total_num_steps"] * g * N == budget and params["warmup_num_steps"] * g * N == 10 * G * N
    while committed < budget + 2 * max(sizes):
        size = sizes[len(trace) % len(sizes)]
        for _ in range(clock.advances(size)):
            sched.step()
        committed += size
        assert sched.last_batch_iteration + 1 == committed // (g * N), (name, committed)
        trace.append((committed, sched.last_batch_iteration + 1, opt.param_groups[0]["lr"]))
    total, warm = params["total_num_steps"], params["warmup_num_steps"]
    assert [s >= total for c, s, _ in trace] == [c >= budget for c, _, _ in trace]
    assert all(v > 0 for _, s, v in trace if warm < s <= total) and all(v == 0 for _, s, v in trace if s > total)
    assert any(s > total for _, s, _ in trace)


def test_prepare_run_writes_the_schedule_and_rows_read_back(tmp_path):
    """A long run's config.json holds the decayed schedule; every other sweep's config.json is, byte for byte, what
    make_config wrote before the option existed (called without it); a row reads back into its spec."""
    others = [p for p in plans.PARTS if p not in plans_long.PARTS]
    for name in ("smoke", "full"):
        for old in plans.build_sweep(name, netns=True, root=True, only=others).runs:
            if old.workload.frontend != "deepspeed":
                continue
            run_dir, path = prepare_run(old, str(tmp_path / name))
            wl = old.workload
            want = cfgs.make_config(old.config, micro_batch=wl.micro_batch, grad_accum=wl.grad_accum,
                                    warmup_steps=wl.warmup_steps,
                                    telemetry_jsonl=os.path.join(run_dir, "telemetry.jsonl"),
                                    max_micro_batches_per_round=wl.max_micro_batches_per_round,
                                    streaming_sync_every=wl.streaming_sync_every)
            with open(path, encoding="utf-8") as f:
                assert f.read() == json.dumps(want, indent=1), old.run_id
    spec = next(s for s in _long().runs if s.config == "sync_lowbit_half")
    run_dir, path = prepare_run(spec, str(tmp_path))
    with open(path, encoding="utf-8") as f:
        sched = json.load(f)["scheduler"]
    assert (sched["type"], sched["params"]["total_num_steps"], sched["params"]["warmup_num_steps"]) == (
        "WarmupDecayLR", 200, 20)
    row = {"scenario": spec.scenario, "config": spec.config, "workload": dataclasses.asdict(spec.workload),
           "hosts": spec.hosts, "rate": spec.rate or "unshaped",
           "cpu_quota": {f"host{h}": q for h, q in spec.cpu_quota},
           "note": spec.note}
    assert dataclasses.replace(spec_of(row), cpus=spec.cpus) == spec
    old = {k: v for k, v in row["workload"].items() if not k.startswith("lr_")}  # a row from before the option
    assert spec_of(dict(row, workload=old)).workload.lr_schedule == ""
    late = spec_of(dict(row, delay="25ms"))  # a link with latency: its own run id and bed
    assert late.delay == "25ms" and late.run_id == spec.run_id + "-lat25ms"
    assert bed_of(dict(row, delay="25ms")) == bed_of(dict(row, delay="0.025s")) == bed_of(row) + "-lat25ms"


# --------------------------------------------------------------------------- the report's arithmetic


def test_the_driver_plans_resumes_and_estimates(tmp_path, capsys):
    entries = protocol.plan(["sleep", "real"], [1, 2], str(tmp_path), netns=True, root=True)
    assert [(e["bed"], e["seed"], e["part"]) for e in entries] == [
        ("sleep", 1, "long_sleep"), ("real", 1, "long_real"), ("sleep", 2, "long_sleep"), ("real", 2, "long_real")]
    first = entries[0]
    sweep = plans.build_sweep("full", netns=True, root=True, only=["long_sleep"], seed=1)
    os.makedirs(first["folder"])
    kept = [{"id": r.run_id, "ok": True} for r in sweep.runs[:5]] + [{"id": sweep.runs[5].run_id, "ok": False}]
    with open(os.path.join(first["folder"], "results.json"), "w", encoding="utf-8") as f:
        json.dump({"runs": kept}, f)
    again = protocol.plan(["sleep"], [1], str(tmp_path), netns=True, root=True)[0]
    assert (again["runs"], again["done"]) == (first["runs"], 5) and 0 < again["left_s"] < first["left_s"]
    cmd = protocol.command(first, argparse.Namespace(steps=6, configs=None, rates=None, max_load=None, delay=None,
                                                     load_wait_budget_s=0, no_netns=False))
    assert cmd[2:] == ["benchmarks", "run", "--sweep", "full", "--only", "long_sleep", "--seed", "1", "--out",
                       first["folder"], "--resume", "--steps", "6", "--load-wait-budget-s", "0"]
    # a link's latency: its own run ids (a bed of its own in the report), passed on, and priced in the estimate
    late = protocol.plan(["sleep"], [1], str(tmp_path), netns=True, root=True, delay="25ms")[0]
    assert late["done"] == 0 and late["left_s"] > first["left_s"] and late["folder"].endswith("sleep_lat25ms_seed1")
    cmd = protocol.command(late, argparse.Namespace(steps=None, configs=None, rates=None, max_load=None,
                                                    delay="25ms", load_wait_budget_s=None, no_netns=False))
    assert cmd[-2:] == ["--delay", "25ms"]
    spec = plans.build_sweep("full", netns=True, root=True, only=["long_sleep"], seed=1, delay="25ms").runs[0]
    launch = launcher_args(spec, str(tmp_path), netns=True, timeout_s=60)
    assert launch[launch.index("--delay") + 1] == "25ms" and spec.run_id.endswith("-lat25ms")
    with pytest.raises(ValueError, match="delay: got '25'"):
        plans.build_sweep("full", netns=True, root=True, only=["long_sleep"], delay="25")
    with pytest.raises(ValueError, match="on loopback"):
        plans.build_sweep("full", netns=False, root=True, only=["long_sleep"], delay="25ms")
    est = {s.config: protocol.estimate_s(s) for s in sweep.runs if s.rate == "100mbit"}
    assert est["sync"] > est["sync_lowbit"] > 300 * 0.25 and est["sync_lowbit_half"] > est["sync_lowbit"]
    two, eight = (plans.build_sweep("full", netns=True, root=True, only=[f"workers_sleep_{n}"]).runs[0] for n in (2, 8))
    assert protocol.estimate_s(eight) > protocol.estimate_s(two) > 300 * 0.37
    assert protocol.main(["--dry-run", "--beds", "sleep", "--seeds", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| sleep \| 1 \| long_sleep \| \d+ \| 5 \|", out) and "the same command resumes" in out
    with pytest.raises(SystemExit):
        protocol.main(["--dry-run", "--beds", "moon"])


def test_a_resume_with_fewer_configs_keeps_the_folders_other_runs(tmp_path):
    """The protocol's ``--configs`` narrows the plan; the runs of the folder outside it must stay in results.json."""
    from benchmarks.sweep.load_gate import LoadGate
    from benchmarks.sweep.runner import run_sweep

    previous = results_file.load(os.path.join(cfgs.REPO, "bench_results", "long_runs", "workers_4_seed1"))
    sweep = plans.build_sweep("full", netns=True, root=True, only=["workers_sleep_4"], seed=1)
    ids = [r["id"] for r in previous["runs"]]
    narrow = dataclasses.replace(sweep, runs=[s for s in sweep.runs if s.run_id == ids[0]])  # done: nothing runs
    assert len(narrow.runs) == 1 and len(ids) == 3
    result = run_sweep(narrow, str(tmp_path), netns=True, gate=LoadGate(None), progress=False, previous=previous)
    assert sorted(r["id"] for r in result["runs"]) == sorted(ids)
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        assert sorted(r["id"] for r in json.load(f)["runs"]) == sorted(ids)


def test_each_run_is_timed_on_a_fixed_workload_and_a_table_says_whether_its_machines_were_alike():
    """The load gate times :mod:`benchmarks.cluster.cpu_probe` before each run (torch's thread count left as it was);
    the long-run summary compares a table's probes: alike within MACHINE_SPREAD, not alike beyond, unknown where a
    run predates the probe."""
    import torch

    from benchmarks.report.long_runs import summary as lrs
    from benchmarks.sweep.load_gate import LoadGate

    threads = torch.get_num_threads()
    load = LoadGate(None).wait()
    assert load["cpu_probe_ms"] > 0 and torch.get_num_threads() == threads

    def table(*probes):
        return {"sync": [{"cpu_probe_ms": p} for p in probes[:2]], "acco": [{"cpu_probe_ms": p} for p in probes[2:]]}

    assert lrs.machines(table(50.0, 51.0, 52.0)) == {"runs": 3, "probed": 3, "fastest_ms": 50.0, "slowest_ms": 52.0,
                                                     "rows_ms": (50.5, 52.0), "alike": True}
    assert lrs.machines(table(50.0, 51.0, 56.0))["alike"] is False  # rows 1.11x apart: the ratios mix machine speeds
    # single runs 1.07x apart, one noisy seed among others: the rows (medians) compare 1.02x apart
    assert lrs.machines(table(50.0, 53.5, 51.0, 51.5, 50.5))["alike"] is True

    def run(probe):
        return {"load": {"cpu_probe_ms": probe} if probe else {}}

    # a link's cost divides two runs of one config: not across machines (nor a probed run by an unprobed one)
    assert lrs.same_machine(run(50.0), run(52.0)) and lrs.same_machine(run(None), run(None), mixed=False)
    assert not lrs.same_machine(run(None), run(None))  # beside probed runs of its bed: unknown sessions
    assert not lrs.same_machine(run(50.0), run(56.0)) and not lrs.same_machine(run(50.0), run(None))
    unknown = lrs.machines(table(50.0, None, 50.0))
    assert unknown["alike"] is None and unknown["probed"] == 2
    # a real folder's runs predate the probe: the summary says the machines are unknown
    folder = os.path.join(cfgs.REPO, "bench_results", "long_runs", "workers_2_seed1")
    block = next(iter(lrs.summarize(lrs.collect([folder])).values()))
    assert block["machines"]["alike"] is None and block["machines"]["probed"] == 0
