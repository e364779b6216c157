"""The long-run report on synthetic result rows (tests/long_runs_rows.py): targets at 50/75/100% of the baseline's
budget, the delay penalty and its model, the link's cost, the workers' gain, the issue's targets, the page block
and BENCHMARKS.md's "where ds_acco loses" rows. No launch.
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.protocol import plans as plans_long
from benchmarks.report import long_runs as lr
from benchmarks.report.long_runs import batch_model as bm
from benchmarks.report.long_runs import penalty_model as pm
from benchmarks.report.long_runs.plot import plot as plot_long
from benchmarks.report.pages import long_runs as page
from benchmarks.report.pages import rate_check
from tests.long_runs_rows import (
    ACCO,
    base_loss,
    lag_loss,
    protocol,
    row,
    set_ranks,
    tokens_to,
    write_second_machine,
)


def test_targets_seconds_penalty_and_link_cost_on_synthetic_rows(tmp_path):
    summary = lr.summarize(lr.collect(protocol(tmp_path)))
    block = summary[("long-real", "100mbit")]
    assert block["targets"] == pytest.approx({0.5: 4.0, 0.75: 3.5, 1.0: 3.0})
    low = block["rows"]["sync_lowbit"]
    for f, loss in ((0.5, 4.0), (0.75, 3.5), (1.0, 3.0)):
        each = [k * tokens_to(loss) / 20 for k in (1.0, 1.1, 1.2)]
        assert low["seconds"][f]["each"] == pytest.approx(each)
        assert (low["seconds"][f]["median"], low["seconds"][f]["spread"]) == pytest.approx((each[1], each[2] - each[0]))
        assert low["vs_sync"][f] == pytest.approx(0.5) and low["link_cost"][f]["median"] == pytest.approx(2.0)
    fixed = block["rows"]["acco_lowbit_int4_fixed"]
    assert fixed["seconds"][0.75]["median"] == pytest.approx(1.1 * tokens_to(3.5, 50) / ACCO)
    assert fixed["seconds"][1.0] == {"each": [None] * 3, "median": None, "spread": None, "reached": 0, "of": 3}
    assert fixed["link_cost"][0.5]["median"] == pytest.approx(40 / ACCO)
    assert fixed["vs_sync_lowbit"][0.75] == pytest.approx(20 * (tokens_to(3.5) + 50) / ACCO / tokens_to(3.5))
    for c in (0.25, 0.5, 0.75):  # the delay penalty fades as the run goes on, and is None where never reached
        loss = 5 - 0.002 * 1000 * c
        assert fixed["penalty"][c]["median"] == pytest.approx((tokens_to(loss) + 50) / tokens_to(loss))
    assert fixed["penalty"][0.25]["median"] > fixed["penalty"][0.75]["median"] > 1
    assert fixed["penalty"][1.0]["reached"] == 0 and low["penalty"][0.5]["median"] == pytest.approx(1.0)
    model = block["penalty_model"]  # acco fixed's 50 tokens behind fade as 1/tokens: the lr-scaled model fits better
    assert model["holds"] is True and model["p_rate_scaled"] > model["p_constant"] > 0
    assert model["preset"] == 0.05 and model["warmup"] == pytest.approx(0.1)
    assert [r["measured"] for r in model["rows"]] == [fixed["penalty"][c]["median"] for c in lr.CHECKPOINTS
                                                      if fixed["penalty"][c]["median"] is not None]
    adaptive = block["rows"]["acco_lowbit_int4_adaptive"]["seconds"][0.75]
    assert (adaptive["reached"], adaptive["of"]) == (2, 3)
    assert adaptive["median"] == pytest.approx((1.0 + 1.1) / 2 * tokens_to(3.5) / 22)
    gains = {w["hosts"]: (w["gain_fixed"], w["gain_best"]) for w in lr.workers(summary)}
    assert gains == {2: pytest.approx((25 / 20, 25 / 20)), 8: pytest.approx((30 / 20, 30 / 20))}
    got = {t["target"].split(" (")[0]: (t["value"], t["met"]) for t in lr.targets(summary)}
    assert got["the better ACCO vs the better sync low-bit to the baseline's 75% loss"] == (
        pytest.approx(20 / ACCO * (tokens_to(3.5) + 50) / tokens_to(3.5), abs=1e-4), True)
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


def test_the_batch_model_reads_auto_s_noise_scale_and_tells_the_two_prices_apart(tmp_path):
    """Auto's price of a batch against half-batch sync's measured ratio: each choice's line gives the noise scale at
    its commit, the run's curve its tokens; with no noise every batch costs per committed step under both prices
    (half the tokens); with a noise scale as large as the batch the best-rate price says 0.75, the fixed rate about
    1 at the peak rate, falling towards a half as the rate decays."""
    log = tmp_path / "host0.log"
    log.write_text("ds_acco auto at step 2: compute ...; gradient noise scale 0.05 micro-batches (between ...), ...\n"
                   "other line\n"
                   "ds_acco auto at step 6: ... gradient noise scale 8.0 micro-batches (measured 7.1, ...): runs ...\n")
    curve = [{"step": k, "tokens": 100 * k} for k in range(1, 11)]
    assert bm.noise_curve(str(log), curve, 1000) == [(0.2, 0.05), (0.6, 8.0)]
    assert bm.noise_curve(str(tmp_path / "none.log"), curve, 1000) == [] and bm.noise_curve(str(log), curve, None) == []
    assert bm.noise_at([[(0.2, 0.05), (0.6, 8.0)], [(0.5, 2.0)]], 0.1) == pytest.approx((0.05 + 2.0) / 2)
    points = [(c, c, 0.5) for c in (0.05, 0.25, 0.5, 1.0)]
    quiet = bm.check(points, [[(0.0, 0.0)]], 4, 8, warmup=0.1)
    assert all(r["fixed_rate"] == pytest.approx(0.5) and r["best_rate"] == pytest.approx(0.5) for r in quiet["rows"])
    assert quiet["rms_fixed_rate"] == pytest.approx(0, abs=1e-9) and [r["compared"] for r in quiet["rows"]] == [
        False, True, True, True]
    noisy = bm.check(points, [[(0.0, 8.0)]], 4, 8, warmup=0.1)
    early, late = noisy["rows"][1], noisy["rows"][-1]
    assert early["fixed_rate"] > 0.9  # at the rate best for 8 micro-batches, 4 buy about nothing more per sample
    assert late["best_rate"] == pytest.approx(12 / 16) and 0.5 < late["fixed_rate"] < early["fixed_rate"]
    assert noisy["holds"] is (noisy["rms_fixed_rate"] <= noisy["rms_best_rate"]) is False  # measured: 0.5
    assert bm.check(points, [[]], 4, 8, warmup=0.1) is None and bm.check([(0.05, 0.05, 0.5)], [[(0, 1)]], 4, 8, 0.1) \
        is None
    ours = page.long_runs()  # the repository's runs: auto's logs beside half-batch sync on every two-host bed
    assert "**Auto's price of a batch" in ours and "| fixed rate (auto's) |" in ours


def test_the_report_writes_its_figures_and_draws_the_penalty(tmp_path, capsys):
    folders = protocol(tmp_path)
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
    protocol(tmp_path)
    text = page.long_runs(str(tmp_path))
    assert text.startswith(page.describe()) and page.NO_RUNS not in text
    each = [k * tokens_to(3.5) / 20 for k in (1.0, 1.1, 1.2)]
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
    assert "half batch" not in page.workers_table(lr.summarize(lr.collect(protocol(tmp_path / "without"))))
    for folder in protocol(tmp_path / "with"):
        if "sleep" in folder:  # half-batch sync on the 2-host bed: twice sync low-bit's speed, faster than acco
            with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
                runs = json.load(f)
            seed = runs["runs"][0]["workload"]["seed"]
            runs["runs"].append(row("sync_lowbit_half", "100mbit", seed, base_loss, lambda t: t / 40,
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


def test_a_link_without_the_baseline_takes_its_targets_from_the_same_seeds_run_on_another(tmp_path):
    """sync fp32's losses per token are the link's none of business: a 25 Mbit/s block with no sync run of its own
    measures its configs against the targets of the 100 Mbit/s sync run of the same folder; no sync row there."""
    folders = protocol(tmp_path, seeds=(1,))
    real = next(f for f in folders if f.endswith("real_seed1"))
    with open(os.path.join(real, "results.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    runs.append(row("sync_lowbit", "25mbit", 1, base_loss, lambda t: t / 10))
    with open(os.path.join(real, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"runs": runs}, f)
    summary = lr.summarize(lr.collect([real]))
    slow = summary[("long-real", "25mbit")]
    assert slow["targets"] == summary[("long-real", "100mbit")]["targets"] == pytest.approx(
        {0.5: 4.0, 0.75: 3.5, 1.0: 3.0})
    assert "sync" not in slow["rows"]
    assert slow["rows"]["sync_lowbit"]["seconds"][0.75]["median"] == pytest.approx(tokens_to(3.5) / 10)


@pytest.mark.parametrize("note,quota,where", [("long-sleep", {}, "sleep bed, 100 Mbit/s"), (
    "long-real", {"host1": 50.0}, "real compute, one host at half speed, 100 Mbit/s")])
def test_the_overlap_targets_are_checked_on_other_beds_beside_real_compute(tmp_path, note, quota, where):
    """The sleep bed (compute off the CPU) and real compute with one host at half speed get the overlap's two
    target rows of their own, labelled with their bed, their ratios from their own runs (here acco fixed reaches
    the final loss: no delay)."""
    folder = tmp_path / "seed1"
    folder.mkdir()
    rows = [dict(row(c, "100mbit", 1, loss, secs, note=note), cpu_quota=quota) for c, loss, secs in (
        ("sync", base_loss, lambda t: t / 10), ("sync_lowbit", base_loss, lambda t: t / 20),
        ("sync_lowbit_half", base_loss, lambda t: t / 21), ("acco_lowbit_int4_fixed", base_loss, lambda t: t / 25),
        ("acco_lowbit_int4_adaptive", base_loss, lambda t: t / 24))]
    (folder / "results.json").write_text(json.dumps({"runs": rows}))
    got = {t["target"]: t for t in lr.targets(lr.summarize(lr.collect([str(folder)])))}
    better = got[f"the better ACCO vs the better sync low-bit to the baseline's 75% loss ({where})"]
    assert better["value"] == pytest.approx(21 / 25, abs=1e-4) and better["met"] is True
    assert better["detail"] == "acco_lowbit_int4_fixed against sync_lowbit_half"
    final = got[f"acco fixed vs sync low-bit at equal batch to the baseline's final loss ({where})"]
    assert final["value"] == pytest.approx(20 / 25, abs=1e-4) and final["met"] is True
    assert len(got) == 2  # no runs of real compute at full speed, no rows of it
    assert better["about"] == final["about"] == "another bed"  # on the long-runs page, not BENCHMARKS.md's table


def test_a_target_missed_on_two_beds_is_one_row_of_where_ds_acco_loses(tmp_path):
    """BENCHMARKS.md's "where ds_acco loses": the overlap's targets missed on real compute and again on the sleep
    bed make one row each, the sleep bed's figure appended to the real bed's."""
    protocol(tmp_path, seeds=(1,))
    folder = tmp_path / "bench_results" / "long_runs" / "sleepbed_seed1"
    folder.mkdir()
    rows = [row(c, "100mbit", 1, loss, secs, note="long-sleep") for c, loss, secs in (
        ("sync", base_loss, lambda t: t / 10), ("sync_lowbit", base_loss, lambda t: t / 20),
        ("acco_lowbit_int4_fixed", lag_loss, lambda t: t / 21))]
    (folder / "results.json").write_text(json.dumps({"runs": rows}))
    losing = page.loss_rows(str(tmp_path))
    final = [r for r in losing if "acco fixed vs sync low-bit at equal batch" in r[0]]
    assert [r[0] for r in final] == ["long runs: acco fixed vs sync low-bit at equal batch to the baseline's final "
                                     "loss (real compute, 100 Mbit/s)"]
    assert final[0][1] == ("- (limit <= 0.9; acco fixed reached it in 0 of 1 seeds); sleep bed, 100 Mbit/s: "
                           "- (limit <= 0.9; acco fixed reached it in 0 of 1 seeds)")


def test_auto_without_streaming_is_also_judged_against_what_it_may_run(tmp_path):
    """Streaming ahead of everything: auto without `auto.streaming` misses "the best config of all" (the issue's
    target, one of BENCHMARKS.md's losses) and meets "the best config that does not stream" (the long-runs page's
    reading of it, not a loss row of its own)."""
    folders = protocol(tmp_path, seeds=(1,))
    path = tmp_path / "bench_results" / "long_runs" / "real_seed1" / "results.json"
    data = json.loads(path.read_text())
    data["runs"].append(row("streaming_int8_half", "100mbit", 1, base_loss, lambda t: t / 60))
    path.write_text(json.dumps(data))
    got = {t["target"]: t for t in lr.targets(lr.summarize(lr.collect(folders)))}
    of_all = got["auto_lowbit_int4 within 1.05x of the best config of all, on every bed"]
    own = got["auto_lowbit_int4 within 1.05x of the best config that does not stream (what it may run), on every bed"]
    ratio = (tokens_to(3.5, 50) / 30) / (tokens_to(3.5) / 60)  # auto 50 tokens behind at 30 tokens/s; streaming 60
    assert (of_all["value"], of_all["met"]) == (pytest.approx(ratio, abs=1e-4), False)
    assert "streaming_int8_half" in of_all["detail"]
    assert (own["value"], own["met"]) == (pytest.approx(1.0), True) and "against auto_lowbit_int4" in own["detail"]
    losing = [r[0] for r in page.loss_rows(str(tmp_path))]
    assert any("best config of all" in r for r in losing) and not any("does not stream" in r for r in losing)


def test_a_config_that_reached_the_loss_in_one_seed_of_three_never_ranks_first():
    """Comparisons count a seed that never reached the loss as never: the fastest single seed of a config that
    missed in the other two does not beat a config that got there in every seed (the peer target read 1.01 from
    torchft Streaming DiLoCo's one seed of three at 25 Mbit/s before this rule)."""
    def fig(*each):
        return {0.75: {"each": list(each)}}

    block = {"rows": {"once": {"seconds": fig(100.0, None, None)}, "twice": {"seconds": fig(90.0, None, 130.0)},
                      "always": {"seconds": fig(120.0, 118.0, 125.0)}}}
    assert lr.seconds(block, "once") is None and lr.seconds(block, "twice") == 130.0
    assert lr.seconds(block, "always") == 120.0 and lr.best(block, ["once", "twice", "always"]) == ("always", 120.0)
    assert lr.seconds(block, "missing") is None and lr.best(block, ["once"]) == (None, None)


def test_the_host_cost_table_shows_what_a_round_takes_from_compute_where_runs_recorded_it(tmp_path):
    """Medians over ranks, then seeds: compute per micro-batch overlapped over in sync (none where no round
    overlapped) and what it adds to a step, the training thread's switches, the kernel's network time and the
    round's thread's CPU a step; a bed whose runs predate the figures has no row, and the table none without them."""
    from benchmarks.report.long_runs.summary import host_cost

    ranks = [{"compute_s_per_mb_overlapped": 0.33, "compute_s_per_mb_sync": 0.30, "preempted_per_step": 290.0,
              "softirq_s_per_step": 0.04, "micro_batches": 400, "comm_thread_cpu_s_per_round": 0.02, "rounds": 199,
              "gloo_cpu_s_per_step": 0.02},
             {"compute_s_per_mb_overlapped": 0.36, "compute_s_per_mb_sync": 0.30, "preempted_per_step": 310.0,
              "softirq_s_per_step": 0.05, "micro_batches": 400, "comm_thread_cpu_s_per_round": 0.03, "rounds": 199,
              "gloo_cpu_s_per_step": 0.03}]
    # 4 micro-batches a step, 0.03 and 0.06 s more each; two rounds a step (less the first step's estimate)
    assert host_cost({"ranks": ranks, "steps": 100}) == pytest.approx(
        {"tax": 1.15, "extra_s": 0.18, "switches": 300.0, "network_s": 0.045, "round_cpu_s": 0.04975,
         "gloo_s": 0.025})
    alone = host_cost({"ranks": [{"preempted_per_step": 200.0, "softirq_s_per_step": 0.01}]})
    assert alone["tax"] is None and alone["extra_s"] is None and alone["round_cpu_s"] is None
    assert alone["gloo_s"] is None  # runs that predate the figure
    assert page.host_table(lr.summarize(lr.collect(protocol(tmp_path / "without")))).count("\n") == 1  # header
    def ranks(config, seed):
        acco = config != "sync_lowbit"
        return [{"compute_s_per_mb_sync": 0.3, "preempted_per_step": 100.0 * seed + 1000 * acco,
                 "softirq_s_per_step": 0.01, "compute_s_per_mb_overlapped": 0.3 * (1 + 0.1 * seed) if acco else None}
                ] if config in ("sync_lowbit", "acco_lowbit_int4_fixed") else None
    set_ranks(protocol(tmp_path / "with"), ranks)
    header, _, real = page.host_table(lr.summarize(lr.collect(page.folders(str(tmp_path / "with"))))).splitlines()
    assert header.startswith("| bed | sync low-bit | sync low-bit, half batch | acco fixed | acco fixed, half batch |")
    assert real == "| real compute, 100 Mbit/s | -; 200; 10 ms; -; - | - | 1.20x; 1200; 10 ms; -; - | - | - | - |"


def test_the_seconds_caption_names_a_bed_that_ran_more_seeds():
    """One bed re-run with seeds 4 and 5 (to settle a close target): the caption must not say every bed's
    medians are over five seeds."""
    def block(*seeds):
        return {"rows": {"sync": {"seeds": list(seeds)}, "sync_lowbit": {"seeds": list(seeds[:2])}}}
    summary = {("long-real", "100mbit"): block(1, 2, 3), ("long-real", "25mbit"): block(1, 2, 3),
               ("long-sleep", "100mbit"): block(1, 2, 3, 4, 5)}
    assert page.seeds_phrase(summary) == "seeds 1, 2, 3 (sleep bed, 100 Mbit/s: 1, 2, 3, 4, 5)"
    del summary[("long-sleep", "100mbit")]
    assert page.seeds_phrase(summary) == "seeds 1, 2, 3"


def test_a_bed_re_run_on_a_second_machine_is_reported_apart_with_its_own_targets(tmp_path):
    """A bed re-run on another machine, every config together: its seconds and targets come from its own runs
    (its own sync fp32 sets the losses), and the first machine's tables do not take its seeds."""
    protocol(tmp_path)
    assert page.second_machine(str(tmp_path)) == page.NO_SECOND
    first = page.long_runs(str(tmp_path))
    write_second_machine(tmp_path, {f"real_seed{seed}": [
        row("sync", "100mbit", seed, base_loss, lambda t: t / 8),
        row("sync_lowbit", "100mbit", seed, base_loss, lambda t: t / 16),
        row("acco_lowbit_int4_fixed", "100mbit", seed, base_loss, lambda t: t / 32)]
        + ([row("zero1", "100mbit", seed, base_loss, lambda t: t / 64)] if seed == 4 else []) for seed in (4, 5, 6)})
    text = page.second_machine(str(tmp_path))
    assert page.long_runs(str(tmp_path)) == first
    assert "median over seeds 4, 5, 6 (spread;" in text and "| real compute, 100 Mbit/s | 50%: 4.000 |" in text
    assert f"| {tokens_to(3.5) / 16:.1f} (0.0) | {tokens_to(3.5) / 32:.1f} (0.0) |" in text  # the 75% loss
    assert ("| the better ACCO vs the better sync low-bit to the baseline's 75% loss (real compute, 100 Mbit/s) "
            "| 0.50 | <= 0.85 | met | acco_lowbit_int4_fixed against sync_lowbit; by seed (4, 5, 6): 0.50, 0.50, 0.50 |"
            ) in text
    assert "**not met**" not in text and "0 of 10 runs were timed" in text
    assert "| real compute, 100 Mbit/s | 1.14x | 1.14x | 0.74x |" in text  # whole runs over the first machine's
    assert text.endswith(f"Left out, run in fewer seeds: {lr.SHORT['zero1']} (seed 4).")  # faster, one seed
    assert ("; on a second machine, reported apart with its own targets: real compute, 100 Mbit/s (3 seeds, 4 "
            "configs). Every table") in page.long_runs_summary(str(tmp_path))


def test_a_target_gives_each_seed_s_ratio_where_seeds_pair():
    """A ratio of medians can pass a target one seed misses by far: the detail gives the seeds, "-" for a seed
    where either config never got there, nothing where fewer than two seeds pair."""
    def config(seeds, each):
        return {"seeds": list(seeds), "seconds": {0.75: {"each": list(each)}}}
    block = {"rows": {"a": config((4, 5, 6), (80.0, 66.0, None)), "b": config((6, 5, 4), (70.0, 81.0, 97.0)),
                      "c": config((4,), (50.0,))}}
    assert lr.by_seed(block, "a", "b") == "; by seed (4, 5, 6): 0.82, 0.81, -"
    assert lr.by_seed(block, "a", "c") == "" and lr.by_seed(block, "a", "zero1") == ""


def test_the_learning_rate_check_has_its_own_table_and_target_and_stays_out_of_the_seconds_table(tmp_path):
    """Sync and acco fixed at half the batch, each at half, once and twice the shared rate: the rates' own table
    (fastest per loss in bold), a target row for the two at their best rates beside the issue's, and the seconds
    table without them. Here the half batch's sync is fastest at twice the rate and acco at the rate everyone
    shares, so the pair at their best rates compares acco at 1x with sync at 2x; acco's delay column is its tokens
    over its sync's at each rate."""
    folders = protocol(tmp_path)
    speeds = {"sync_lowbit_half": 24, "sync_lowbit_half_lr05x": 21, "sync_lowbit_half_lr2x": 27,
              "acco_lowbit_int4_fixed_half": 30, "acco_lowbit_int4_fixed_half_lr05x": 28,
              "acco_lowbit_int4_fixed_half_lr2x": 29}
    for folder in folders:
        if "real_seed" not in folder:
            continue
        path = os.path.join(folder, "results.json")
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        seed = result["runs"][0]["workload"]["seed"]
        result["runs"] += [row(c, "100mbit", seed, lag_loss if c.endswith("fixed_half_lr2x") else base_loss,
                               lambda t, v=v: t / v) for c, v in speeds.items()]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f)
    summary = lr.summarize(lr.collect(folders))
    text = page.long_runs(str(tmp_path))
    seconds_table = text.split("**", 3)[2]
    assert "0.5x the rate" not in seconds_table and lr.SHORT["sync_lowbit_half"] in seconds_table
    assert "| real compute, 100 Mbit/s | sync low-bit, half batch | 0.5x |" in text
    t75 = tokens_to(3.5)
    for name, rate, speed in (("sync low-bit", "2x", 27), ("acco fixed", "1x", 30)):  # the fastest, in bold
        assert (f"|  | {name}, half batch | {rate} | **{tokens_to(4.0) / speed:.1f} (0.0)** | "
                f"**{t75 / speed:.1f} (0.0)** |") in text
    lagged = f"{(t75 + 50) / t75:.3f}"  # acco's delay at twice the rate: 50 tokens behind its sync there
    assert "| 3.0000 | 1.000 |" in text and "| 3.0000 | - |" in text and f"| {lagged} |" in text
    got = {t["target"]: t for t in lr.targets(summary)}
    issue = got["the better ACCO vs the better sync low-bit to the baseline's 75% loss (real compute, 100 Mbit/s)"]
    rate = got["the same, each at the best of the learning rates it ran at (real compute, 100 Mbit/s)"]
    assert issue["value"] == pytest.approx(24 / 30) and issue["detail"].startswith(
        "acco_lowbit_int4_fixed_half against sync_lowbit_half")
    assert rate["value"] == pytest.approx(27 / 30) and rate["about"] == "rate" and rate["detail"].startswith(
        "acco_lowbit_int4_fixed_half against sync_lowbit_half_lr2x")
    assert "each at the best of the learning rates" not in page.targets_table(summary, issue_only=True)
    (name, cells), (missed, value) = rate_check.loss_rows(summary, page.bed_name, "here")
    assert missed.endswith("each at its best learning rate") and value.startswith("0.90 (limit <= 0.85; acco_lowbit")
    assert name.startswith("acco fixed, half batch against sync at the same batch, by peak learning rate (here, real")
    assert cells == f"0.5x: +0.00% final loss, 1.000x the tokens; 1x: +0.00% final loss, 1.000x the tokens; " \
        f"2x: +3.33% final loss, {lagged}x the tokens"

