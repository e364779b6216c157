"""The long-run protocol without launching anything: which runs its parts plan (every config on every bed and link,
one workload per bed, budgets equal in tokens, the rate decayed to the budget's end in every config, the other
sweeps' configs untouched), its report's arithmetic on synthetic result rows (targets at 50/75/100%, the delay
penalty, the link's cost, the workers' gain, the targets), the page block and the driver's plan and resume.
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

from benchmarks.protocol import driver as protocol
from benchmarks.protocol import plans as plans_long
from benchmarks.report import long_runs as lr
from benchmarks.report.long_runs import penalty_model as pm
from benchmarks.report.long_runs.plot import plot as plot_long
from benchmarks.report.pages import long_runs as page
from benchmarks.sweep import configs as cfgs
from benchmarks.sweep import plans
from benchmarks.sweep.commands import prepare_run
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


# --------------------------------------------------------------------------- the report's arithmetic


def _row(config, rate, seed, loss, secs, note="long-real", hosts=2, tokens=range(100, 1001, 100), compute=None):
    """A result row whose validation loss at ``t`` tokens is ``loss(t)``, reached at ``secs(t)`` training seconds;
    ``compute``: each rank's compute seconds per sync step."""
    curve = [{"step": i, "tokens": t, "val_loss": loss(t), "train_s": secs(t), "val_train_s": secs(t)}
             for i, t in enumerate(tokens, 1)]
    return {"id": f"time_to_loss-{config}-{rate}-{hosts}h-{note}", "scenario": "time_to_loss", "config": config,
            "rate": rate, "hosts": hosts, "note": note, "ok": True, "cpu_quota": {},
            "workload": {"seed": seed, "max_tokens": 1000, "lr_total_steps": 100},
            "curve": curve, "val_loss": curve[-1]["val_loss"], "tokens_last_step": curve[-1]["tokens"],
            "train_s": curve[-1]["train_s"], "mean_counts_per_commit": 8.0,
            "ranks": [{"sync_compute_s_per_step": compute} for _ in range(hosts)] if compute else []}


def base_loss(t):
    return 5 - 0.002 * t


def lag_loss(t):  # 50 tokens behind the baseline: ACCO's delay in this story
    return 5 - 0.002 * (t - 50)


ACCO = 26  # acco fixed's tokens per second on the real bed: sync low-bit's are 20


def _tokens_to(loss_value, lag=0.0):
    return (5 - loss_value * (1 + lr.TOLERANCE)) / 0.002 + lag


def _protocol(root, seeds=(1, 2, 3)):
    """Folders of a synthetic protocol: real compute at 100 Mbit/s and unshaped; the light sleep bed at 2 and 8
    hosts."""
    for seed in seeds:
        k = 1 + 0.1 * (seed - 1)  # seed 2 is the median
        real = [_row("sync", "100mbit", seed, base_loss, lambda t, k=k: k * t / 10),
                _row("sync_lowbit", "100mbit", seed, base_loss, lambda t, k=k: k * t / 20),
                _row("sync_lowbit", "unshaped", seed, base_loss, lambda t, k=k: k * t / 40),
                _row("acco_lowbit_int4_fixed", "100mbit", seed, lag_loss, lambda t, k=k: k * t / ACCO),
                _row("acco_lowbit_int4_fixed", "unshaped", seed, lag_loss, lambda t, k=k: k * t / 40),
                _row("auto_lowbit_int4", "100mbit", seed, lag_loss, lambda t, k=k: k * t / 30)]
        if seed != 3:  # one seed of adaptive never gets there
            real.append(_row("acco_lowbit_int4_adaptive", "100mbit", seed, base_loss, lambda t, k=k: k * t / 22))
        else:
            real.append(_row("acco_lowbit_int4_adaptive", "100mbit", seed, lambda t: 6.0, lambda t: t / 22))
        sleep = []
        for hosts, acco in ((2, 25), (8, 30)):
            note = f"long-workers-{hosts}h"
            sleep += [_row("sync", "100mbit", seed, base_loss, lambda t, k=k: k * t / 10, note, hosts,
                           compute=0.4 if hosts == 2 else 0.42),
                      _row("sync_lowbit", "100mbit", seed, base_loss, lambda t, k=k: k * t / 20, note, hosts),
                      _row("acco_lowbit_int4_fixed", "100mbit", seed, base_loss, lambda t, a=acco, k=k: k * t / a,
                           note, hosts)]
        for bed, rows in (("real", real), ("sleep", sleep)):
            folder = root / "bench_results" / "long_runs" / f"{bed}_seed{seed}"
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps({"runs": rows}))
    (root / "bench_results" / "sets.json").write_text(json.dumps({"protocol": {page.SET: {
        "folders": ["long_runs/*_seed*"]}}}))
    return sorted(str(p) for p in (root / "bench_results" / "long_runs").iterdir())


def test_targets_seconds_penalty_and_link_cost_on_synthetic_rows(tmp_path):
    summary = lr.summarize(lr.collect(_protocol(tmp_path)))
    block = summary[("long-real", "100mbit")]
    assert block["targets"] == pytest.approx({0.5: 4.0, 0.75: 3.5, 1.0: 3.0})
    low = block["rows"]["sync_lowbit"]
    for f, loss in ((0.5, 4.0), (0.75, 3.5), (1.0, 3.0)):
        each = [k * _tokens_to(loss) / 20 for k in (1.0, 1.1, 1.2)]
        assert low["seconds"][f]["each"] == pytest.approx(each)
        assert (low["seconds"][f]["median"], low["seconds"][f]["spread"]) == pytest.approx((each[1], each[2] - each[0]))
        assert low["vs_sync"][f] == pytest.approx(0.5) and low["link_cost"][f]["median"] == pytest.approx(2.0)
    fixed = block["rows"]["acco_lowbit_int4_fixed"]
    assert fixed["seconds"][0.75]["median"] == pytest.approx(1.1 * _tokens_to(3.5, 50) / ACCO)
    assert fixed["seconds"][1.0] == {"each": [None] * 3, "median": None, "spread": None, "reached": 0, "of": 3}
    assert fixed["link_cost"][0.5]["median"] == pytest.approx(40 / ACCO)
    assert fixed["vs_sync_lowbit"][0.75] == pytest.approx(20 * (_tokens_to(3.5) + 50) / ACCO / _tokens_to(3.5))
    for c in (0.25, 0.5, 0.75):  # the delay penalty fades as the run goes on, and is None where never reached
        loss = 5 - 0.002 * 1000 * c
        assert fixed["penalty"][c]["median"] == pytest.approx((_tokens_to(loss) + 50) / _tokens_to(loss))
    assert fixed["penalty"][0.25]["median"] > fixed["penalty"][0.75]["median"] > 1
    assert fixed["penalty"][1.0]["reached"] == 0 and low["penalty"][0.5]["median"] == pytest.approx(1.0)
    model = block["penalty_model"]  # acco fixed's 50 tokens behind fade as 1/tokens: the lr-scaled model fits better
    assert model["holds"] is True and model["p_rate_scaled"] > model["p_constant"] > 0
    assert model["preset"] == 0.05 and model["warmup"] == pytest.approx(0.1)
    assert [r["measured"] for r in model["rows"]] == [fixed["penalty"][c]["median"] for c in lr.CHECKPOINTS
                                                      if fixed["penalty"][c]["median"] is not None]
    adaptive = block["rows"]["acco_lowbit_int4_adaptive"]["seconds"][0.75]
    assert (adaptive["reached"], adaptive["of"]) == (2, 3)
    assert adaptive["median"] == pytest.approx((1.0 + 1.1) / 2 * _tokens_to(3.5) / 22)
    gains = {w["hosts"]: (w["gain_fixed"], w["gain_best"]) for w in lr.workers(summary)}
    assert gains == {2: pytest.approx((25 / 20, 25 / 20)), 8: pytest.approx((30 / 20, 30 / 20))}
    got = {t["target"].split(" (")[0]: (t["value"], t["met"]) for t in lr.targets(summary)}
    assert got["the better ACCO vs the better sync low-bit to the baseline's 75% loss"] == (
        pytest.approx(20 / ACCO * (_tokens_to(3.5) + 50) / _tokens_to(3.5), abs=1e-4), True)
    assert got["acco fixed vs sync low-bit at equal batch to the baseline's final loss"] == (None, False)
    assert got["auto_lowbit_int4 within 1.05x of the best config of all, on every bed"][1] is True
    assert got["auto_lowbit_int4 never worse than sync low-bit, on every bed"][1] is True
    assert got["the overlap's gain over sync low-bit at 8 workers at least its gain at 2"] == (
        pytest.approx(1.2), True)
    assert got["a step's compute at 8 workers within 1.10x of at 2"] == (pytest.approx(1.05), True)
    assert ("long-real", "unshaped") in summary and ("long-real", "unshaped") not in lr.shaped(summary)


def test_the_penalty_model_fits_what_made_the_points_and_tells_the_two_models_apart():
    warmup = 0.1
    assert pm.rate_share(0.05, warmup) == 1.0 and pm.rate_share(0.55, warmup) == pytest.approx(0.5)
    assert pm.mean_share(0.1, warmup) == pytest.approx(1.0)  # the rate climbs: the full penalty
    assert pm.mean_share(1.0, warmup) == pytest.approx(0.1 + 0.9 / 2, abs=1e-3)  # then a linear decay to 0
    xs = (0.1, 0.25, 0.5, 0.75, 1.0)
    scaled = pm.check([(x, x, 1 + 0.2 * pm.mean_share(x, warmup)) for x in xs], warmup, preset=0.05)
    assert scaled["p_rate_scaled"] == pytest.approx(0.2) and scaled["rms_rate_scaled"] == pytest.approx(0, abs=1e-9)
    assert scaled["holds"] is True and scaled["rows"][-1]["preset"] == pytest.approx(1 + 0.05 * 0.55, abs=1e-3)
    flat = pm.check([(0.05, 0.05, 1.6)] + [(x, x, 1.12) for x in xs] + [(0.9, None, 1.5)], warmup, preset=0.05)
    assert flat["p_constant"] == pytest.approx(0.12) and flat["rms_constant"] == pytest.approx(0, abs=1e-9)
    assert flat["holds"] is False and len(flat["rows"]) == 6 and [r["fitted"] for r in flat["rows"][:3]] == [
        False, False, True]  # the warm-up's points (0.05, and 0.1 at its end) are shown, not fitted
    assert pm.check([(0.5, None, 1.1), (0.05, 0.05, 1.2)], warmup, preset=0.05) is None


def test_the_report_writes_its_figures_and_draws_the_penalty(tmp_path, capsys):
    folders = _protocol(tmp_path)
    assert lr.main(folders + ["--dest", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "long_runs.json", encoding="utf-8") as f:
        written = json.load(f)
    fixed = written["summary"]["long-real 100mbit"]["rows"]["acco_lowbit_int4_fixed"]
    assert fixed["penalty"]["0.25"]["median"] > fixed["penalty"]["0.75"]["median"] > 1  # as the summary says
    assert (tmp_path / "out" / lr.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"and {tmp_path / 'out' / lr.PLOT}" in capsys.readouterr().out
    empty = tmp_path / "none"
    assert plot_long(lr.summarize({}), str(empty / "x.png")) is None and not empty.exists()


def test_the_page_block_reads_the_protocol_folders_or_says_no_runs_yet(tmp_path):
    empty = tmp_path / "empty"
    (empty / "bench_results").mkdir(parents=True)
    (empty / "bench_results" / "sets.json").write_text(json.dumps({"sets": {}}))
    assert page.long_runs(str(empty)) == f"{page.describe()}\n\n{page.NO_RUNS}"
    assert page.long_runs_summary(str(empty)) == page.NO_RUNS
    ours = page.long_runs()  # the repository: 2 and 8 workers ran, and the sleep bed unshaped (the link's cost)
    assert page.NO_RUNS not in ours and "| 8 | 100mbit |" in ours and "**Not run yet**" not in ours
    assert "**The link's cost: seconds" in ours and "\n| sleep bed, 100 Mbit/s | " in ours
    assert f"{plans_long.REAL_STEPS} nominal steps on real compute, {plans_long.SLEEP_STEPS} on" in page.describe()
    _protocol(tmp_path)
    text = page.long_runs(str(tmp_path))
    assert text.startswith(page.describe()) and page.NO_RUNS not in text
    each = [k * _tokens_to(3.5) / 20 for k in (1.0, 1.1, 1.2)]
    assert f"| {each[1]:.1f} ({each[2] - each[0]:.1f}) |" in text  # sync low-bit to the 75% loss: median (spread)
    assert "| real compute, 100 Mbit/s | 50%: 4.000 |" in text and "|  | 100%: 3.000 |" in text
    assert "never" in text and "(2/3)" not in text and "; 2/3)" in text  # adaptive: 2 of 3 seeds reached
    assert "| 8 | 100mbit |" in text and "| 1.50x | 1.50x | 0.42 s |" in text
    assert "| 2.00x |" in text and f"| {40 / ACCO:.2f}x |" in text  # the link's cost
    assert "| light sleep bed, 2 hosts, 100 Mbit/s |" not in text  # no unshaped run there: no row of dashes
    assert text.count("**not met**") == 1 and "| - | <= 0.9 | **not met** | acco fixed reached it in 0 of 3 seeds |" in text
    assert "| real compute, 100 Mbit/s | 1.202, 1.100, 1.067, - |" in text and "| lr-scaled (auto's) |" in text
    assert len(text.splitlines()) <= 60
    losing = page.loss_rows(str(tmp_path))  # the target acco fixed never reaches, and the penalty's row
    assert [r[0] for r in losing] == [
        "long runs: acco fixed vs sync low-bit at equal batch to the baseline's final loss (real compute, 100 Mbit/s)",
        "long runs: auto's preset charges acco's delay less than measured (real compute, 100 Mbit/s)"]
    assert losing[0][1] == "- (limit <= 0.9; acco fixed reached it in 0 of 3 seeds)"
    model = lr.summarize(lr.collect(page.folders(str(tmp_path))))[("long-real", "100mbit")]["penalty_model"]
    assert losing[1][1].startswith(f"5% against {100 * model['p_rate_scaled']:.0f}% fitted to acco fixed's penalty")
    assert page.loss_rows(str(empty)) == []
    short = page.long_runs_summary(str(tmp_path))  # BENCHMARKS.md: what ran, the targets, a link to every table
    assert short.startswith("What ran: real compute, 100 Mbit/s (3 seeds, 5 configs); light sleep bed, 2 hosts")
    assert f"]({page.PAGE})" in short and short.split("**The issue's targets**:\n\n")[1] == page.targets_table(
        lr.summarize(lr.collect(page.folders(str(tmp_path)))), issue_only=True)
    bed_check = "| a step's compute at 8 workers within 1.10x of at 2"  # a check of the bed: on the page only
    assert bed_check in text and bed_check not in short


def test_the_workers_table_shows_half_batch_sync_where_a_bed_ran_it(tmp_path):
    assert "half batch" not in page.workers_table(lr.summarize(lr.collect(_protocol(tmp_path / "without"))))
    for folder in _protocol(tmp_path / "with"):
        if "sleep" in folder:  # half-batch sync on the 2-host bed: twice sync low-bit's speed, faster than acco
            with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
                runs = json.load(f)
            seed = runs["runs"][0]["workload"]["seed"]
            runs["runs"].append(_row("sync_lowbit_half", "100mbit", seed, base_loss, lambda t: t / 40,
                                     "long-workers-2h", 2))
            with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as f:
                json.dump(runs, f)
    table = page.workers_table(lr.summarize(lr.collect(page.folders(str(tmp_path / "with")))))
    header, _, two, eight = table.splitlines()
    assert "| sync low-bit | sync low-bit, half batch | acco fixed |" in header
    assert "| the better sync low-bit / the faster acco | a step's compute |" in header
    assert two.endswith(f"| 1.25x | 1.25x | {25 / 40 / 1.1:.2f}x | 0.40 s |")  # acco fixed 25/1.1 (median seed),
    # half-batch sync 40 tokens/s; the 8-host bed did not run it: its better sync is sync low-bit
    assert eight.split(" | ")[4] == "-" and eight.endswith("| 1.50x | 1.50x | 1.50x | 0.42 s |")


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
    cmd = protocol.command(first, argparse.Namespace(steps=6, configs=None, rates=None, max_load=None,
                                                     load_wait_budget_s=0, no_netns=False))
    assert cmd[2:] == ["benchmarks", "run", "--sweep", "full", "--only", "long_sleep", "--seed", "1", "--out",
                       first["folder"], "--resume", "--steps", "6", "--load-wait-budget-s", "0"]
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

    with open(os.path.join(cfgs.REPO, "bench_results", "long_runs", "workers_4_seed1", "results.json"),
              encoding="utf-8") as f:
        previous = json.load(f)
    sweep = plans.build_sweep("full", netns=True, root=True, only=["workers_sleep_4"], seed=1)
    ids = [r["id"] for r in previous["runs"]]
    narrow = dataclasses.replace(sweep, runs=[s for s in sweep.runs if s.run_id == ids[0]])  # done: nothing runs
    assert len(narrow.runs) == 1 and len(ids) == 3
    result = run_sweep(narrow, str(tmp_path), netns=True, gate=LoadGate(None), progress=False, previous=previous)
    assert sorted(r["id"] for r in result["runs"]) == sorted(ids)
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        assert sorted(r["id"] for r in json.load(f)["runs"]) == sorted(ids)


def test_a_link_without_the_baseline_takes_its_targets_from_the_same_seeds_run_on_another(tmp_path):
    """sync fp32's losses per token are the link's none of business: a 25 Mbit/s block with no sync run of its own
    measures its configs against the targets of the 100 Mbit/s sync run of the same folder; no sync row there."""
    folders = _protocol(tmp_path, seeds=(1,))
    real = next(f for f in folders if f.endswith("real_seed1"))
    with open(os.path.join(real, "results.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    runs.append(_row("sync_lowbit", "25mbit", 1, base_loss, lambda t: t / 10))
    with open(os.path.join(real, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"runs": runs}, f)
    summary = lr.summarize(lr.collect([real]))
    slow = summary[("long-real", "25mbit")]
    assert slow["targets"] == summary[("long-real", "100mbit")]["targets"] == pytest.approx(
        {0.5: 4.0, 0.75: 3.5, 1.0: 3.0})
    assert "sync" not in slow["rows"]
    assert slow["rows"]["sync_lowbit"]["seconds"][0.75]["median"] == pytest.approx(_tokens_to(3.5) / 10)


def test_the_overlap_targets_are_checked_on_the_sleep_bed_beside_real_compute(tmp_path):
    """The sleep bed (compute off the CPU) gets the overlap's two target rows of its own, labelled with its bed,
    its ratios from its own runs: acco fixed there reaches the final loss (no delay), unlike on real compute."""
    folder = tmp_path / "sleep_seed1"
    folder.mkdir()
    rows = [_row(c, "100mbit", 1, loss, secs, note="long-sleep") for c, loss, secs in (
        ("sync", base_loss, lambda t: t / 10), ("sync_lowbit", base_loss, lambda t: t / 20),
        ("sync_lowbit_half", base_loss, lambda t: t / 21), ("acco_lowbit_int4_fixed", base_loss, lambda t: t / 25),
        ("acco_lowbit_int4_adaptive", base_loss, lambda t: t / 24))]
    (folder / "results.json").write_text(json.dumps({"runs": rows}))
    got = {t["target"]: t for t in lr.targets(lr.summarize(lr.collect([str(folder)])))}
    better = got["the better ACCO vs the better sync low-bit to the baseline's 75% loss (sleep bed, 100 Mbit/s)"]
    assert better["value"] == pytest.approx(21 / 25, abs=1e-4) and better["met"] is True
    assert better["detail"] == "acco_lowbit_int4_fixed against sync_lowbit_half"
    final = got["acco fixed vs sync low-bit at equal batch to the baseline's final loss (sleep bed, 100 Mbit/s)"]
    assert final["value"] == pytest.approx(20 / 25, abs=1e-4) and final["met"] is True
    assert not any("real compute" in name for name in got)  # no real-compute runs, no real-compute rows
    assert better["about"] == final["about"] == "another bed"  # on the long-runs page, not BENCHMARKS.md's table


def test_a_target_missed_on_two_beds_is_one_row_of_where_ds_acco_loses(tmp_path):
    """BENCHMARKS.md's "where ds_acco loses": the overlap's targets missed on real compute and again on the sleep
    bed make one row each, the sleep bed's figure appended to the real bed's."""
    _protocol(tmp_path, seeds=(1,))
    folder = tmp_path / "bench_results" / "long_runs" / "sleepbed_seed1"
    folder.mkdir()
    rows = [_row(c, "100mbit", 1, loss, secs, note="long-sleep") for c, loss, secs in (
        ("sync", base_loss, lambda t: t / 10), ("sync_lowbit", base_loss, lambda t: t / 20),
        ("acco_lowbit_int4_fixed", lag_loss, lambda t: t / 21))]
    (folder / "results.json").write_text(json.dumps({"runs": rows}))
    losing = page.loss_rows(str(tmp_path))
    final = [r for r in losing if "acco fixed vs sync low-bit at equal batch" in r[0]]
    assert [r[0] for r in final] == ["long runs: acco fixed vs sync low-bit at equal batch to the baseline's final "
                                     "loss (real compute, 100 Mbit/s)"]
    assert final[0][1] == ("- (limit <= 0.9; acco fixed reached it in 0 of 1 seeds); sleep bed, 100 Mbit/s: "
                           "- (limit <= 0.9; acco fixed reached it in 0 of 1 seeds)")
