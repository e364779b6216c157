"""How large a piece of a gloo collective may be, from the rate this rank's link was measured at.

Why pieces at all: a round's all-to-all or all-gather sends in both directions at
once. Where the path holds a deep queue (a shaped WAN link, a router or VPN
gateway with a large buffer; on the emulated cluster, ``tbf`` with 0.5 s of
queue), each host's queue fills with its own bulk data and the acknowledgements
of the other direction's transfer wait behind it, so one direction stalls until
the other has drained. Measured on the emulated cluster: one 0.45 MB
reduce-scatter per round took either the link time or exactly twice it, never in
between, and a 3.3 MB low-bit round moved its bytes at 13-14 Mbit/s of a 25 Mbit/s
link. A collective cut into pieces that each take a few tens of milliseconds of
link time keeps no more than one piece queued in each direction, so the other
direction's acknowledgements wait at most that long.

Why measured, not configured: the piece that suits a 10 Mbit/s link (tens of KiB)
would cut a loopback or datacenter round into thousands of collectives, each
paying a fixed latency. The piece size follows the send rate of earlier pieces:
``PIECE_SECONDS`` of link time, never below ``MIN_PIECE_BYTES`` and never above
the caller's bound (the scratch-memory bound of :mod:`ds_acco.comm.collectives`).
Ranks start with the largest piece (as before pacing existed), so fast links
never see small pieces; a slow link is found by the first round and paced from
the second on. Each rank measures its own link; the ranks cut with the smallest
piece any of them asked for (:meth:`ds_acco.comm.collectives.RoundCollectives.adopt_pacing`). A piece's time includes waiting for the slowest rank to arrive,
which makes the rate look lower, never higher; the estimate therefore keeps the
best recent rate and lets it decay only by half per observation.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

PIECE_SECONDS = 0.025
"""Link time one piece may take: on the emulated cluster 64 KiB pieces (21 ms at 25 Mbit/s, 52 ms at
10 Mbit/s) brought the rounds to the link rate, 256 KiB pieces (84 ms at 25 Mbit/s) did not."""

MIN_PIECE_BYTES = 64 << 10
"""Below this a piece's fixed per-collective cost (a few hundred microseconds on gloo) starts to show even
on a slow link."""


class LinkPacer:
    """The send rate this rank's gloo collectives reached, and the piece size it implies."""

    def __init__(self, piece_seconds: float = PIECE_SECONDS, min_piece_bytes: int = MIN_PIECE_BYTES):
        self.piece_seconds, self.min_piece_bytes = piece_seconds, min_piece_bytes
        self.rate: Optional[float] = None
        """Bytes per second this rank sent per collective piece, the best recent figure (None: not measured)."""

    def piece_bytes(self, max_bytes: int) -> int:
        """Bytes one piece may send from this rank: ``max_bytes`` until the link has been measured."""
        if self.rate is None:
            return max_bytes
        return int(min(max_bytes, max(self.min_piece_bytes, self.rate * self.piece_seconds)))

    def observe(self, sent_bytes: int, seconds: float) -> None:
        """One collective (or the pieces after its first) sent ``sent_bytes`` from this rank in ``seconds``."""
        if sent_bytes <= 0 or seconds <= 0:
            return
        rate = sent_bytes / seconds
        self.rate = rate if self.rate is None else max(rate, 0.5 * self.rate)

    def run(self, total: int, piece: int, sent_per_element: int, one: Callable[[int, int], None]) -> int:
        """Call ``one(start, n)`` for consecutive pieces of ``piece`` elements covering ``total``, timing them.

        The first piece of several also absorbs the other ranks' arrival, so the rate is taken from the
        rest; a collective of one piece is measured whole. Returns the number of pieces.
        """
        t_first = t0 = time.perf_counter()
        pieces = 0
        for start in range(0, total, piece):
            one(start, min(piece, total - start))
            pieces += 1
            if pieces == 1:
                t_first = time.perf_counter()
        t_end = time.perf_counter()
        if pieces == 1:
            self.observe(total * sent_per_element, t_end - t0)
        else:
            self.observe((total - piece) * sent_per_element, t_end - t_first)
        return pieces
