"""``policy: "auto"``: acco fixed at half the accumulation is a candidate. Where a smaller batch buys more loss per
sample, sync at half the batch sends its round twice per nominal step; acco at that batch hides it. Auto prices it,
runs it with rounds of ``G/4``, and the run follows the rules with those counts.
"""

from __future__ import annotations

import pytest

from ds_acco.config import parse_acco_config
from ds_acco.rounds.auto.choice import choose
from ds_acco.rounds.state import RoundState
from tests.auto_workers import auto_reference, figures, train_auto
from tests.dist_harness import run_distributed
from tests.helpers import assert_trajectories_equal

AUTO = {"mode": "auto", "policy": "auto", "auto": {"measure_steps": 3, "check_every": 20}}


def test_acco_fixed_at_half_the_batch_hides_the_round_half_batch_sync_pays_twice():
    """G = 8, 50 ms micro-batches, 100 ms rounds, a noise scale of 4 micro-batches (a = 0.4 at the peak rate: a batch
    B needs B / (1 - 0.4 (1 + 4/B)) samples, 20 for 8, 32 for 16). Per 16 micro-batches: sync at half the batch
    8 x 50 + 2 x 100 = 600 ms at 8 a commit (750 ms to a loss), acco fixed at half the batch two steps of
    2 x max(2 x 50, 100) = 400 ms at 8 (500 ms), acco fixed 400 ms at 16 (800 ms), acco adaptive 400 ms at 10
    (568 ms: a round lands 125 ms after it starts, 2.5 micro-batches each)."""
    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.05}))
    got = choose(figures([50, 50], 100, 8 * 50 + 100), "sync", cfg, 8, step=3, noise=4.0)
    cands = got.figures["candidates"]
    assert cands["acco fixed half"]["step_ms"] == pytest.approx(400) and cands["acco fixed half"]["batch"] == 8
    assert cands["acco fixed half"]["score_ms"] == pytest.approx(400 / 16 * 20)
    assert cands["sync half"]["score_ms"] == pytest.approx(600 / 16 * 20)
    assert cands["acco fixed"]["score_ms"] == pytest.approx(400 / 16 * 32)
    assert cands["acco adaptive"]["score_ms"] == pytest.approx(400 / 16 * 10 / (1 - 0.4 * 1.4))
    assert (got.mode, got.policy, got.acco_half, got.sync_half) == ("acco", "fixed", True, False), got.line
    assert got.figures["acco_half"] and got.figures["policy"] == "fixed"
    assert "acco fixed at half the batch 400.0 ms (predicted" in got.line, got.line
    assert got.line.endswith("runs acco fixed at half the batch (was sync); the next best, acco adaptive, would take "
                             "1.14x its time to a loss"), got.line
    # running it: its measured step (480 ms, x1.2 the model's) calibrates the other acco candidates
    running = choose(figures([50, 50], 100, 480), "acco", cfg, 8, step=9, policy="half", noise=4.0, batch=8.0)
    cands = running.figures["candidates"]
    assert cands["acco fixed half"]["step_ms"] == pytest.approx(480)
    assert cands["acco fixed"]["step_ms"] == pytest.approx(480) and cands["acco adaptive"]["step_ms"] == \
        pytest.approx(480)
    assert running.acco_half and ": runs acco fixed at half the batch; the next best" in running.line, running.line
    # a policy the user fixed, or an accumulation not a multiple of 4, leaves it out
    for config, G in [(dict(AUTO, policy="adaptive"), 8), (AUTO, 6)]:
        c = choose(figures([50, 50], 100, G * 50 + 100), "sync", parse_acco_config(config), G, step=3, noise=4.0)
        assert "acco fixed half" not in c.figures["candidates"] and not c.acco_half, c.line


def test_a_round_state_from_before_keeps_its_half_batch_sync():
    """Releases before this candidate saved the quota as ``sync_quota``: a resume keeps sync at half the batch."""
    state = RoundState()
    state.load_state_dict({"mode": "sync", "policy": "fixed", "commits": 5, "sync_quota": 8})
    assert (state.mode, state.step_quota, state.commits) == ("sync", 8, 5)
    state.load_state_dict(dict(RoundState(mode="acco", step_quota=4).state_dict()))
    assert (state.mode, state.step_quota) == ("acco", 4)


def test_auto_runs_acco_fixed_at_half_the_batch_and_the_run_follows_the_rules():
    """Equal workers, 50 ms micro-batches, 100 ms rounds on the simulated clock, G = 8: at its first choice (step 3)
    auto runs acco fixed at half the batch (the unit test above prices these figures); every acco round then holds
    G/4 = 2 micro-batches per worker, the trajectory is the rules' with those counts, and a checkpoint keeps it.
    Two real ranks, because what one process cannot show is that both compute the same choice from the gathered
    figures and so launch rounds of the same quota (a disagreement would hang or mismatch their collectives)."""
    results = run_distributed(train_auto, 2, timeout=240, G=8, compute_s=0.05, link=[(0, 0.1)], steps=7,
                              config=dict(AUTO, auto=dict(AUTO["auto"], acco_step_penalty=0.0)), roundtrip=True)
    got = results[0]
    assert results[1]["choices"] == got["choices"] and results[1]["modes"] == got["modes"]
    first = got["choices"][0]
    assert first["step"] == 3 and (first["runs"], first["policy"], first["acco_half"]) == ("acco", "fixed", True), \
        first
    assert "runs acco fixed at half the batch (was sync)" in got["lines"][0], got["lines"][0]
    assert got["modes"][:3] == ["sync"] * 3 and set(got["modes"][3:]) == {"acco"}, got["modes"]
    assert got["counts"][:3] == [[8, 8]] * 3 and set(map(tuple, got["counts"][3:])) == {(2, 2)}, got["counts"]
    assert_trajectories_equal(got["trajectory"], auto_reference(got["modes"], counts=got["counts"], G=8))
    assert got["roundtrip"]["step_quota"] == (4, 4), got["roundtrip"]
    # the start-up line lists what a round may hold: sync's G or G/2, acco fixed's G/2 or G/4, adaptive's
    assert got["per_round"] == "8|4(sync)|4|2(acco fixed)|adaptive(>=1,nominal 4)", got["per_round"]
