"""Paced collectives on a link with latency: a piece's fixed time is measured and left out of the rate, and pieces
carry the latency on top of their link time, so they hold their size where the rule before shrank them to the floor.

The pacer is driven here by a model of a link in virtual time (each piece waits the latency, then crosses one shared
wire in order), deterministic; the real link is ``tests/test_bench_pacing_latency.py`` and
``bench_results/pacing_latency``."""

from __future__ import annotations

import pytest

from ds_acco.comm.link_pacing import IN_FLIGHT, LINK_SHARE_FLOOR, MIN_PIECE_BYTES, PIECE_SECONDS, LinkPacer
from tests.sim_clock import SimClock, link


def model_seconds(total: int, piece: int, rate: float, latency: float) -> tuple[float, int]:
    """Seconds a collective of ``total`` bytes takes in pieces of ``piece`` with :data:`IN_FLIGHT` on the wire, each
    piece first waiting ``latency`` and then crossing a wire of ``rate`` bytes/s that carries one piece at a time;
    and how many pieces."""
    sizes = [min(piece, total - start) for start in range(0, total, piece)]
    done: list[float] = []
    wire_free = 0.0
    for i, n in enumerate(sizes):
        launched = done[i - IN_FLIGHT] if i >= IN_FLIGHT else 0.0  # as LinkPacer.run: after the one before last
        wire_free = max(launched + latency, wire_free) + n / rate
        done.append(wire_free)
    return max(done), len(sizes)


def rounds(pacer: LinkPacer, total: int, rate: float, latency: float, n: int = 12) -> list[tuple[int, float]]:
    """``n`` collectives in a row on the model link: each one's piece and seconds (the pacer observes each)."""
    out = []
    for _ in range(n):
        piece = pacer.piece_bytes(total)
        seconds, pieces = model_seconds(total, piece, rate, latency)
        pacer.observe(total, seconds, pieces)
        out.append((piece, seconds))
    return out


@pytest.mark.parametrize("latency", [0.025, 0.05, 0.1])  # a piece's fixed time: about a round trip
def test_pieces_sized_from_the_rate_alone_shrink_on_a_long_link_and_with_the_latency_counted_they_do_not(latency):
    B, total = 12.5e6, 1_650_000  # 100 Mbit/s; a commit's int8 all-to-all on the real-compute bed
    before, now = LinkPacer(), LinkPacer()
    for p in (before, now):
        p.rate = B  # as the probe measured it
    now.latency = latency
    old, new = rounds(before, total, B, latency), rounds(now, total, B, latency)
    whole = latency + total / B
    assert old[-1][0] < old[0][0] and old[-1][1] > 1.5 * whole, old  # the spiral: smaller pieces, slower rounds
    if latency >= PIECE_SECONDS:
        assert old[-1][0] == MIN_PIECE_BYTES, old
    assert new[-1][0] >= B * (PIECE_SECONDS + latency) * 0.9, new  # the pair covers the round trip
    assert all(s < 1.35 * whole for _, s in new), (new, whole)
    assert new[-1][1] < old[-1][1] / 1.4


def test_a_short_link_keeps_its_pieces():
    """No latency: the rule is the one before, piece for piece."""
    B, total = 12.5e6, 1_650_000
    before, now = LinkPacer(), LinkPacer()
    for p in (before, now):
        p.rate = B
    assert rounds(before, total, B, 0.0) == rounds(now, total, B, 0.0)
    assert now.piece_bytes(total) == int(B * PIECE_SECONDS)


def test_observe_leaves_one_latency_per_pair_of_pieces_out_and_credits_at_most_four_times_the_rate_reached():
    pacer = LinkPacer()
    pacer.latency = 0.05
    pacer.observe(1_000_000, 0.3, pieces=4)  # two waits of 50 ms: 0.2 s of wire for 1 MB
    assert pacer.rate == pytest.approx(5e6) and pacer.last_rate == pytest.approx(1e6 / 0.3)
    assert pacer.piece_bytes(1 << 30) == int(5e6 * (PIECE_SECONDS + 0.05))
    fresh = LinkPacer()
    fresh.latency = 0.05
    fresh.observe(1_000_000, 0.2, pieces=8)  # the latency read more than the collective took: the floor
    assert fresh.rate == pytest.approx(1e6 / (LINK_SHARE_FLOOR * 0.2))


def test_the_probe_times_the_latency_on_one_element_pieces():
    """A link of 4 MB/s whose pieces each wait 20 ms: the latency is the least of the tiny pieces' times, and the
    rate still comes from the extra bytes of the large pieces."""
    clock = SimClock()
    pacer = LinkPacer(clock=clock)
    covered = pacer.probe(16 << 10, 1, link(clock, 4e6, 0.02))
    assert covered == LinkPacer.probe_numel(16 << 10)
    assert 0.02 <= pacer.latency < 0.035, pacer.latency
    assert 3.0e6 < pacer.rate < 5.0e6, pacer.rate


# ------------------------------------------------------------------ the published measurements and the words on them
def _published() -> dict:
    import glob
    import json
    import os

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench_results", "pacing_latency")
    out = {}
    for path in glob.glob(os.path.join(root, "*.json")):
        if not path.endswith(".cluster.json"):
            with open(path, encoding="utf-8") as f:
                out[os.path.basename(path)[:-len(".json")]] = json.load(f)
    return out


def test_the_published_collectives_say_what_the_page_says():
    """docs/lowbit-and-streaming.md, "Links with latency": with delay the pieces with the latency counted are
    faster than the rule before, by most on the fastest link with the longest delay; without delay the two are the
    same; one whole call was faster than the pieces on most links with latency."""
    from benchmarks.cluster.units import parse_delay, parse_rate
    from benchmarks.pacing_latency import over_whole

    results = _published()
    assert len(results) >= 8
    gain = {}
    for key, res in results.items():
        rate, delay = key.split("_")
        counted, before = over_whole(res, "latency counted"), over_whole(res, "rate alone")
        if parse_delay(delay) is None:
            assert abs(counted / before - 1) < 0.05, (key, counted, before)
            assert res["probe"]["latency counted"]["latency_s"] < 1e-3, res["probe"]  # a fraction of a millisecond
        else:
            assert counted <= 1.02 * before, (key, counted, before)
            gain[(parse_rate(rate), parse_delay(delay))] = before / counted
    assert max(gain, key=gain.get) == (max(r for r, _ in gain), max(d for _, d in gain)), gain
    behind = [k for k, res in results.items()
              if parse_delay(k.split("_")[1]) is not None and over_whole(res, "latency counted") > 1.02]
    assert 2 * len(behind) > len(gain), behind


def test_the_published_training_runs_say_what_the_page_says():
    """In training on a 25 ms link sync and acco step far faster than under the rule before, acco now ahead of
    sync, and streaming about as fast; without delay the trees step alike."""
    import json
    import os
    import statistics

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench_results", "pacing_latency",
                        "training_ab")
    with open(os.path.join(root, "seconds_per_step.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]

    def median(link, config, tree):
        return statistics.median(r["seconds_per_step"] for r in rows if (r["link"], r["config"], r["tree"]) ==
                                 (link, config, tree))

    def ratio(link, config):
        return median(link, config, "this") / median(link, config, "baseline")

    for config in ("sync_lowbit_half", "acco_lowbit_int4_fixed_half"):
        assert ratio("100mbit@25ms", config) < 0.7, config
        assert 0.9 < ratio("100mbit@0ms", config) < 1.1, config
    for on in ("100mbit@0ms", "100mbit@25ms"):  # it hides its rounds either way
        assert 0.95 < ratio(on, "streaming_int8_half") < 1.05, on

    acco, sync = "acco_lowbit_int4_fixed_half", "sync_lowbit_half"  # acco ahead of sync now, behind it before
    assert median("100mbit@25ms", acco, "this") < median("100mbit@25ms", sync, "this")
    assert median("100mbit@25ms", acco, "baseline") > median("100mbit@25ms", sync, "baseline")


def test_the_training_ab_times_steps_after_the_warm_up_and_tables_both_trees(tmp_path):
    import json

    from benchmarks.pacing_latency_training import FROM_STEP, seconds_per_step, table

    log = tmp_path / "train.jsonl"
    log.write_text("".join(json.dumps({"step": k, "train_s": 5.0 * k if k < FROM_STEP else 2.0 * k}) + "\n"
                           for k in range(1, 31)) + json.dumps({"eval": 1}) + "\n")
    assert seconds_per_step(str(log)) == pytest.approx(2.0)  # the slow warm-up steps are not counted
    rows = [{"config": "c", "link": "100mbit@25ms", "tree": t, "rep": r, "seconds_per_step": s}
            for t, r, s in (("baseline", 0, 2.0), ("this", 0, 1.0), ("this", 1, 1.2), ("baseline", 1, 2.4))]
    assert table(rows).splitlines()[2] == ("| 100mbit, 25ms one way | c | 2.200 (2.000-2.400) | 1.100 (1.000-1.200) "
                                           "| 0.50x |")
