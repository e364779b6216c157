"""What docs/lowbit-and-streaming.md says of whole runs on a link with 25 ms one way ("Over a whole run"), checked on
the published raw files (``bench_results/long_runs_machine2/real_lat25ms_seed*`` against the same machine's runs
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
