"""Paced collectives on a link with latency: a piece's fixed time is measured and left out of the rate, and pieces
carry the latency on top of their link time, so they hold their size where the rule before shrank them to the floor.

The pacer is driven here by a model of a link in virtual time (each piece waits the latency, then crosses one shared
wire in order), deterministic; the real link is ``tests/test_bench_pacing_latency.py`` and
``bench_results/pacing_latency``."""

from __future__ import annotations

import time

import pytest

from ds_acco.comm.link_pacing import IN_FLIGHT, LINK_SHARE_FLOOR, MIN_PIECE_BYTES, PIECE_SECONDS, LinkPacer


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
    def link(start, n):
        time.sleep(0.02 + n / 4e6)

    pacer = LinkPacer()
    covered = pacer.probe(16 << 10, 1, link)
    assert covered == LinkPacer.probe_numel(16 << 10)
    assert 0.02 <= pacer.latency < 0.035, pacer.latency
    assert 3.0e6 < pacer.rate < 5.0e6, pacer.rate
