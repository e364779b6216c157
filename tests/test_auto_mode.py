"""``mode: "auto"`` chooses the mode its measurements favour, says why, and switches without losing a step.

Real 2-rank gloo runs of the tiny exactness job. Compute is 50 ms per micro-batch and the link a
time added as each round starts its reduce-scatter, on a simulated clock (tests/auto_workers.py,
tests/sim_clock.py), so the figures are exact: with ``G = 4`` a sync step costs 200 ms + R and an
acco step 2·max(100 ms, R), charged 10% for the delay. R = 0 favours sync (acco would hide nothing
worth its penalty), R = 100 ms favours acco (300 vs 220 ms), R = 500 ms favours sync again (700 vs
1100 ms: acco cannot hide a round longer than its compute).
"""

from __future__ import annotations

import re

import pytest
import torch

from ds_acco.config import parse_acco_config
from ds_acco.errors import AccoConfigError
from ds_acco.rounds.auto.choice import choose
from ds_acco.rounds.auto.mode import AutoMode, StepTimer
from ds_acco.rounds.state import RoundState
from tests.auto_workers import auto_reference, figures, train_auto
from tests.dist_harness import run_distributed
from tests.helpers import assert_trajectories_equal

G, COMPUTE_S = 4, 0.05
AUTO = {"mode": "auto", "auto": {"measure_steps": 3, "check_every": 2}}


def run(link, steps, policy="fixed"):
    results = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=link, steps=steps,
                              config=dict(AUTO, policy=policy))
    assert results[0]["modes"] == results[1]["modes"]  # every rank made the same choices
    assert_trajectories_equal(results[1]["trajectory"], results[0]["trajectory"], atol=0, rtol=0)
    return results[0]


def test_link_changes_make_auto_switch_and_the_trajectory_follows_the_rules():
    got = run(link=[(8, 0.1), (20, 0.5)], steps=27)
    modes, choices = got["modes"], got["choices"]
    first = choices[0]
    assert first["step"] == 3 and first["runs"] == "sync", first  # fast link: nothing worth hiding
    assert first["round_ms"] == pytest.approx(0, abs=1e-3) and first["sync_step_ms"] == pytest.approx(200), first
    to_acco = next(c for c in choices if c["runs"] == "acco")
    # the median of the last three rounds is the slower link's from step 11 (rounds of steps 9-11)
    assert to_acco["step"] == 11 and to_acco["round_ms"] == pytest.approx(100), to_acco
    assert to_acco["acco_charged_ms"] == pytest.approx(220) and to_acco["sync_step_ms"] == pytest.approx(300), to_acco
    back = next(c for c in choices if c["step"] > to_acco["step"] and c["runs"] == "sync")
    assert back["step"] == 23 and back["round_ms"] == pytest.approx(500), back  # (rounds of steps 21-23)
    assert back["sync_step_ms"] == pytest.approx(700) and back["acco_step_ms"] == pytest.approx(1000), back
    # no compute slowed by a round in flight on this clock, and a round as long in acco as in sync
    assert {(c["in_flight_factor"], c["wire_factor"]) for c in choices} == {(1.0, 1.0)}, choices
    assert modes[:to_acco["step"]] == ["sync"] * to_acco["step"]
    assert set(modes[to_acco["step"]:back["step"]]) == {"acco"}
    assert modes[back["step"]:] == ["sync"] * (len(modes) - back["step"])
    # the fixed-policy trajectory across both switches is the reference's for that schedule
    assert_trajectories_equal(got["trajectory"], auto_reference(modes))
    # ...and not the one of a run that never switched, from acco's second step (its first computes both halves of its
    # micro-batches at the committed parameters, as sync does; the next estimate's at the lookahead's)
    n = to_acco["step"] + 2
    never = auto_reference(["sync"] * n)
    assert_trajectories_equal(got["trajectory"][:n - 1], never[:n - 1])
    with pytest.raises(AssertionError):
        assert_trajectories_equal(got["trajectory"][:n], never)
    # one line per choice on rank 0, with its figures
    assert len(got["lines"]) == len(choices)
    switch = next(line for line in got["lines"] if "runs acco (was sync)" in line)
    assert re.search(r"compute \d+\.\d ms per micro-batch .* round \d+\.\d ms in sync \(x\d\.\d\d in acco\); "
                     r"per step of 4 micro-batches: "
                     r"sync \d+\.\d ms \(measured\), acco fixed \d+\.\d ms \(predicted; \d+\.\d ms with the 10% "
                     r"delay penalty\)", switch), switch


def test_the_first_choice_comes_after_one_step_without_its_start_up():
    """With ``measure_steps: 1`` auto chooses after step 1: that step's compute is timed from the end of its first
    micro-batch (0.5 s of start-up here, which would have read as 175 ms per micro-batch), and the ranks gather
    their figures once its round is over; the sync step is predicted (one commit, no interval yet)."""
    results = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.1)], steps=4,
                              config=dict(AUTO, auto={"measure_steps": 1, "check_every": 20}), startup_s=0.5)
    assert results[0]["choices"] == results[1]["choices"]  # the same figures on every rank
    got = results[0]
    first = got["choices"][0]
    assert first["step"] == 1 and first["runs"] == "acco", first  # 300 ms in sync against 2 x 100 ms (+10%)
    assert first["compute_ms"] == pytest.approx(50) and first["round_ms"] == pytest.approx(100), first
    assert first["sync_step_ms"] == pytest.approx(4 * first["compute_ms"] + first["round_ms"], rel=1e-3)
    assert got["modes"][0] == "sync" and set(got["modes"][1:]) == {"acco"}, got["modes"]
    assert_trajectories_equal(got["trajectory"], auto_reference(got["modes"]))


def test_adaptive_policy_switches_too_and_commits_what_workers_computed():
    """Where the policy may change the batch, sync at half the accumulation is a candidate too (the adaptive
    policy's honest control), priced with the noise scale measured in the sync rounds at the rate the job runs
    (:func:`ds_acco.rounds.auto.choice.samples_to_loss`). This job's gradients are noisy (a scale of several
    micro-batches): at its constant rate, taken as the one best for the configured batch, half the batch buys no
    more per sample on the free link, and the simpler full-batch sync runs. Once a round takes 60 ms, sync at half
    the batch pays it twice per step and acco adaptive, which hides it behind two micro-batches a round, wins."""
    got = run(link=[(6, 0.06)], steps=16, policy="adaptive")
    first, cands = got["choices"][0], got["choices"][0]["candidates"]
    assert first["noise_scale"] > 2 and first["rate_share"] == 1.0 and cands["acco adaptive"]["batch"] < 8, first
    assert cands["sync half"]["batch"] == 4 and cands["sync half"]["step_ms"] == cands["sync"]["step_ms"], cands
    assert cands["sync half"]["score_ms"] > 0.95 * cands["sync"]["score_ms"], cands  # no gain past the margin
    assert first["runs"] == "sync" and not first["sync_half"], first
    to_acco = next(c for c in got["choices"] if c["runs"] == "acco")
    assert to_acco["step"] > 6 and to_acco["candidates"]["sync half"]["step_ms"] == pytest.approx(320.0), to_acco
    assert to_acco["policy"] == "adaptive" and to_acco["candidates"]["acco adaptive"]["score_ms"] < 0.85 * min(
        to_acco["candidates"][c]["score_ms"] for c in ("sync", "sync half")), to_acco
    assert "runs acco (was sync)" in got["lines"][got["choices"].index(to_acco)]
    # full sync commits until acco; an adaptive round ends at the first micro-batch boundary after its link time:
    # from step 6 on (60 ms), after two
    switch = got["modes"].index("acco")
    assert got["counts"][:switch] == [[4, 4]] * switch and switch > 6, got["counts"]
    assert set(map(tuple, got["counts"][switch:])) == {(2, 2)}, got["counts"]
    assert_trajectories_equal(got["trajectory"], auto_reference(got["modes"], counts=got["counts"]))


@pytest.mark.parametrize("round_ms, want", [(2, "sync"), (100, "acco"), (130, "acco"), (500, "sync")])
def test_choice_follows_the_step_model(round_ms, want):
    cfg = parse_acco_config(AUTO)
    choice = choose(figures([50, 50], round_ms, 4 * 50 + round_ms), "sync", cfg, G, step=3)
    assert choice.mode == want, choice.line
    assert choice.figures["acco_step_ms"] == pytest.approx(2 * max(100, round_ms), rel=1e-3)
    # where the mode chosen costs at least STREAMING_HINT x a step's bare compute (G c = 200 ms) to a loss, the line
    # points to streaming, which hides its fragment rounds behind compute: acco 200 ms x 1.1 (its delay penalty) and
    # sync 202 ms do not; acco 260 ms x 1.1 and sync 700 ms do
    assert ("mode 'streaming'" in choice.line) == (round_ms >= 130), choice.line
    assert choice.figures["streaming_ratio"] == pytest.approx(
        {2: 202, 100: 220, 130: 286, 500: 700}[round_ms] / 200, rel=1e-3)
    if round_ms == 130:
        assert "a step of acco costs 1.43x the bare compute to a loss: mode 'streaming'" in choice.line, choice.line
    if round_ms == 500:
        assert "a round is 2.5x a step's compute, more than any gradient round can hide" in choice.line, choice.line


def test_int4_estimates_are_priced_by_their_bytes():
    """With ``estimate_quantization: "int4"`` an estimate round moves about half a commit's bytes: acco's step is
    one estimate and one commit, ``max(G/2 c, f R) + max(G/2 c, R)``; a link where two full rounds do not hide
    behind compute but one full and one half do makes acco the choice only with int4 estimates."""
    cfg = parse_acco_config(AUTO)
    plain = choose(figures([50, 50], 160, 4 * 50 + 160), "sync", cfg, G, step=3)
    int4 = choose(figures([50, 50], 160, 4 * 50 + 160), "sync", cfg, G, step=3, estimate_fraction=0.5)
    assert plain.figures["acco_step_ms"] == pytest.approx(320, rel=1e-3)
    assert int4.figures["acco_step_ms"] == pytest.approx(100 + 160, rel=1e-3)
    assert plain.mode == "sync" and int4.mode == "acco", (plain.line, int4.line)
    # the timer keeps commit-equivalent round times: an int4 estimate's time counts as twice its own
    from ds_acco.rounds.round_work import RoundOutcome
    from ds_acco.telemetry.records import RoundRecord

    auto = AutoMode(cfg, G, 2, 0, estimate_fraction=0.5)
    for i, (kind, round_s) in enumerate([("commit", 0.3), ("estimate", 0.09), ("commit", 0.2), ("estimate", 0.1)]):
        record = RoundRecord(index=i, kind=kind, mode="acco", step=i, counts=[2, 2], compute_s=0.1, round_s=round_s,
                             waited_s=0.0, bytes_sent=0, bytes_received=0, grad_norm=1.0, skipped=False, lr=0.1,
                             stage_s={"count all-gather": 0.01}, stage_cpu_s={}, nominal_step=i)
        outcome = RoundOutcome(counts=[2, 2], round_s=round_s, bytes_sent=0, bytes_received=0, grad_norm=1.0,
                               skipped=False, lr=0.1)
        auto.after_round(record, outcome, now=float(i), committed=None)
    assert sorted(auto.timer.rounds) == pytest.approx([0.16, 0.18, 0.19])  # the first interval is start-up


def test_measured_interference_and_the_margin_keep_acco_from_flapping():
    cfg = parse_acco_config(AUTO)
    # in acco, compute per micro-batch rose 30% with a round in flight: the measured acco step is what counts
    running = choose(figures([50, 50], 100, 270, c_acco_ms=65), "acco", cfg, G, step=9)
    assert running.mode == "acco" and running.figures["sync_step_ms"] == pytest.approx(300, rel=1e-3)
    assert running.figures["in_flight_factor"] == pytest.approx(1.3, rel=1e-3)
    # a tie within the switch margin keeps the running mode, whichever it is
    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.05}))
    assert choose(figures([50, 50], 0, 200), "sync", cfg, G, step=3).mode == "sync"
    assert choose(figures([50, 50], 0, 200, c_acco_ms=50), "acco", cfg, G, step=3).mode == "acco"


def test_the_wire_factor_keeps_a_round_slowed_by_compute_from_pricing_sync():
    """On a CPU a round in acco shares the core with compute: 150 ms there is 100 ms in sync (factor 1.5)."""
    cfg = parse_acco_config(AUTO)
    unscaled = choose(figures([50, 50], 150, 290, c_acco_ms=60), "acco", cfg, G, step=9)
    assert unscaled.figures["sync_step_ms"] == pytest.approx(350, rel=1e-3) and unscaled.mode == "acco"
    scaled = choose(figures([50, 50], 150, 290, c_acco_ms=60, wire=1.5), "acco", cfg, G, step=9)
    assert scaled.figures["sync_step_ms"] == pytest.approx(300, rel=1e-3) and scaled.mode == "sync", scaled.line
    assert "round 150.0 ms in acco (x0.67 in sync)" in scaled.line
    # from sync, the acco round is predicted 1.5x the measured one
    ahead = choose(figures([50, 50], 150, 350, wire=1.5), "sync", cfg, G, step=3)
    assert ahead.figures["acco_step_ms"] == pytest.approx(2 * 225, rel=1e-3)


def test_the_timer_measures_the_wire_factor_across_a_switch():
    timer = StepTimer(G, 2)
    for i in range(5):  # sync: 100 ms rounds (the first interval is skipped as start-up)
        timer.micro_batch()
        timer.swap(compute_s=0.05, round_s=0.1, committed=None, now=float(i))
    assert timer.local()[4] == 0
    timer.enter("acco")
    for i in range(4):  # the first interval after a switch is skipped too
        timer.micro_batch()
        timer.swap(compute_s=0.05, round_s=0.16, committed=None, now=float(5 + i))
        assert timer.local()[4] == (1600 if i == 3 else 0)  # once acco's first window is full
    timer.enter("sync")
    for i in range(4):  # a slower link later
        timer.micro_batch()
        timer.swap(compute_s=0.05, round_s=0.2, committed=None, now=float(9 + i))
    assert timer.local()[4] == 800  # 0.16 / 0.2: measured again across this switch


def test_the_job_s_first_round_stands_for_the_rounds_only_until_a_second_one_ends():
    """The first round sets up what later ones reuse (on 100 Mbit/s with 25 ms one way it took 1.91 s, the next ones
    0.55-0.70 s): a look after it alone reads it, a look after two rounds does not, and a switch's own first round
    is left to the skip that already handles a switch."""
    timer = StepTimer(G, 2)
    timer.micro_batch()
    timer.swap(compute_s=0.3, round_s=1.9, committed=4, now=1.0)
    assert timer.local()[2] == 1_900_000  # the only round there is
    for i, r in enumerate((0.55, 0.6, 0.7)):
        timer.micro_batch()
        timer.swap(compute_s=0.3, round_s=r, committed=8 + 4 * i, now=2.0 + i)
        assert timer.local()[2] == (550_000, 575_000, 600_000)[i]  # medians of the later rounds only
    timer.enter("acco")
    for i, r in enumerate((0.9, 0.5, 0.4)):  # the switch's first interval is skipped; then every round counts
        timer.micro_batch()
        timer.swap(compute_s=0.3, round_s=r, committed=None, now=6.0 + i)
    assert timer.local()[2] == 450_000


def test_the_mode_not_running_is_priced_from_the_running_modes_compute():
    """The in-flight factor is measured across a switch and carried: a machine that slows while sync runs slows
    acco's predicted compute too, instead of leaving acco at the compute it measured many steps before."""
    timer = StepTimer(G, 2)

    def run(n: int, compute_s: float) -> None:
        for _ in range(n):
            timer.micro_batch()
            timer.swap(compute_s=compute_s, round_s=0.1, committed=None, now=0.0)

    run(2, 0.05)  # the first switch comes early: the first interval and one more
    assert timer.local()[:2] == [50_000, 0] and timer.in_flight_factor == 0
    timer.enter("acco")
    run(4, 0.07)  # the first interval after a switch is skipped; then acco's window fills: x1.4
    assert timer.in_flight_factor == pytest.approx(1.4) and timer.local()[:2] == [50_000, 70_000]
    timer.enter("sync")
    run(4, 0.05)
    assert timer.in_flight_factor == pytest.approx(1.4)  # re-measured across this switch: the same
    run(3, 0.06)  # the machine slows while sync runs
    assert timer.local()[:2] == [60_000, 84_000]  # not acco's own window, 70 ms from when it ran
    timer.enter("acco")
    run(4, 0.09)
    assert timer.in_flight_factor == pytest.approx(1.5)  # 90 over sync's last 60
    run(3, 0.075)  # faster again, in acco: sync is derived from it
    assert timer.local()[:2] == [50_000, 75_000]
    timer.enter("sync")
    timer.swap(compute_s=0.0, round_s=0.3, committed=None, now=0.0)  # acco's last commit, waited for: no compute
    run(1, 0.09)  # the new mode's first interval (start-up of the switch) is the one skipped...
    run(1, 0.07)
    run(2, 0.06)  # ...not the commit: with it skipped instead, 0.09 counted and the factor read 1.07
    assert timer.in_flight_factor == pytest.approx(1.25) and timer.local()[:3] == [60_000, 75_000, 100_000]


def test_a_choice_without_figures_is_tried_again_the_next_step():
    """A choice point whose figures do not suffice (no step measured yet, as after a resume just before it) is
    tried again at the next step, not ``check_every`` steps later."""

    auto = AutoMode(parse_acco_config(dict(AUTO, auto={"measure_steps": 3, "check_every": 20})), G, 2, 0)
    state = RoundState(mode="sync", policy="fixed")
    assert auto.due(3) and not auto.due(4)
    nothing_yet = [[0] * 5, [0] * 5]  # what every rank sends before it has measured a step
    assert auto.decision(nothing_yet, state, 3) is None and auto.choices == []
    assert auto.due(4)
    assert auto.decision(figures([50, 50], 100, 300), state, 4).apply(state) == "acco" and len(auto.choices) == 1
    assert state.mode == "acco" and not auto.due(5) and auto.due(23)


def test_a_switch_into_a_mode_not_run_before_is_checked_once_it_is_measured():
    """A switch priced on a prediction (acco before it ran: its compute with a round in flight taken as unslowed) is
    checked again after CONFIRM_AFTER commits, on the new mode's measured figures, not ``check_every`` steps later;
    a switch back into a mode already run waits for the schedule."""
    from ds_acco.rounds.auto.mode import CONFIRM_AFTER

    auto = AutoMode(parse_acco_config(dict(AUTO, auto={"measure_steps": 3, "check_every": 20})), G, 2, 0)
    state = RoundState(mode="sync", policy="fixed")
    assert auto.decision(figures([50, 50], 100, 300), state, 3).apply(state) == "acco"
    assert CONFIRM_AFTER == 5 and [s for s in range(4, 24) if auto.due(s)] == [8, 23]
    # measured: 90 ms per micro-batch with a round in flight, 400 ms a step (charged 440) against sync's 300
    back = auto.decision(figures([50, 50], 100, 400, c_acco_ms=90), state, 8)
    assert back.apply(state) == "sync" and auto.choices[-1]["acco_step_ms"] == pytest.approx(400)
    assert [s for s in range(9, 44) if auto.due(s)] == [23, 43]  # sync ran before: no early check
    # acco again at 23 (the link slowed): it has run, so the next look is on schedule
    assert auto.decision(figures([50, 50], 130, 330), state, 23).apply(state) == "acco"
    assert [s for s in range(24, 44) if auto.due(s)] == [43]
    # a check due sooner than CONFIRM_AFTER anyway (check_every 2) adds none
    often = AutoMode(parse_acco_config(AUTO), G, 2, 0)
    assert often.decision(figures([50, 50], 100, 300), RoundState(mode="sync", policy="fixed"), 3).mode == "acco"
    assert [s for s in range(4, 12) if often.due(s)] == [5, 7, 9, 11]


def test_a_real_run_checks_its_first_switch_once_acco_is_measured():
    """The engine asks ``due`` at every commit (in acco, as an estimate lands): with ``check_every: 20`` the switch to
    acco at step 3 is checked at step 8 on acco's measured step (the simulated clock's model is exact, so it stays),
    and the next choice is on schedule. Two ranks, because what the unit test above cannot show is the schedules
    asking at the right boundary and every rank gathering the same figures there, so both make the same choice."""
    got = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.1)], steps=10,
                          config=dict(AUTO, auto={"measure_steps": 3, "check_every": 20}))[0]
    assert [(c["step"], c["runs"]) for c in got["choices"]] == [(3, "acco"), (8, "acco")], got["choices"]
    assert got["choices"][1]["acco_step_ms"] == pytest.approx(200, rel=0.02)
    assert "acco fixed 200.0 ms (measured" in got["lines"][1] and "(was" not in got["lines"][1], got["lines"][1]


def test_auto_config_errors_name_the_field():
    with pytest.raises(AccoConfigError, match=r"acco.auto.check_every: got 0"):
        parse_acco_config({"mode": "auto", "auto": {"check_every": 0}})
    # a choice needs one step measured
    with pytest.raises(AccoConfigError, match=r"acco.auto.measure_steps: got 0"):
        parse_acco_config({"mode": "auto", "auto": {"measure_steps": 0}})
    with pytest.raises(AccoConfigError, match=r"acco.auto.every: unknown key .*allowed keys: acco_step_penalty, "
                                              r"check_every, measure_steps, streaming, switch_margin"):
        parse_acco_config({"mode": "auto", "auto": {"every": 3}})
    with pytest.raises(AccoConfigError, match=r"gradient_accumulation_steps: got 3; acco.mode 'auto' may run"):
        parse_acco_config({"mode": "auto"}).check_accumulation(3)


def test_deepspeed_front_end_runs_auto_and_follows_the_rules_for_the_modes_it_chose():
    from tests import ds_workloads as D

    acco = {"mode": "auto", "auto": {"measure_steps": 3, "check_every": 1, "acco_step_penalty": 0.0,
                                     "switch_margin": 0.0}}
    got = run_distributed(D.train_ds, 2, config=D.ds_config(G, acco), steps=10, timeout=300)
    modes = got[0]["modes"]
    assert got[1]["modes"] == modes and len(modes) == 10 and modes[:3] == ["sync", "sync", "sync"]
    assert_trajectories_equal(got[0]["trajectory"], auto_reference(modes))


def test_the_example_auto_config_is_the_low_bit_preset_with_auto():
    import json
    import os

    from ds_acco.deepspeed.initialize import acco_config_of

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds_configs")
    auto, lowbit = (json.load(open(os.path.join(root, n))) for n in ("auto_lowbit.json", "acco_lowbit.json"))
    block = acco_config_of(config=auto)
    assert block.mode == "auto" and block.auto.check_every == 20 and block.auto.acco_step_penalty == 0.05
    assert block.policy == "auto"  # auto chooses acco's policy too (tests/test_auto_policy.py)
    # with the policy its own choice, auto starts choosing early: sync through the learning-rate warm-up cost it
    # more than it saved on every bed (BENCHMARKS.md "auto chooses the policy too")
    assert block.warmup_steps == 2 and auto["scheduler"]["params"]["warmup_num_steps"] == 10
    # int4 estimates: auto's acco candidates send an estimate round at about half a commit's bytes
    assert block.estimate_quantization == "int4"
    for key in ("comm_quantization", "error_feedback", "all_gather_quantization", "quantization_block_size"):
        assert auto["acco"][key] == lowbit["acco"][key], key


def test_fsdp_front_end_runs_auto_and_follows_the_rules_for_the_modes_it_chose():
    from tests import fsdp_workloads as F

    got = run_distributed(F.auto_job, 2, G=G, steps=10, timeout=300)
    modes = got[0]["modes"]
    assert got[1]["modes"] == modes and len(modes) >= 10 and modes[:2] == ["sync", "sync"]
    assert_trajectories_equal(got[0]["trajectory"], auto_reference(modes[:10]))


def test_a_slow_worker_is_compute_not_link():
    """Rank 1 computes at half speed on a fast link: rank 0's rounds wait for it in their first all-gather,
    which auto must not read as a slow link (it would predict acco hides it)."""
    results = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=[0.05, 0.1], link=[], steps=6,
                              config=AUTO)
    first = results[0]["choices"][0]
    assert first["round_ms"] == pytest.approx(0, abs=1e-3) and first["compute_ms"] == pytest.approx(100), first
    assert first["runs"] == "sync", first


def test_the_clock_is_perf_counter_unless_given_and_a_simulated_one_ends_rounds_by_its_stamps():
    """The engine's ``clock=`` (ds_acco/comm/clock.py): by default the wall clock, where waiting does nothing to
    time; on a simulated clock a round starts on the communication thread at its launch stamp, and has ended for a
    thread once that thread's time reached the round's end, whenever the work itself ended."""
    import threading
    import time

    from ds_acco.comm.clock import WALL, as_clock
    from ds_acco.comm.comm_thread import CommThread, RoundHandle
    from tests.sim_clock import SimClock

    assert as_clock(None) is WALL and as_clock(time.perf_counter) is WALL and not WALL.simulated
    before = time.perf_counter()
    assert before <= WALL.now() <= time.perf_counter()
    WALL.waited_for(before + 3600)
    assert WALL.now() < before + 3600
    assert as_clock(lambda: 42.0).now() == 42.0
    with pytest.raises(TypeError, match="clock: got 'soon'"):
        as_clock("soon")
    assert RoundHandle(0, "commit", 5.0).clock is WALL

    clock, comm = SimClock(), CommThread(torch.device("cpu"))
    release, seen = threading.Event(), {}
    try:
        clock.advance(1.0)  # the training thread's time: 1 s
        handle = RoundHandle(0, "commit", 30.0, clock)
        assert handle.launched_at == 1.0

        def round_work(h):
            seen["start"] = clock.now()  # the comm thread's time starts at the launch
            release.wait(30)
            clock.advance(0.25)  # the link
            return "landed"

        comm.submit(handle, round_work, None)
        clock.advance(0.2)
        release.set()
        assert not handle.done()  # waits for the work; its end (1.25 s) is after this thread's 1.2 s
        assert seen["start"] == 1.0 and handle.finished_at == 1.25
        clock.advance(0.05)
        assert handle.done() and handle.wait() == "landed" and clock.now() == 1.25
        late = RoundHandle(1, "commit", 30.0, clock)
        comm.submit(late, lambda h: clock.advance(0.5), None)
        clock.advance(0.1)
        late.wait()  # waiting for a round moves this thread to the round's end
        assert late.launched_at == 1.25 and late.finished_at == 1.75 and clock.now() == 1.75
    finally:
        comm.close()
