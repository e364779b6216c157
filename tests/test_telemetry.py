"""Per-round telemetry: counts, exact wire bytes, the hidden fraction, and the log line."""

from __future__ import annotations

from tests import fault_workers as F
from tests.dist_harness import run_distributed


def test_bytes_counts_and_log_line():
    world = 2
    cfg = {"mode": "sync", "telemetry": {"log_every": 1}}
    r0, _ = run_distributed(F.telemetry_run, world, config=cfg, G=4, steps=3)
    rec = r0["records"][0]
    assert rec.counts == [4, 4] and rec.kind == "commit"
    # ring model: counts all-gather (world x 3 int64: count, nonfinite, pacing vote) + reduce-scatter + all-gather
    # of fp32 buffers
    payload = world * 3 * 8 + sum(2 * n * 4 for n in r0["layout"])
    assert rec.bytes_sent == rec.bytes_received == payload * (world - 1) // world
    assert r0["summary"]["bytes_sent"] == 3 * rec.bytes_sent
    assert r0["summary"]["peak_round_bytes"] == rec.bytes_sent  # every sync round sends the same
    assert any("hidden" in line and "round 0" in line for line in r0["log"]), r0["log"]
    # the communication thread's CPU per stage: what a round takes from compute on a shared core
    for rec in r0["records"]:
        assert set(rec.stage_cpu_s) == set(rec.stage_s) == {"count all-gather", "reduce-scatter", "shard step",
                                                            "all-gather"}
        assert all(0 < rec.stage_cpu_s[k] <= rec.stage_s[k] + 1e-3 for k in rec.stage_s), (rec.stage_cpu_s, rec.stage_s)


def test_hidden_fraction_sync_vs_adaptive():
    sync, _ = run_distributed(F.telemetry_run, 2, config={"mode": "sync"}, steps=4)
    acco, _ = run_distributed(F.telemetry_run, 2, config={"mode": "acco", "policy": "adaptive"},
                              steps=4, sleep_s=0.02)
    # sync waits for every round; adaptive only swaps rounds that have already ended
    assert sync["hidden"] < 0.5, sync["summary"]
    assert acco["hidden"] > 0.5, acco["summary"]
    assert all(r.waited_s <= r.round_s + 0.05 for r in acco["records"])
