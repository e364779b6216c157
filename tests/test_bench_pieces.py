"""``benchmarks.pieces_in_flight`` on two emulated hosts: every setting runs and is reported (a smoke run of one
repetition on a small collective, not a measurement: that is ``bench_results/pieces_in_flight``). Two network
namespaces, not a pooled job: on loopback the probe measures no link and nothing is paced, so no setting would
cut the collective into pieces at all."""

from __future__ import annotations

import json

import pytest

from benchmarks import pieces_in_flight
from benchmarks.cluster import system
from ds_acco.comm.link_pacing import MIN_PIECE_BYTES

needs_netns = pytest.mark.skipif(not system.netns_available(), reason="needs root and iproute2 (ip, tc)")
SEND = 300_000


@needs_netns
def test_pieces_in_flight_times_every_setting_on_a_shaped_link(tmp_path):
    assert pieces_in_flight.main(["--rates", "100mbit", "--reps", "1", "--send-bytes", str(SEND),
                                  "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "100mbit.json").read_text())
    assert res["send_bytes"] == SEND and res["probed_bytes_per_s"] < 12.5e6 * 1.1  # the job's own probe of the link
    settings = [(r["load"], r["piece_ms"], r["in_flight"]) for r in res["rows"]]
    assert sorted(settings) == sorted((load, ms, k) for load in ("idle", "training") for ms in (25.0, 12.5)
                                      for k in (1, 2))
    for r in res["rows"]:
        assert r["piece_bytes"] >= MIN_PIECE_BYTES, r  # the link was measured: paced
        assert len(r["seconds"]) == 1 and SEND / 12.5e6 * 0.5 < r["seconds"][0] < 30, r  # tbf lets little through
    readme = (tmp_path / "README.md").read_text()
    assert "| 100mbit | training | 12.5 |" in readme and "--rates 100mbit" in readme
