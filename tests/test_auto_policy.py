"""``policy: "auto"``: auto chooses the acco policy too, pricing the adaptive policy's smaller batches with the
gradient noise scale it measures; the estimator recovers a known noise scale.
"""

from __future__ import annotations

import pytest
import torch

from ds_acco.config import parse_acco_config
from ds_acco.errors import AccoConfigError
from ds_acco.rounds.auto.choice import choose, samples_to_loss
from ds_acco.rounds.auto import noise_scale
from ds_acco.rounds.auto.noise_scale import NoiseScale
from tests.auto_workers import auto_reference, figures, train_auto
from tests.dist_harness import run_distributed
from tests.helpers import assert_trajectories_equal

G = 4
AUTO = {"mode": "auto", "policy": "auto", "auto": {"measure_steps": 3, "check_every": 2}}


def _rounds(est, mu, sigma, counts, rounds, gen):
    # each rank's accumulator is the sum of its micro-batches' gradients (every round's drawn at once)
    grads = mu + sigma * torch.randn(rounds, sum(counts), mu.numel(), generator=gen, dtype=torch.float64)
    sums = torch.stack([part.sum(dim=1) for part in grads.split(counts, dim=1)], dim=1)  # (rounds, ranks, dim)
    squared, means = sums.norm(dim=2) ** 2, sums.sum(dim=1) / sum(counts)
    for r in range(rounds):
        est.add(squared[r].tolist(), counts, float(means[r].norm() ** 2))


@pytest.mark.parametrize("counts", [[4, 4], [6, 2, 3]])
def test_the_noise_scale_estimate_recovers_a_known_ratio(counts):
    gen = torch.Generator().manual_seed(0)
    dim, trace = 2000, 40.0  # |g|^2 = 1, tr(Sigma) = 40: B_noise = 40 micro-batches
    mu = torch.randn(dim, generator=gen, dtype=torch.float64)
    mu /= mu.norm()
    est = NoiseScale(window=300)
    assert est.value() is None
    _rounds(est, mu, (trace / dim) ** 0.5, counts, 300, gen)
    assert est.value() == pytest.approx(40.0, rel=0.2)
    # no true gradient: every batch buys the same per sample
    pure = NoiseScale(window=300)
    _rounds(pure, mu * 0, 1.0, counts, 50, gen)
    assert pure.value() > 1e3


@pytest.mark.parametrize("trace", [0.1, 1.0])
def test_int4_estimates_leave_the_noise_scale_unbiased(trace):
    """An int4 estimate round's reduced mean is the mean of every rank's int4-rounded sum, while each rank's
    squared norm is of its exact sum (round_work measures both so). With heavy-tailed gradients, where a block's
    absmax makes the int4 step coarse, the rounding must not read as signal or noise: the estimate stays within
    20% of the true noise scale, down to 0.1 micro-batches (the scale measured early in the benchmark runs)."""
    from ds_acco.numerics.quantization import QMAX_INT4, dequantize_blockwise, quantize_blockwise

    gen = torch.Generator().manual_seed(1)
    dim, counts = 4096, [2, 2]
    spread = torch.randn(dim, generator=gen, dtype=torch.float64).mul(1.5).exp()
    mu = torch.randn(dim, generator=gen, dtype=torch.float64) * spread
    mu /= mu.norm()  # |g|^2 = 1
    sigma = spread * (trace / float((spread ** 2).sum())) ** 0.5  # tr(Sigma) = trace: B_noise = trace
    est, rounds = NoiseScale(window=300), 300
    # every round's micro-batches drawn at once: (rounds, ranks, micro-batches, dim), summed per rank
    sums = (mu + sigma * torch.randn(rounds, len(counts), counts[0], dim, generator=gen,
                                     dtype=torch.float64)).sum(dim=2)
    rows = sums.reshape(-1, dim).float()  # one row per rank and round: its blocks are the row's own
    sent = dequantize_blockwise(*quantize_blockwise(rows, 256, qmax=QMAX_INT4), 256,
                                qmax=QMAX_INT4).view(rounds, len(counts), dim).double()
    assert bool(((sums - sent).abs().amax(dim=(1, 2)) > 1e-3).all())  # int4 really rounded, in every round
    squared, means = sums.norm(dim=2) ** 2, sent.sum(dim=1) / sum(counts)
    for r in range(rounds):
        est.add(squared[r].tolist(), counts, float(means[r].norm() ** 2))
    assert est.value() == pytest.approx(trace, rel=0.2)


def test_the_noise_scale_decides_between_full_and_smaller_batches():
    """G = 8, 50 ms per micro-batch, 40 ms rounds: acco fixed and adaptive both take 400 ms per 16 micro-batches,
    but adaptive commits 5.2 of them per step (a round ends with the micro-batch under way, 65 ms on average:
    1.3 micro-batches each). Each is priced by the samples its batch needs to a loss at the rate now."""
    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.05}))
    sync_ms = 8 * 50 + 40
    low = choose(figures([50, 50], 40, sync_ms), "sync", cfg, 8, step=3, noise=4.0)
    assert (low.mode, low.policy) == ("acco", "adaptive"), low.line
    cands = low.figures["candidates"]
    assert cands["acco fixed"]["step_ms"] == pytest.approx(400) and cands["acco fixed"]["batch"] == 16
    assert cands["acco adaptive"]["step_ms"] == pytest.approx(400)
    assert cands["acco adaptive"]["batch"] == pytest.approx(5.2)
    # at the peak rate, taken as the best for 16 micro-batches: a = 1 / (2 (1 + 4/16)) = 0.4, and a batch B needs
    # B / (1 - a (1 + 4/B)) samples: 32 for 16, 20 for 8, 17.8 for 5.2
    assert samples_to_loss(16, 4.0, 1.0, 16) == pytest.approx(32) and samples_to_loss(8, 4.0, 1.0, 16) == \
        pytest.approx(20)
    assert cands["acco adaptive"]["score_ms"] == pytest.approx(400 / 16 * 5.2 / (1 - 0.4 * (1 + 4 / 5.2)))
    assert cands["acco fixed"]["score_ms"] == pytest.approx(400 / 16 * 32)
    assert "gradient noise scale 4.0 micro-batches" in low.line and "runs acco adaptive (was sync)" in low.line
    # sync at half the batch: 8 x 50 ms + two 40 ms rounds per 16 micro-batches, 8 per commit: 480 / 16 x 20 ms
    assert cands["sync half"]["score_ms"] == pytest.approx(480 / 16 * 20)
    # acco fixed at half the batch: two steps of 2 x max(100, 40) ms per 16, 8 per commit: 400 / 16 x 20 ms
    assert cands["acco fixed half"]["score_ms"] == pytest.approx(400 / 16 * 20)
    assert low.line.endswith("; the next best, acco fixed at half the batch, would take 1.12x its time to a loss"), \
        low.line
    # as a schedule decays the rate, a step's noise costs less: at a tenth of the peak every batch costs about per
    # committed step, and adaptive's 5.2 micro-batches cost 0.33x fixed's 16 (per step 0.325; 0.56x at the peak)
    late = choose(figures([50, 50], 40, sync_ms), "sync", cfg, 8, step=3, noise=4.0, rate=0.1)
    ratio = late.figures["candidates"]["acco adaptive"]["score_ms"] / late.figures["candidates"]["acco fixed"][
        "score_ms"]
    assert ratio == pytest.approx(0.33, abs=0.01) and "at the learning rate's 0.10 of its peak" in late.line
    assert late.line.endswith(  # docs/modes.md shows this line
        "sync 16.0 micro-batches per step: 463.2 ms, sync at half the batch 8.0 micro-batches per step: 255.3 ms, "
        "acco fixed 16.0 micro-batches per step: 421.1 ms, acco fixed at half the batch 8.0 micro-batches per step: "
        "212.8 ms, acco adaptive 5.2 micro-batches per step: 139.9 ms: runs acco adaptive (was sync); the next best, "
        "acco fixed at half the batch, would take 1.52x its time to a loss"), \
        late.line
    # a very large noise scale: at the rate best for 16 micro-batches, a smaller batch is past what its noise allows
    # (the model's gain per step is not positive) and only full batches are priced; acco's 400 ms against sync's
    # 440 ms: fixed
    high = choose(figures([50, 50], 40, sync_ms), "sync", cfg, 8, step=3, noise=1e9)
    assert (high.mode, high.policy) == ("acco", "fixed"), high.line
    assert high.figures["candidates"]["acco adaptive"]["score_ms"] == float("inf")
    # not measured yet: priced per sample, where fixed and adaptive cost the same: fixed, the simpler
    assert choose(figures([50, 50], 40, sync_ms), "sync", cfg, 8, step=3).policy == "fixed"


def test_a_noise_scale_below_resolution_prices_per_committed_step():
    """A noise scale the rounds measure as 0 is the model's limit, where every batch size needs the same steps:
    candidates are priced per committed step, not per sample (which would make larger batches free). G = 8,
    50 ms micro-batches; an adaptive round of R ms ends R + 25 ms after it starts, on average."""
    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.05}))
    only = dict(acco_half=False)  # (acco fixed at half the batch: tests/test_auto_half_batch.py)
    for round_ms, fixed_commit_ms, winner in [
            (130, 2 * 200, "adaptive"),  # per sample a tie (400 ms per 16): per committed step adaptive
            (230, 2 * 230, "fixed")]:  # per sample adaptive (400 against 460 ms per 16): per committed step fixed
        adaptive_commit_ms, adaptive_batch = 2 * (round_ms + 25), 2 * 2 * (round_ms + 25) / 50
        sync_ms = 8 * 50 + round_ms
        got = choose(figures([50, 50], round_ms, sync_ms), "sync", cfg, 8, step=3, noise=0.0, **only)
        cands = got.figures["candidates"]
        assert cands["acco adaptive"]["batch"] == pytest.approx(adaptive_batch)
        assert cands["acco adaptive"]["step_ms"] == pytest.approx(adaptive_commit_ms * 16 / adaptive_batch)
        assert cands["acco adaptive"]["score_ms"] == pytest.approx(adaptive_commit_ms)
        assert cands["acco fixed"]["score_ms"] == pytest.approx(fixed_commit_ms)
        assert cands["sync"]["score_ms"] == pytest.approx(sync_ms)
        assert got.policy == winner, got.line
        unpriced = choose(figures([50, 50], round_ms, sync_ms), "sync", cfg, 8, step=3, **only)
        assert unpriced.policy != winner, unpriced.line  # per sample, the other choice


def test_a_near_tie_goes_to_the_simpler_candidate():
    """G = 8, 50 ms micro-batches, 140 ms rounds, priced per committed step: acco adaptive (predicted 330 ms a commit)
    is 3% ahead of sync at half the batch (measured-alike: 340 ms), inside the 5% margin, so sync at half the batch
    runs; with no margin adaptive does. Auto's first choices on real compute took adaptive at such near ties, and the
    runs measured half-batch sync level or ahead."""
    figs, only = figures([50, 50], 140, 8 * 50 + 140), dict(acco_half=False)  # (tests/test_auto_half_batch.py)
    for margin, expected in [(0.05, ("sync", True)), (0.0, ("acco", False))]:
        cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": margin}))
        got = choose(figs, "sync", cfg, 8, step=3, noise=0.0, **only)
        cands = got.figures["candidates"]
        assert cands["acco adaptive"]["score_ms"] == pytest.approx(330) and cands["sync half"]["score_ms"] == 340
        assert (got.mode, got.sync_half) == expected, got.line
    assert "runs sync at half the batch (was sync); acco adaptive would take 0.97x its time to a loss, inside the 5% " \
        "switch margin" in choose(figs, "sync", parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0})), 8,
                                  step=3, noise=0.0, **only).line
    # 200 ms rounds: sync at half the batch and acco fixed both 400 ms a commit, an exact tie: sync runs
    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.0}))  # no margin at all
    exact = choose(figures([50, 50], 200, 600), "sync", cfg, 8, step=3, noise=0.0, **only)
    assert exact.figures["candidates"]["acco fixed"]["score_ms"] == pytest.approx(400)
    assert (exact.mode, exact.sync_half) == ("sync", True), exact.line


def test_running_acco_calibrates_the_other_policy_with_its_measured_step():
    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.05}))
    # fixed runs and measures 480 ms where the model says 400 (x1.2): adaptive's 400 ms is priced 480 too
    got = choose(figures([50, 50], 40, 480), "acco", cfg, 8, step=9, policy="fixed", noise=4.0)
    assert got.figures["candidates"]["acco adaptive"]["step_ms"] == pytest.approx(480)
    assert (got.mode, got.policy) == ("acco", "adaptive") and "(was acco fixed)" in got.line
    # adaptive runs: its measured batch (5 micro-batches, not the model's 5.2) prices it
    got = choose(figures([50, 50], 40, 400), "acco", cfg, 8, step=9, policy="adaptive", noise=4.0, batch=5.0)
    assert got.figures["candidates"]["acco adaptive"]["batch"] == 5.0 and got.policy == "adaptive"


def test_adaptive_s_measured_commits_scale_its_prediction_once_it_has_run():
    """Where the model misjudges adaptive's commits (8-9 micro-batches predicted, 7 committed on real compute with one
    host at half speed), what adaptive measured when it ran scales the model's figure whenever it is predicted again:
    a job that left adaptive is not kept out of it by a batch it never commits."""
    from ds_acco.rounds.auto.mode import AutoMode
    from ds_acco.rounds.state import RoundState

    cfg = parse_acco_config(dict(AUTO, auto={"acco_step_penalty": 0.0, "switch_margin": 0.05, "measure_steps": 3}))
    auto = AutoMode(cfg, 8, 2, 0)
    for i in range(6):  # adaptive commits 8 micro-batches at a time where the model (module test above) says 5.2
        auto.timer.swap(compute_s=0.2, round_s=0.04, committed=8 * i, now=0.2 * i)
    assert auto.timer.batch() == 8.0
    state = RoundState(mode="acco", policy="adaptive")
    auto.decision(figures([50, 50], 40, 400), state, 9).apply(state)
    assert auto.batch_scale == {"adaptive": pytest.approx(8 / 5.2)}
    assert auto.choices[-1]["candidates"]["acco adaptive"]["batch"] == 8.0  # running: measured, not scaled
    # later, in sync at half the batch: adaptive is priced at the 8 it committed, not the model's 5.2
    got = choose(figures([50, 50], 40, 480), "sync", cfg, 8, step=29, policy="half", noise=4.0, batch=8.0,
                 batch_scale=auto.batch_scale)
    cands = got.figures["candidates"]
    assert cands["acco adaptive"]["batch"] == pytest.approx(8.0) and cands["acco fixed"]["batch"] == 16
    assert cands["acco adaptive"]["score_ms"] == pytest.approx(400 / 16 * 20)  # 500 ms against half's 600
    assert "acco adaptive's commits x1.54 the model's, as measured when it last ran" in got.line, got.line
    unscaled = choose(figures([50, 50], 40, 480), "sync", cfg, 8, step=29, policy="half", noise=4.0, batch=8.0)
    assert unscaled.figures["candidates"]["acco adaptive"]["batch"] == pytest.approx(5.2)
    assert "the model's" not in unscaled.line
    # a ratio far outside the model's reach is bounded: conditions changed, not the model
    auto.timer.enter("acco")
    for i in range(6):
        auto.timer.swap(compute_s=0.2, round_s=0.04, committed=40 * i, now=0.2 * i)
    auto.decision(figures([50, 50], 40, 400), state, 11)
    assert auto.batch_scale == {"adaptive": 2.0}


def test_policy_auto_needs_mode_auto():
    for spelling in ("auto", "fastest"):
        with pytest.raises(AccoConfigError, match=r"acco.policy: got 'auto' \(or 'fastest'\) with mode 'acco'.*"
                                                  r"Allowed: 'fixed' or 'adaptive'"):
            parse_acco_config({"mode": "acco", "policy": spelling})
    assert parse_acco_config(dict(AUTO, max_micro_batches_per_round=4)).max_micro_batches_per_round == 4


def test_a_slow_worker_makes_auto_choose_the_adaptive_policy_and_the_run_follows_the_rules():
    """Rank 1 computes at half speed (50 / 100 ms per micro-batch), rounds take 100 ms and a little more (110 ms,
    on the simulated clock of tests/sim_clock.py): a fixed step waits for rank 1's 2 micro-batches per round
    (400 ms per 8), an adaptive round ends at rank 1's second micro-batch, rank 0 having made 4 (12 per step in
    400 ms, 267 ms per 8). The clock runs like clockwork, so the model's average landing (half a micro-batch
    after the round) predicts 9.6 of those 12; once adaptive runs, the batch it commits is measured and prices
    it."""
    results = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=[0.05, 0.1], link=[(0, 0.11)], steps=10,
                              config=AUTO, roundtrip=True)
    got = results[0]
    assert results[1]["modes"] == got["modes"] and results[1]["choices"] == got["choices"]
    first = got["choices"][0]
    assert first["step"] == 3 and (first["runs"], first["policy"]) == ("acco", "adaptive"), first
    assert first["noise_scale"] is not None and first["noise_scale"] > 0, first  # measured in the sync rounds
    predicted = first["candidates"]["acco adaptive"]["batch"]
    assert first["candidates"]["acco fixed"]["batch"] == 8 and predicted == pytest.approx(9.6), first
    assert first["candidates"]["acco adaptive"]["step_ms"] == pytest.approx(800 / 3), first  # 2 x 160 ms per 9.6
    # the batch adaptive then commits (measured while it runs) prices it from then on
    measured = [c["candidates"]["acco adaptive"]["batch"] for c in got["choices"][1:] if c["was"] == "acco"]
    assert measured and all(m == pytest.approx(12) for m in measured), (predicted, measured)
    assert got["modes"][:3] == ["sync"] * 3 and set(got["modes"][3:]) == {"acco"}
    # the adaptive rounds commit what each worker computed: the fast rank more, 4 against 2 once in step
    acco_counts = [c for c in got["counts"][3:] if sum(c)]
    assert any(c[0] > c[1] for c in acco_counts), acco_counts
    assert acco_counts[-6:] == [[4, 2]] * 6, acco_counts
    assert_trajectories_equal(got["trajectory"], auto_reference(got["modes"], counts=got["counts"]))
    assert any("runs acco adaptive (was sync)" in line and "gradient noise scale" in line for line in got["lines"])
    # a checkpoint keeps the policy auto chose, and a resume runs under it
    last = got["choices"][-1]
    assert got["roundtrip"] == {"saved": (last["runs"], last["policy"]), "loaded": (last["runs"], last["policy"]),
                                "step_quota": (0, 0)}


def test_sync_at_half_the_batch_commits_half_and_a_checkpoint_keeps_it():
    """Equal workers on a free link, policy auto, 16 micro-batches each: this job's noise scale at its first choice
    (a few micro-batches) is well below the 32 of a step, where sync at half the accumulation buys more loss per
    sample at the same seconds, so auto runs it from then on (the tiny model's scale grows fast as it converges: the
    run ends before any later look); every sync commit after it holds G/2 micro-batches per worker, the
    learning-rate clock counts tokens, the trajectory is the reference's with those counts, and a checkpoint saves
    and restores the half accumulation."""
    results = run_distributed(train_auto, 2, timeout=240, G=16, compute_s=0.05, link=[(0, 0.0)], steps=7,
                              config=dict(AUTO, auto={"measure_steps": 3, "check_every": 20}), roundtrip=True)
    got = results[0]
    assert results[1]["choices"] == got["choices"]
    first = got["choices"][0]
    assert first["step"] == 3 and first["runs"] == "sync" and first["sync_half"], first
    assert first["noise_scale"] < 32, first
    assert "runs sync at half the batch (was sync)" in got["lines"][0], got["lines"][0]
    assert got["modes"] == ["sync"] * 7 and got["counts"] == [[16, 16]] * 3 + [[8, 8]] * 4, got["counts"]
    assert_trajectories_equal(got["trajectory"], auto_reference(got["modes"], counts=got["counts"], G=16))
    assert got["roundtrip"]["step_quota"] == (8, 8), got["roundtrip"]


def test_an_unresolved_noise_scale_is_priced_at_its_upper_end_not_at_zero():
    """Early in training the rounds' tr(Σ) estimates scatter around a small mean: one that lands at or below zero
    must not price every smaller batch as free. Resolved (the interval excludes zero) it is used as measured."""
    est = NoiseScale()
    for local, glob in [([5.0, 5.2], 1.5), ([4.0, 4.1], 1.1), ([4.4, 4.6], 1.05)]:  # counts 2 and 2, B = 4
        est.add(local, [2, 2], glob)
    s = est.summary()
    assert s["rounds"] == 3 and not s["resolved"] and s["measured"] < s["high"], s
    assert est.value() == pytest.approx(max(s["high"], noise_scale.FLOOR)) and est.value() > s["measured"], s
    # the old reading: the mean's ratio clamped at zero, which priced every batch per committed step
    assert s["measured"] < 0.5 * est.value(), s
    steady = NoiseScale()
    for _ in range(10):
        steady.add([4.0, 4.0], [2, 2], 0.75)  # the same round ten times: no spread, a resolved estimate
    r = steady.summary()
    assert r["resolved"] and r["low"] == pytest.approx(r["high"]) and steady.value() == pytest.approx(r["measured"])
    assert steady.value() == pytest.approx(1.0 / 0.5)  # tr(Σ) = (1 - 0.75) / (1/2 - 1/4) = 1, |g|² = 0.75 - 1/4


def test_acco_s_delay_penalty_falls_with_a_decayed_learning_rate():
    """The one-step delay costs in proportion to the step: the penalty is the configured one while the rate climbs
    or holds, and the configured one times lr / peak as a schedule decays it; a choice it tips says so."""
    from ds_acco.rounds.auto.mode import AutoMode
    from ds_acco.rounds.state import RoundState

    cfg = dict(AUTO, policy="fixed", auto={"acco_step_penalty": 0.4, "switch_margin": 0.05, "measure_steps": 3})
    auto = AutoMode(parse_acco_config(cfg), 8, 2, 0)
    assert auto.penalty(1e-4) == (0.4, "") and auto.penalty(1e-3) == (0.4, "")  # warm-up: the rate climbs
    penalty, note = auto.penalty(2.5e-4)  # decayed to a quarter of its peak
    assert penalty == pytest.approx(0.1) and "0.25 of its peak" in note
    # 50 ms micro-batches, 150 ms rounds: sync 550 ms, acco fixed 2 x max(200, 150) = 400 ms a step; charged 40%,
    # acco costs 560 ms: sync; at the decayed 10%, 440 ms: acco
    state = RoundState(mode="sync", policy="fixed")
    assert auto.decision(figures([50, 50], 150, 550), state, 3, lr=1e-3).apply(state) == "sync"
    assert auto.decision(figures([50, 50], 150, 550), state, 3, lr=2.5e-4).apply(state) == "acco"
    assert auto.choices[-1]["penalty"] == pytest.approx(0.1) and auto.choices[-1]["acco_charged_ms"] == \
        pytest.approx(440)


def test_fastest_is_auto_and_passes_hf_trainers_accelerate():
    """HF Trainer hands the DeepSpeed config to Accelerate, which refuses every "auto" it cannot fill itself:
    the shipped preset spells auto "fastest", which Accelerate lets through and ds_acco reads as auto."""
    import json
    import os

    from accelerate.utils import DeepSpeedPlugin

    from ds_acco.deepspeed.initialize import acco_config_of

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds_configs", "auto_lowbit.json")
    with open(path) as f:
        cfg = json.load(f)
    assert (cfg["acco"]["mode"], cfg["acco"]["policy"]) == ("fastest", "fastest")
    plugin = DeepSpeedPlugin(hf_ds_config=cfg)
    plugin.deepspeed_config_process(must_match=False, gradient_clipping=1.0)  # as Accelerate's prepare() does
    block = acco_config_of(config=plugin.deepspeed_config)
    assert (block.mode, block.policy) == ("auto", "auto")
    assert block.fingerprint() == parse_acco_config(dict(block.model_dump(), mode="auto", policy="auto")).fingerprint()
    with pytest.raises(ValueError, match=r"`acco.mode` not found in kwargs"):  # the spelling it refuses
        DeepSpeedPlugin(hf_ds_config=dict(cfg, acco=dict(cfg["acco"], mode="auto"))).deepspeed_config_process(
            must_match=False, gradient_clipping=1.0)


def test_late_in_a_decayed_run_a_noise_scale_no_longer_buys_adaptive_s_larger_commits():
    """The slow-host long run's figures at step 142 of 170 (host0.log of real_slow_seed1's auto run: one host at half
    speed, sync at half the batch running at 3.1 s per 8 micro-batches, adaptive predicted a third faster with commits
    of 8, a noise scale of 4 micro-batches): priced as at the peak rate, adaptive's larger commits look cheaper to a
    loss and auto switched to them, which then needed more tokens to every loss than the half batch. At the rate the
    run had then, a quarter of its peak, each commit buys about what the other does: half-batch sync stays."""
    cfg = parse_acco_config({"mode": "auto", "policy": "auto", "auto": {"acco_step_penalty": 0.05}})
    rows = [[int(c * 1e3), int(c * 1.39e3), 421_400, 3_104_700, 1700] for c in (283.0, 565.8)]
    kwargs = dict(policy="half", noise=4.0, batch=4.0, batch_scale={"adaptive": 0.94})
    peak = choose(rows, "sync", cfg, 4, step=142, penalty=0.05, rate=1.0, **kwargs)
    late = choose(rows, "sync", cfg, 4, step=142, penalty=0.05 * 0.26, rate=0.26, **kwargs)
    cands = late.figures["candidates"]
    assert cands["acco adaptive"]["step_ms"] < 0.7 * cands["sync half"]["step_ms"], cands  # faster per sample
    assert (peak.mode, peak.policy) == ("acco", "adaptive"), peak.line
    assert late.mode == "sync" and late.sync_half, late.line
    assert cands["acco adaptive"]["score_ms"] > 1.2 * cands["sync half"]["score_ms"], cands
    assert "gradient noise scale 4.0 micro-batches at the learning rate's 0.26 of its peak" in late.line, late.line
