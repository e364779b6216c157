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
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Optional

Launch = Callable[[int, int, int], Optional[Callable[[], object]]]
"""Starts the piece ``(start, n)`` in scratch slot ``slot``; returns what completes it (None: it ran whole)."""

PIECE_SECONDS = 0.0125
"""Link time one piece may take: on the emulated cluster 64 KiB pieces (21 ms at 25 Mbit/s, 52 ms at
10 Mbit/s) brought the rounds to the link rate, 256 KiB pieces (84 ms at 25 Mbit/s) did not. Half of the
25 ms it was while pieces went one at a time: :data:`IN_FLIGHT` of them queue as much as one did then."""

PROBE_PIECES = 3
"""Pieces of each of the two sizes a job's first large collective times the link on (:meth:`LinkPacer.probe`)."""

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


class LinkPacer:
    """The send rate this rank's gloo collectives reached, and the piece size it implies."""

    def __init__(self, piece_seconds: float = PIECE_SECONDS, min_piece_bytes: int = MIN_PIECE_BYTES):
        self.piece_seconds, self.min_piece_bytes = piece_seconds, min_piece_bytes
        self.rate: Optional[float] = None
        """Bytes per second this rank sent per collective piece, the best recent figure (None: not measured)."""
        self.last_rate: Optional[float] = None
        """The latest collective's own figure (:meth:`observe`), which :attr:`rate` may hold above."""

    def piece_bytes(self, max_bytes: int) -> int:
        """Bytes one piece may send from this rank: ``max_bytes`` until the link has been measured."""
        if self.rate is None:
            return max_bytes
        return int(min(max_bytes, max(self.min_piece_bytes, self.rate * self.piece_seconds)))

    def observe(self, sent_bytes: int, seconds: float) -> None:
        """One collective (or the pieces after its first) sent ``sent_bytes`` from this rank in ``seconds``."""
        if sent_bytes <= 0 or seconds <= 0:
            return
        rate = self.last_rate = sent_bytes / seconds
        self.rate = rate if self.rate is None else max(rate, 0.5 * self.rate)

    def probe(self, small: int, sent_per_element: int, one: Callable[[int, int], None]) -> int:
        """Time the link on the first elements of a collective; returns how many it sent (:meth:`probe_numel`).

        One piece of ``small`` elements absorbs the other ranks' arrival, then :data:`PROBE_PIECES` of ``small``
        and as many of ``4 * small``: the rate is the extra bytes of the large ones over their extra time, so a
        gloo call's fixed cost (2-3 ms on a busy two-core host, as long as 64 KiB takes at 200 Mbit/s) cancels
        out. Timed from small pieces alone, loopback read as 6 MB/s and would have been cut into 160 KB pieces.
        A link too fast to time this way (no extra time) is left unmeasured: the next collective runs whole."""
        def timed(start: int, n: int) -> float:
            t0 = time.perf_counter()
            for i in range(PROBE_PIECES):
                one(start + i * n, n)
            return time.perf_counter() - t0

        one(0, small)
        t_small = timed(small, small)
        t_large = timed(small * (1 + PROBE_PIECES), 4 * small)
        extra = t_large - t_small
        self.rate = PROBE_PIECES * 3 * small * sent_per_element / extra if extra > 0 else None
        return self.probe_numel(small)

    @staticmethod
    def probe_numel(small: int) -> int:
        return small * (1 + 5 * PROBE_PIECES)

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
        t0 = time.perf_counter()
        pieces = 0
        for start in range(0, total, piece):
            if len(pending) == IN_FLIGHT:
                complete(pending.popleft())
            pending.append(launch(start, min(piece, total - start), pieces % IN_FLIGHT))
            pieces += 1
        while pending:
            complete(pending.popleft())
        self.observe(total * sent_per_element, time.perf_counter() - t0)
        return pieces


def complete(finish: Optional[Callable[[], object]]) -> None:
    """Complete a piece :data:`Launch` started (nothing to do where it ran whole)."""
    if finish is not None:
        finish()
