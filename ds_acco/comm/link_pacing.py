"""How large a piece of a gloo collective may be, from the rate this rank's link was measured at.

Why pieces at all: a round's all-to-all or all-gather sends in both directions at once. Where the path holds a deep
queue (a shaped WAN link, a router or VPN gateway with a large buffer; on the emulated cluster, ``tbf`` with 0.5 s of
queue), each host's queue fills with its own bulk data and the acknowledgements of the other direction's transfer wait
behind it, so one direction stalls until the other has drained: a 3.3 MB low-bit round moved at 13-14 Mbit/s of a
25 Mbit/s link, 22 Mbit/s paced (BENCHMARKS.md, "Time to loss"). A collective cut into pieces that each take a few tens
of milliseconds of link time keeps no more than a piece or two (:data:`IN_FLIGHT`) queued in each direction, so the
other direction's acknowledgements wait at most that long.

Why measured, not configured: the piece that suits a 10 Mbit/s link (tens of KiB) would cut a loopback or datacenter
round into thousands of collectives, each paying a fixed latency. The piece size follows the send rate of earlier pieces
(or of the head of a job's first large collective, :meth:`LinkPacer.probe`): ``PIECE_SECONDS`` of link time, never below
``MIN_PIECE_BYTES`` and never above the caller's bound; the ranks then agree on one (:mod:`ds_acco.comm.collectives`). A
piece's time includes waiting for the slowest rank to arrive, which makes the rate look lower, never higher; the
estimate therefore keeps the best recent rate and lets it decay only by half per observation.

Why the latency is measured apart: a piece costs a fixed time that its bytes do not shorten (gloo's handshake, a round
trip on a long link, the call itself), and only :data:`IN_FLIGHT` pieces are on the wire at once. Sized from the rate
a collective reached, pieces on a long link shrink round after round: small pieces spend their time waiting, the rate
they reach reads low, the next pieces are smaller still, down to ``MIN_PIECE_BYTES``. With 25 ms one way at 100 Mbit/s
a round's 1.65 MB all-to-all took 0.72 s that way against 0.19 s whole (``bench_results/pacing_latency``). So
the probe times a few one-element pieces (:attr:`LinkPacer.latency`), a collective's rate leaves that fixed time out,
and a piece carries the link's rate for ``PIECE_SECONDS`` plus the latency: its pair on the wire covers the round
trip, and the queue they leave behind is what it was on a short link.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from .clock import WALL, Clock

Launch = Callable[[int, int, int], Optional[Callable[[], object]]]
"""Starts the piece ``(start, n)`` in scratch slot ``slot``; returns what completes it (None: it ran whole)."""

PIECE_SECONDS = 0.0125
"""Link time one piece may take: on the emulated cluster 64 KiB pieces (21 ms at 25 Mbit/s, 52 ms at
10 Mbit/s) brought the rounds to the link rate, 256 KiB pieces (84 ms at 25 Mbit/s) did not. Half of the
25 ms it was while pieces went one at a time: :data:`IN_FLIGHT` of them queue as much as one did then."""

PROBE_PIECES = 3
"""Pieces of each of the two sizes a job's first large collective times the link on (:meth:`LinkPacer.probe`), and
one-element pieces it times the latency on."""

IN_FLIGHT = 2
"""Pieces on the wire at once. One at a time, the link idled between pieces while each rank's communication
thread woke, launched the next and the peers met again: a round's 1.65 MB all-to-all on the emulated cluster's
100 Mbit/s link (one core per host, the bed's model training on it) moved at 6.8 MB/s in pieces of 25 ms one at a
time, 11.8 MB/s two at a time (7.8 and 11.8 MB/s in pieces of 12.5 ms); at 25 and 10 Mbit/s two at a time were as
fast or faster (``python -m benchmarks.pieces_in_flight``, ``bench_results/pieces_in_flight``). Two pieces of
:data:`PIECE_SECONDS` queue no more than one piece of twice that did."""

MIN_PIECE_BYTES = 64 << 10
"""Below this a piece's fixed per-collective cost (a few hundred microseconds on gloo) starts to show even
on a slow link."""

LINK_SHARE_FLOOR = 0.25
"""The least share of a collective's seconds :meth:`LinkPacer.observe` credits to its bytes: the latency
taken out may raise the rate over what the collective reached by 4x at most, whatever the latency read."""


class LinkPacer:
    """The send rate this rank's gloo collectives reached, and the piece size it implies."""

    def __init__(self, piece_seconds: float = PIECE_SECONDS, min_piece_bytes: int = MIN_PIECE_BYTES,
                 clock: Clock = WALL):
        self.clock = clock
        """What pieces are timed on: the wall clock in a job (the link is real, whatever the engine's
        ``clock=``: :mod:`ds_acco.comm.clock`); a test's model of a link passes one it advances."""
        self.piece_seconds, self.min_piece_bytes = piece_seconds, min_piece_bytes
        self.rate: Optional[float] = None
        """Bytes per second this rank's pieces crossed the link at, the latency left out; the best recent figure
        (None: not measured)."""
        self.last_rate: Optional[float] = None
        """The latest collective's own figure, its bytes over its seconds (:meth:`observe`)."""
        self.latency = 0.0
        """Seconds one piece costs whatever its size (:meth:`probe`; 0 until measured)."""

    def piece_bytes(self, max_bytes: int) -> int:
        """Bytes one piece may send from this rank: ``max_bytes`` until the link has been measured."""
        if self.rate is None:
            return max_bytes
        return int(min(max_bytes, max(self.min_piece_bytes, self.rate * (self.piece_seconds + self.latency))))

    def observe(self, sent_bytes: int, seconds: float, pieces: int = 1) -> None:
        """One collective (or the pieces after its first) sent ``sent_bytes`` from this rank in ``seconds``, in
        ``pieces`` pieces: each :data:`IN_FLIGHT` of them paid the latency once, which the rate leaves out."""
        if sent_bytes <= 0 or seconds <= 0:
            return
        self.last_rate = sent_bytes / seconds
        waits = -(-pieces // IN_FLIGHT)
        rate = sent_bytes / max(seconds - waits * self.latency, LINK_SHARE_FLOOR * seconds)
        self.rate = rate if self.rate is None else max(rate, 0.5 * self.rate)

    def probe(self, small: int, sent_per_element: int, one: Callable[[int, int], None]) -> int:
        """Time the link on the first elements of a collective; returns how many it sent (:meth:`probe_numel`).

        One piece of ``small`` elements absorbs the other ranks' arrival; :data:`PROBE_PIECES` of one element each
        time the latency (the least of them: a piece can be held up, not sped up); then :data:`PROBE_PIECES` of
        ``small`` and as many of ``4 * small``: the rate is the extra bytes of the large ones over their extra time,
        so a gloo call's fixed cost (2-3 ms on a busy two-core host, as long as 64 KiB takes at 200 Mbit/s) and the
        latency cancel out. Timed from small pieces alone, loopback read as 6 MB/s and would have been cut into
        160 KB pieces. A link too fast to time this way (no extra time) is left unmeasured: the next collective
        runs whole."""
        def timed(start: int, n: int) -> float:
            t0 = self.clock.now()
            for i in range(PROBE_PIECES):
                one(start + i * n, n)
            return self.clock.now() - t0

        one(0, small)
        tiny = []
        for i in range(PROBE_PIECES):
            t0 = self.clock.now()
            one(small + i, 1)
            tiny.append(self.clock.now() - t0)
        self.latency = min(tiny)
        start = small + PROBE_PIECES
        t_small = timed(start, small)
        t_large = timed(start + PROBE_PIECES * small, 4 * small)
        extra = t_large - t_small
        self.rate = PROBE_PIECES * 3 * small * sent_per_element / extra if extra > 0 else None
        return self.probe_numel(small)

    @staticmethod
    def probe_numel(small: int) -> int:
        return small * (1 + 5 * PROBE_PIECES) + PROBE_PIECES

    def run(self, total: int, piece: int, sent_per_element: int, launch: Launch) -> int:
        """Cover ``total`` elements in consecutive pieces of ``piece``, :data:`IN_FLIGHT` of them on the wire at
        once, timing them; returns the number of pieces.

        ``launch(start, n, slot)`` starts one piece and returns what completes it (None: it ran whole); a piece
        is completed before the piece after next is launched, so a caller needs :data:`IN_FLIGHT` scratch slots,
        ``slot`` naming the one this piece may use. The rate is taken over the whole collective, the other
        ranks' arrival included (lower, never higher). With pieces overlapping, the time after the first piece
        ended no longer measures the rest: two to six 64 KiB pieces at 10 Mbit/s read 0.47-0.76 of the link
        that way, 0.84-1.03 whole.
        """
        pending: deque = deque()
        t0 = self.clock.now()
        pieces = 0
        for start in range(0, total, piece):
            if len(pending) == IN_FLIGHT:
                complete(pending.popleft())
            pending.append(launch(start, min(piece, total - start), pieces % IN_FLIGHT))
            pieces += 1
        while pending:
            complete(pending.popleft())
        self.observe(total * sent_per_element, self.clock.now() - t0, pieces)
        return pieces


def complete(finish: Optional[Callable[[], object]]) -> None:
    """Complete a piece :data:`Launch` started (nothing to do where it ran whole)."""
    if finish is not None:
        finish()
