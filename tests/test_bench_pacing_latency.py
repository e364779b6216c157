"""``benchmarks.pacing_latency`` on two emulated hosts, one link without latency and one with: the delay reaches
the link (netem, or the user-space switch where the kernel has none) and the job's own probe reads it, and every
way of sending is timed and reported. Two network namespaces, not a pooled job: ranks on loopback share no link a
delay could be put on, so nothing there could show the probe reading it. A smoke run of two repetitions on a small
collective, not a measurement: that is ``bench_results/pacing_latency``."""

from __future__ import annotations

import json

import pytest

from benchmarks import pacing_latency
from benchmarks.cluster import system

needs_netns = pytest.mark.skipif(not system.netns_available(), reason="needs root and iproute2 (ip, tc)")
SEND = 300_000


@needs_netns
def test_the_probe_reads_the_links_latency_and_every_way_is_timed(tmp_path):
    assert pacing_latency.main(["--rates", "100mbit", "--delays", "0ms,20ms", "--reps", "2", "--gap", "0.05",
                                "--send-bytes", str(SEND), "--out", str(tmp_path)]) == 0
    short, long = (json.loads((tmp_path / f"100mbit_{d}.json").read_text()) for d in ("0ms", "20ms"))
    cluster = json.loads((tmp_path / "100mbit_20ms.cluster.json").read_text())
    assert cluster["delay_s"] == pytest.approx(0.02) and cluster["delay_via"] in ("netem", "switch"), cluster
    # a one-element piece waits out a round trip (gloo's handshake) on the long link, far less on the short one
    assert long["probe"]["latency counted"]["latency_s"] >= 0.04, long["probe"]
    assert short["probe"]["latency counted"]["latency_s"] < 0.02, short["probe"]
    for res in (short, long):
        assert sorted(res["rows"]) == sorted(pacing_latency.WAYS)
        for way, rows in res["rows"].items():
            assert len(rows) == 2 and all(0 < r["seconds"] < 30 for r in rows), (way, rows)
    assert all(r["pieces"] == 1 for r in long["rows"]["whole"])
    readme = (tmp_path / "README.md").read_text()
    assert "| 100mbit | 20ms | latency counted |" in readme and "--delays 0ms,20ms" in readme
