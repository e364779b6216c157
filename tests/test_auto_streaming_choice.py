"""``mode: "auto"`` with ``acco.auto.streaming``: when the job goes to streaming, and at which batch its inner steps
run. Choices on given figures (no processes): the look before the first round on the probed rate, and streaming
priced at the batch it would run against its own threshold.
"""

from __future__ import annotations

import pytest

from ds_acco.config import parse_acco_config
from ds_acco.rounds.auto.choice import choose
from ds_acco.rounds.auto.mode import AutoMode
from ds_acco.rounds.state import RoundState
from tests.auto_workers import figures

G = 4
AUTO = {"mode": "auto", "auto": {"measure_steps": 3, "check_every": 2}}


def test_the_look_before_the_first_round_prices_a_commit_from_the_probed_rate():
    """Step 1's compute (its first micro-batch left out) and a commit round's bytes at the probe's rate make the
    figures; without a rate (a link too fast to time) the rank gives zeros and no choice is made. The line says what
    was predicted: here a 1 MB commit at 1.25 MB/s (0.8 s) against 4 x 50 ms makes sync cost 5x its compute."""
    cfg = parse_acco_config(dict(AUTO, auto=dict(AUTO["auto"], streaming=True), streaming={"fragments": 2}))
    auto = AutoMode(cfg, G, 2, 0, commit_bytes=1_000_000)
    assert auto.look_first() and not AutoMode(cfg, 1, 2, 0).look_first()  # G = 1: no compute to time
    assert auto.first_figures(1.25e6) == [0] * 5  # no micro-batch ended yet
    auto.timer._first = [10.0, 10.05, 10.10, 10.15]  # the ends of step 1's micro-batches
    assert auto.first_figures(None) == [0] * 5
    row = auto.first_figures(1.25e6)
    assert row == [50_000, 0, 800_000, 0, 0], row
    choice = choose([row, [0] * 5], "sync", cfg, G, step=0, streaming=True)
    assert choice is None  # a rank without figures: every rank waits for measured ones
    choice = choose([row, row], "sync", cfg, G, step=0, streaming=True)
    assert choice.mode == "streaming" and choice.figures["streaming_ratio"] == pytest.approx(5.0, rel=1e-3)
    assert choice.line.startswith("ds_acco auto before the first round: compute 50.0 ms per micro-batch"), choice.line
    assert "round 800.0 ms predicted from a probe of the link" in choice.line and "sync 1000.0 ms (predicted)" in \
        choice.line, choice.line


def test_streaming_steps_on_half_the_batch_where_the_noise_scale_prices_that_cheaper():
    """Where the batch may change (``policy: "auto"``), streaming's inner steps take whichever of ``G`` and ``G/2`` the
    noise scale prices best: half with a small scale (a committed step of either batch buys about the same loss), the
    full batch with a scale far above the batch (half a batch's noise outweighs its steps), and the full batch
    wherever the policy keeps the batch."""
    row = [50_000, 0, 800_000, 0, 0]
    for policy, noise, half in (("auto", 0.0, True), ("auto", 0.5, True), ("auto", 1000.0, False),
                                ("fixed", 0.0, False)):
        cfg = parse_acco_config(dict(AUTO, policy=policy, auto=dict(AUTO["auto"], streaming=True),
                                     streaming={"fragments": 2}))
        choice = choose([row, row], "sync", cfg, G, step=0, streaming=True, noise=noise)
        assert choice.mode == "streaming" and choice.streaming_half is half, (policy, noise, choice.figures)
        assert ("runs streaming at half the batch (2 micro-batches an inner step)" in choice.line) is half, \
            choice.line
        if noise == 0.0:  # what a look before two rounds measured the scale takes it as (auto's own decision)
            decided = AutoMode(cfg, G, 2, 0).decision([row, row], RoundState(), 0)
            assert decided.mode == "streaming" and decided.step_quota == (G // 2 if half else 0), decided


def test_streaming_is_priced_at_the_batch_it_would_run():
    """Where streaming would run at half the batch, the chosen mode is priced against streaming's bare compute at
    that batch, with its own threshold (``STREAMING_HINT_HALF``). Compute 50 ms a micro-batch, 55 ms with a round in
    flight, a 60 ms round, noise below what the rounds resolve (every committed step alike): acco fixed at half the
    batch (2 x 2 x 60 ms a nominal step, 5% dearer for its delay, priced at half the micro-batches) costs 1.26x
    streaming's bare 200 ms at half the batch, so the job streams at half, where against full-batch streaming's price
    (0.63x) it never would; with the policy fixed, streaming runs at the full batch, acco fixed costs 1.16x that, under
    ``STREAMING_HINT``; with compute not slowed and a shorter round (the sleep bed's case) acco at half ties."""
    from ds_acco.rounds.auto.choice import STREAMING_HINT, STREAMING_HINT_HALF

    def pick(policy, c_acco_ms, round_ms):
        cfg = parse_acco_config(dict(AUTO, policy=policy, auto=dict(AUTO["auto"], streaming=True,
                                                                     acco_step_penalty=0.05),
                                     streaming={"fragments": 2}))
        return choose(figures([50, 50], round_ms, 4 * 50 + round_ms, c_acco_ms=c_acco_ms), "sync", cfg, G, step=3,
                      streaming=True, noise=0.0)

    half = pick("auto", 55, 60)
    assert half.mode == "streaming" and half.streaming_half, half.line
    assert half.figures["streaming_ratio"] == pytest.approx(2 * 2 * 60 * 1.05 / 2 / 100, rel=1e-3)
    assert half.figures["streaming_hint"] == STREAMING_HINT_HALF < half.figures["streaming_ratio"] < STREAMING_HINT
    assert "runs streaming at half the batch (2 micro-batches an inner step)" in half.line, half.line
    assert "costs 1.26x the bare compute at half the batch to a loss" in half.line, half.line
    fixed = pick("fixed", 55, 60)
    assert fixed.mode == "acco" and fixed.figures["streaming_hint"] == STREAMING_HINT, fixed.line
    assert fixed.figures["streaming_ratio"] == pytest.approx(2 * 110 * 1.05 / 200, rel=1e-3)
    assert "streaming" not in fixed.line.split(": runs")[-1], fixed.line
    tie = pick("auto", 50, 40)
    assert tie.mode == "acco" and tie.acco_half and not tie.streaming_half, tie.line
    assert tie.figures["streaming_ratio"] == pytest.approx(1.05, rel=1e-3), tie.line
