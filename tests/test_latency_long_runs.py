"""Long runs on a link with latency: how the report names and compares such a bed (synthetic rows,
tests/long_runs_rows.py), and what docs/lowbit-and-streaming.md says of the published runs ("Over a whole run"),
checked on their raw files (``bench_results/long_runs_machine2/real_lat25ms_seed*`` against the same machine's runs
without latency): the prose carries no figure, so these tests are what keep it true when the runs are measured
again. No launch: the runs are the long-run protocol's (docs/long-runs-reproduce.md).
"""

from __future__ import annotations

import glob
import os
import statistics

import pytest

from benchmarks.report import long_runs as lr
from benchmarks.report.pages import latency
from benchmarks.report.pages import long_runs as page
from benchmarks.report.pages.sets import ROOT
from tests.long_runs_rows import base_loss, protocol, row, tokens_to, write_second_machine

LATE, PLAIN = ("long-real-lat25ms", "100mbit"), ("long-real", "100mbit")
STREAMS = ("streaming_int8_half", "auto_lowbit_int4_streaming", "torchft_diloco_half")
"""Streaming by hand, auto with ``auto.streaming`` and torchft's DiLoCo, each at half the batch."""
ROUNDS = ("sync_lowbit_half", "acco_lowbit_int4_fixed_half")
"""Sync and acco at the same (half) batch: a gradient round every step."""


@pytest.fixture(scope="module")
def summary() -> dict:
    return lr.summarize(lr.collect(page.folders(ROOT, page.SECOND)))


def cost(summary: dict, config: str) -> float:
    """The median over seeds of a whole run's training seconds with the latency over the same seed's without."""
    ratios = latency.seed_ratios(summary[LATE]["rows"][config], summary[PLAIN]["rows"][config], "train_s")
    assert len(ratios) >= 3, (config, ratios)  # a published figure: three seeds or more
    return statistics.median(ratios)


def test_streaming_hides_more_of_the_latency_than_a_gradient_round_every_step(summary):
    worst = max(cost(summary, c) for c in STREAMS)
    assert worst < min(cost(summary, c) for c in ROUNDS)


def test_acco_pays_the_latency_about_as_much_as_sync_at_the_same_batch(summary):
    """"the overlap hides little of the latency": acco's cost within a tenth of sync's (either side)."""
    acco, sync = (cost(summary, c) for c in ROUNDS[::-1])
    assert abs(acco - sync) <= 0.1 and sync > 1.1  # and the latency does cost sync (a link without it reads 1x)


def first_looks(config: str) -> list[str]:
    """Auto's first line in each seed's run of ``config`` (rank 0's log, kept beside the results)."""
    logs = sorted(glob.glob(os.path.join(ROOT, "bench_results", "long_runs_machine2", "real_lat25ms_seed*", "runs",
                                         f"time_to_loss-{config}-100mbit-2h-long-real-lat25ms", "host0.log")))
    assert len(logs) >= 3
    found = []
    for path in logs:
        with open(path, encoding="utf-8") as f:
            found.append(next(line for line in f if line.startswith("ds_acco auto")))
    return found


def test_auto_with_streaming_starts_streaming_before_the_first_round():
    for line in first_looks("auto_lowbit_int4_streaming"):
        assert line.startswith("ds_acco auto before the first round") and "runs streaming" in line, line


def test_auto_without_streaming_runs_the_best_gradient_mode_from_its_first_look():
    for line in first_looks("auto_lowbit_int4"):
        assert line.startswith("ds_acco auto at step 2:") and "runs acco fixed at half the batch" in line, line


def test_a_bed_with_latency_is_a_bed_of_its_own_and_what_the_latency_costs_is_read_seed_for_seed(tmp_path):
    """The real bed re-run with 25 ms one way on the second machine: its own rows and overlap targets, named with
    its latency, and each config's seconds with the latency over the same seed's without (the same losses, so the
    ratio is the link's alone)."""
    protocol(tmp_path)
    speeds = {"sync": 8, "sync_lowbit_half": 16, "acco_lowbit_int4_fixed_half": 20}
    slowed = {"sync": 2.0, "sync_lowbit_half": 1.6, "acco_lowbit_int4_fixed_half": 1.1}
    folders = {}
    for seed in (4, 5, 6):
        k = 1 + 0.1 * (seed - 4)
        for name, late in (("real", False), ("real_lat25ms", True)):
            rows = [row(c, "100mbit", seed, base_loss,
                        lambda t, v=v, s=(slowed[c] if late else 1) * k: s * t / v) for c, v in speeds.items()]
            folders[f"{name}_seed{seed}"] = [dict(r, delay="25ms") if late else r for r in rows]
    write_second_machine(tmp_path, folders)
    text = page.second_machine(str(tmp_path))
    assert "| real compute, 100 Mbit/s, 25 ms one way | 50%: 4.000 |" in text
    to = tokens_to(3.5)
    for config, first in (("sync", True), ("sync_lowbit_half", False), ("acco_lowbit_int4_fixed_half", False)):
        late, plain = 1.1 * slowed[config] * to / speeds[config], 1.1 * to / speeds[config]  # seed 5: the median
        bed = "real compute, 100 Mbit/s, 25 ms one way" if first else ""
        cost = f"{slowed[config]:.2f}x ({slowed[config]:.2f})"
        vs = f"{slowed[config] * 8 / speeds[config] / 2.0:.2f}x"  # over sync fp32 (8 tokens a second, 2x slowed)
        spread = (f"{0.2 * x / 1.1:.1f}" for x in (late, plain))  # seeds 4 and 6: 1.0 and 1.2 times the time
        cells = f"{late:.1f} ({next(spread)}) | {vs} | {plain:.1f} ({next(spread)})"
        assert f"| {bed} | {lr.SHORT[config]} | {cells} | {cost} | {cost} |" in text
    assert ("| the better ACCO vs the better sync low-bit to the baseline's 75% loss (real compute, 100 Mbit/s, 25 ms "
            "one way) | 0.55 | <= 0.85 | met | acco_lowbit_int4_fixed_half against sync_lowbit_half; by seed (4, 5, 6): "
            "0.55, 0.55, 0.55") in text
    # a pair the bed did not run (acco fixed and sync low-bit at the bed's batch) is no row of it, not an unknown one
    assert "at equal batch to the baseline's final loss (real compute, 100 Mbit/s, 25 ms one way)" not in text
    assert "at equal batch, half the bed's to the baseline's final loss (real compute, 100 Mbit/s, 25 ms" in text
    assert "25 ms one way" not in page.long_runs(str(tmp_path))  # the first machine's page: no such bed
