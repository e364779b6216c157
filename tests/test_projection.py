"""The projection past this machine (benchmarks/projection): the equations against hand-computed cases, the fit
recovering known constants, the check reading runs in the raw format, and docs/projection.md current.

Pure Python over the committed raw files: no processes, no torch work.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.projection import fit, grid, page
from benchmarks.projection import model as m

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fitted():
    return fit.fit_all()


def test_bytes_on_a_nodes_link_by_pattern_and_topology():
    """64 ranks, 8 per node: a ring puts 63/64 of the buffer on a node's link, a flat all-to-all 8 x 56 / 64 = 7x,
    hierarchical (M-1)/M = 7/8, torchft's replica all-reduce 2 x 7/8; one node puts nothing on it."""
    flat, hier = m.Link(1e9, gpus_per_node=8), m.Link(1e9, gpus_per_node=8, topology=m.HIERARCHICAL)
    assert m.node_bytes("ring", 64.0, 64, flat) == pytest.approx(63.0)
    assert m.node_bytes("all_to_all", 64.0, 64, flat) == pytest.approx(448.0)
    assert m.node_bytes("all_to_all", 64.0, 64, hier) == m.node_bytes("ring", 64.0, 64, hier) == pytest.approx(56.0)
    assert m.node_bytes("replica_all_reduce", 64.0, 64, flat) == pytest.approx(112.0)
    assert m.node_bytes("ring", 64.0, 8, flat) == 0.0
    assert (m.algorithm_steps("ring", 64, flat), m.algorithm_steps("ring", 64, hier)) == (63, 7)
    assert m.wire_bytes("int8") == 1 + 4 / 256 and m.wire_bytes("int4", block=128) == 0.5 + 4 / 128
    with pytest.raises(ValueError, match="pattern"):
        m.node_bytes("tree", 1.0, 16, flat)


def test_a_round_is_host_cost_elements_bytes_and_steps():
    """sync fp32, P = 1e9, 16 ranks in 2 nodes, 1 GB/s: two rings of 15/16 x 4 GB (3.75 s and 15 ms each),
    h = 10 ms, e x P = 1 s."""
    link = m.Link(8e9, 1.0, 1e-3, gpus_per_node=8)
    costs = m.Costs(0.01, 1e-9)
    assert m.round_s("fp32", 1e9, 16, link, costs) == pytest.approx(2 * (3.75 + 0.015) + 0.01 + 1.0)
    job = m.Job(1e9, 16, (0.5,), 4)
    step = m.sync_step(job, link, costs)
    assert step.seconds == pytest.approx(2.0 + 8.54) and step.micro_batches == 64


def test_acco_fixed_is_two_maxima_of_half_the_compute_and_a_round():
    link = m.Link(2.5e8, 1.0, 0.0, gpus_per_node=1)  # 31.25 MB/s: an int4 round 1.65 s, an int8 one 3.25 s
    costs = m.Costs(slowdown=1.2)
    job = m.Job(1e8, 2, (1.0,), 4)
    est, commit = (m.round_s(k, 1e8, 2, link, costs) for k in ("int4", "int8"))
    half = 4 / 2 * 1.2 * 1.0
    assert est < half < commit  # one round hidden, one not: both branches of max
    assert m.acco_fixed_step(job, link, costs).seconds == pytest.approx(half + commit)


def test_adaptive_computes_until_its_round_is_done_within_the_cap():
    """r = 0.35 s, c = 0.1 s: m = ceil(3.5) = 4 micro-batches per rank (0.4 s); a 10 s round hits the cap (16),
    the phase lasts the round; with a rank twice as slow the phase is its 2 micro-batches and the fast one fits 4."""
    job = m.Job(1.0, 2, (0.1, 0.2), 4)
    assert m._adaptive_phase(0.35, m.Job(1.0, 2, (0.1,), 4), m.Costs(), 16) == (pytest.approx(0.4), 8.0)
    seconds, total = m._adaptive_phase(0.35, job, m.Costs(), 16)
    assert seconds == pytest.approx(0.4) and total == 4 + 2
    assert m._adaptive_phase(10.0, m.Job(1.0, 2, (0.1,), 4), m.Costs(), 16) == (10.0, 32.0)


def test_streaming_hides_its_fragment_behind_tau_steps():
    job, link = m.Job(4e6, 2, (0.25,), 4), m.Link(8e6, 1.0, 0.0)
    r = m.round_s("fragment", 1e6, 2, link, m.Costs())
    step = m.streaming_step(job, link, m.Costs(slowdown=1.5))
    hidden = 2 * 1.0
    assert step.seconds == pytest.approx(1.0 + (max(0.0, r - hidden) + 0.5 * min(r, hidden)) / 10)


def test_the_fit_recovers_known_constants():
    """Rounds computed by the model from known constants are fitted back to them."""
    truth = fit.Constants(0.8, 2e-3, 0.02, 3e-8, 0.0)
    obs = []
    for rate in (25e6, 100e6, 1e9):
        for kind, elements in (("fp32", 3e6), ("int8", 3e6), ("int4", 3e6), ("fragment", 7.5e5), ("int8", 2e5)):
            o = fit.Observation("bed", "r", rate, 1, "m", kind, elements, 0.0, 0.0)
            obs.append(fit.Observation(**{**o.__dict__, "round_s": fit.predicted_round(o, truth)}))
    got = fit.fit_link(obs, truth.hop_s, 0.0)
    assert got.efficiency == pytest.approx(0.8) and got.round_host_s == pytest.approx(0.02)
    assert got.round_s_per_elem == pytest.approx(3e-8)
    with pytest.raises(ValueError, match="singular"):
        fit.fit_link(obs[:1] * 3, truth.hop_s, 0.0)


def test_the_beds_fit_and_bytes_are_sane(fitted):
    """The model's bytes are what the runs sent (within 10%) and the efficiency a share of the line rate."""
    assert 0.3 < fitted["cpu"]["efficiency"] <= 1.0
    assert all(abs(r["bytes_measured"] / r["model_bytes"] - 1) < 0.1 for r in fitted["residuals"])
    assert {r["method"] for r in fitted["leave_one_bed_out"]} == set(fit.CONFIG_METHOD.values())
    assert set(fitted["penalties"]) == set(fit.PENALTY_METHOD.values()) and fitted["penalties"]["sync_fp32"] == 1.0
    # the peer's rows use its own measured penalty (torchft ran in the same sweeps), not streaming's stand-in
    assert grid.penalties(fitted)["torchft_diloco"] == fitted["penalties"]["torchft_diloco"]


def test_the_penalties_are_the_long_runs_paired_by_seed(fitted):
    """The table's penalties are the decayed-rate long runs' (both kinds of compute), the short runs' kept beside them;
    a seed pairs with its own sync fp32 run, so sync fp32's is 1 exactly and each bed's is a median of per-seed ratios;
    the beds weigh alike whatever their seed counts (the sleep bed ran five, real compute three)."""
    long = fitted["penalties_long"]
    assert fitted["penalties"] == long["penalties"] and set(long["each"]["acco_fixed"]) == {
        " ".join(bed) for bed in fit.PENALTY_BEDS}
    assert set(fitted["penalties_short"]) == set(fit.PENALTY_METHOD.values())
    fixed = long["each"]["acco_fixed"].values()
    assert min(fixed) <= fitted["penalties"]["acco_fixed"] <= max(fixed)
    assert all(fitted["penalties"][k] == pytest.approx(sum(v.values()) / len(v)) for k, v in long["each"].items())
    assert long["each"]["sync_fp32"] == {" ".join(bed): 1.0 for bed in fit.PENALTY_BEDS}
    assert fit.long_run_penalties(["bench_results/no_such_folder_*"]) == {}


def test_adaptive_at_a_batch_it_never_ran_pays_at_least_acco_fixeds_penalty(fitted):
    """Its measured tokens came from commits smaller than sync's; at commits of sync's batch or more the table charges
    acco fixed's penalty (a larger batch never needs fewer tokens), and its own below that batch."""
    cells = grid.table(fitted)
    p = fitted["penalties"]
    assert p["acco_adaptive"] < p["acco_fixed"]  # the measured one: smaller commits, fewer tokens
    large = [c for c in cells if c.adaptive_batch() >= 1.0]
    assert large and all(c.penalty_of("acco_adaptive") == p["acco_fixed"] for c in large)
    small = grid.Cell("1B", 64, 1, {"acco_adaptive": m.Step("acco_adaptive", 1.0, 4.0, (), 0.0),
                                    "sync_fp32": m.Step("sync_fp32", 1.0, 8.0, (), 0.0)}, p, {})
    assert small.penalty_of("acco_adaptive") == p["acco_adaptive"]


def test_the_check_reads_runs_wherever_they_are():
    """The 4- and 8-worker check reads any folder of the raw format (here a 2-worker sweep in its place)."""
    rows = fit.long_run_check(fit.fit_beds(fit.bed_runs()), "bench_results/ttl_five_beds_seeds1-4/real_25mbit_seed1")
    assert {r["method"] for r in rows} == set(fit.CONFIG_METHOD.values())
    assert all(r["hosts"] == 2 and abs(r["error"]) < 0.5 for r in rows)
    assert fit.long_run_check(fit.fit_beds(fit.bed_runs()), "bench_results/no_such_folder_*") == []


def test_the_schedule_is_the_shipped_presets():
    """model.Schedule's defaults copy ds_configs/auto_lowbit_streaming.json; this keeps the copy true."""
    assert grid.preset_schedule() == m.Schedule()


def test_the_grid_picks_a_fitting_winner(fitted):
    cells = grid.table(fitted)
    assert len(cells) == len(grid.GPUS) * len(grid.LINKS_GBIT) * len(grid.MODELS)
    seven = next(c for c in cells if (c.model, c.gpus, c.gbit) == ("7B", 64, 1))
    assert not seven.fits["streaming"] and seven.winner() != "streaming"
    assert all(c.ratio("sync_fp32", True) == 1.0 and math.isfinite(c.time_to_loss(c.winner())) for c in cells)


def test_the_page_and_its_json_are_what_the_raw_files_say(fitted):
    """`python -m benchmarks.projection --check`: docs/projection.md and bench_results/projection/fit.json."""
    assert (REPO / page.PAGE).read_text(encoding="utf-8") == page.render(fitted), \
        "docs/projection.md differs: run python -m benchmarks.projection"
    assert (REPO / page.FIT_JSON).read_text(encoding="utf-8") == page.dump(fitted)
