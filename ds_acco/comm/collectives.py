"""The collectives a round issues, with a byte count of what each puts on the wire.

Byte figures follow the bandwidth-optimal (ring) algorithms NCCL and gloo use for large payloads: a reduce-scatter or
all-gather of an ``M``-byte buffer over ``N`` ranks sends and receives ``M * (N - 1) / N`` bytes per rank, an all-reduce
twice that. They are the payload a link must carry, not packet-level counts; the benchmark measures the interface
counters next to them. All collectives go to the engine's own process group (:mod:`ds_acco.comm.engine_lifecycle` says
why).

[Note: the reduce-scatter on gloo]
gloo's ``reduce_scatter`` puts the whole payload on the wire (measured on the emulated cluster: 1.0x the payload per
rank at 2 ranks, as much as an all-reduce), where a bandwidth-optimal one moves ``(N - 1) / N``. On gloo the sum is
therefore built from an all-to-all, as the int8 exchange already is: rank ``r`` receives every rank's ``r``-th slice and
adds them up locally, so each rank sends and receives exactly ``(N - 1) / N`` of the payload. NCCL's reduce-scatter is
already ring-optimal and is used as it is.

[Note: pieces on gloo]
On gloo the all-to-all, the reduce-scatter built on it and the all-gather run in pieces: never more than
``MAX_PIECE_NUMEL`` elements per rank (a bound on the scratch they need), and on a slow link fewer
(:mod:`ds_acco.comm.link_pacing`). Every rank must cut a collective the same way, and each measured its own rate, so a
piece size takes effect only once the ranks agreed on it (:meth:`RoundCollectives.adopt_pacing`; before any rate is
known, :meth:`RoundCollectives._probe`). Two pieces are on the wire at once (gloo's asynchronous calls, each into
its own scratch slot), so the link does not idle while a communication thread wakes between them.
``WireBytes.calls`` counts collectives as the caller issued them, ``WireBytes.pieces`` the gloo calls that carried them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from .link_pacing import MIN_PIECE_BYTES, PROBE_PIECES, Launch, LinkPacer, complete
from .thread_policy import threads_started_here_yield

# torch 2.13 renamed the *_tensor collectives; keep one spelling for the range we support.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


MAX_PIECE_NUMEL = 1 << 20
"""The most elements per rank slice in one gloo call (the int8 exchanges size their pieces from it too):
bounds the piece scratch to ``2 * IN_FLIGHT * N * 1 Mi`` elements (a send and a receive buffer for each piece on
the wire, :data:`~ds_acco.comm.link_pacing.IN_FLIGHT`) whatever the model size (gloo's own
reduce-scatter allocated 1.5x the payload in temporaries)."""

PRICED_PIECE_SMALLS = 16
"""The largest piece :meth:`RoundCollectives.probe_link` prices a round with, in the probe's small pieces
(1 MiB a rank on two ranks): a link with latency agrees pieces of several hundred KiB, and pricing it on
smaller ones would read its rounds slower than they run."""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class WireBytes:
    """Bytes this rank sent and received, by the ring model above, and how many collectives moved them."""

    sent: int = 0
    received: int = 0
    calls: int = 0
    pieces: int = 0
    """gloo calls that carried the ``calls`` (more than ``calls`` where a collective went in pieces)."""

    def add(self, payload: int, world_size: int, factor: int = 1, pieces: int = 1) -> None:
        self.calls += 1
        self.pieces += pieces
        moved = factor * payload * (world_size - 1) // world_size
        self.sent += moved
        self.received += moved


class RoundCollectives:
    """Thin wrappers over ``torch.distributed`` on a dedicated process group."""

    def __init__(self, group: dist.ProcessGroup | None, timeout_s: float):
        base = group if group is not None else dist.group.WORLD
        ranks = dist.get_process_group_ranks(base)
        # Every rank of the default group must take part in new_group, in the same order. Gloo's threads for it
        # let compute keep a CPU host's cores (ds_acco.comm.thread_policy).
        with threads_started_here_yield(dist.get_backend(base) == "gloo"):
            self.group = dist.new_group(ranks=ranks, timeout=timedelta(seconds=timeout_s))
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.wire = WireBytes()
        self.reduce_scatter_via_all_to_all = dist.get_backend(self.group) == "gloo" and self.world_size > 1
        self._a2a_scratch: dict[tuple, torch.Tensor] = {}
        self._int_buffers: dict[int, tuple] = {}
        self._float_buffer: Optional[tuple] = None
        self.pacer = LinkPacer()
        self.piece_bytes: Optional[int] = None
        """Bytes a piece may send from one rank, agreed by every rank (None: only ``MAX_PIECE_NUMEL`` bounds it)."""
        self._probe_due = True
        """No collective has probed the link yet (the same on every rank: it follows the collectives' sizes)."""

    def pacing_vote(self) -> int:
        """This rank's proposal for :attr:`piece_bytes` from its own measurements (0: no limit)."""
        return 0 if self.pacer.rate is None else self.pacer.piece_bytes(1 << 62)

    def adopt_pacing(self, votes: list[int]) -> None:
        """Set :attr:`piece_bytes` from every rank's :meth:`pacing_vote` (the same list on every rank)."""
        limits = [int(v) for v in votes if int(v) > 0]
        self.piece_bytes = min(limits) if limits else None

    def check_peers_agree(self, mine: object, what: str, named: Optional[dict] = None) -> None:
        """Fail at start-up, not with a hang, when ranks hold different ``mine`` (configs, layouts); with
        ``named`` (:meth:`AccoConfig.compared_fields`) the message names each ``acco`` field that differs."""
        from ds_acco.config.compare import rank_differences
        from ds_acco.errors import AccoConfigError

        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, (mine, named), group=self.group)
        if any(theirs != mine for theirs, _ in everyone):
            fields = rank_differences([n for _, n in everyone]) if named is not None else []
            values = [f"rank {r}: {v}" for r, (v, _) in enumerate(everyone)]
            detail = "; ".join(fields) + (f" (all compared: {'; '.join(values)})" if fields else "; ".join(values))
            raise AccoConfigError(f"{what} differ across ranks -> {detail}")

    def all_gather_ints(self, values: list[int], device: torch.device) -> np.ndarray:
        """All-gather a few int64 ``values`` of each rank (counts, flags, float bits): ``(world_size, len)``.
        On the CPU through buffers kept per length and read as numpy arrays, so a round's count all-gather is
        one operation (a new tensor and its reads were a dozen: issue 49)."""
        if device.type != "cpu":
            return self.all_gather_small(torch.tensor(values, dtype=torch.int64).to(device)).cpu().numpy()
        n = len(values)
        bufs = self._int_buffers.get(n)
        if bufs is None:
            local, out = np.zeros(n, dtype=np.int64), np.zeros((self.world_size, n), dtype=np.int64)
            bufs = self._int_buffers[n] = (local, out, torch.from_numpy(local), torch.from_numpy(out.reshape(-1)))
        local, out, local_t, out_t = bufs
        local[:] = values
        self.all_gather_small(local_t, out=out_t)
        return out.copy()

    def all_reduce_float(self, value: float, device: torch.device) -> float:
        """The sum over ranks of one float64 ``value`` of each rank (as :meth:`all_reduce_sum` of a one-element
        tensor; on the CPU through a buffer kept for it, one operation)."""
        if device.type != "cpu":
            return float(self.all_reduce_sum(torch.tensor([value], dtype=torch.float64, device=device)).item())
        if self._float_buffer is None:
            local = np.zeros(1, dtype=np.float64)
            self._float_buffer = (local, torch.from_numpy(local))
        local, t = self._float_buffer
        local[0] = value
        self.all_reduce_sum(t)
        return float(local[0])

    def all_gather_small(self, local: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """All-gather a tiny vector (counts, flags); returns ``(world_size, *local.shape)``, or ``out`` (a 1-D
        contiguous buffer of that many elements, filled in rank order) where given."""
        if out is None:
            out = torch.empty((self.world_size, *local.shape), dtype=local.dtype, device=local.device)
            flat = out.view(-1)
        else:
            flat = out
        _all_gather(flat, local if local.dim() == 1 and local.is_contiguous() else local.reshape(-1).contiguous(),
                    group=self.group)
        self.wire.add(_nbytes(out), self.world_size)
        return out

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.group)
        self.wire.add(_nbytes(t), self.world_size, factor=2)
        return t

    def reduce_scatter_sum(self, out: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        """Sum ``full`` over ranks and keep this rank's ``1/N`` slice in ``out``.

        On gloo through all-to-all plus a local sum in rank order (see the note above).
        """
        if not self.reduce_scatter_via_all_to_all:
            _reduce_scatter(out, full, group=self.group)
            self.wire.add(_nbytes(full), self.world_size)
            return out
        N, chunk = self.world_size, out.numel()
        if full.numel() != N * chunk:
            raise ValueError(f"reduce_scatter_sum: full has {full.numel()} elements, out {chunk} x {N} ranks")
        rows = full.view(N, chunk)

        def launch(start: int, n: int, slot: int) -> Callable[[], None]:
            work, recv = self._launch_exchange(rows, start, n, slot)

            def finish() -> None:
                work.wait()
                piece = out.view(-1)[start:start + n]
                if piece.dtype == recv.dtype:
                    torch.sum(recv, dim=0, out=piece)
                else:
                    piece.copy_(recv.sum(dim=0, dtype=torch.float32))
            return finish

        pieces = self._paced(chunk, full.element_size(), launch)
        self.wire.add(_nbytes(full), N, pieces=pieces)
        return out

    def _paced(self, per_rank: int, element_size: int, launch: Launch, cap_numel: Optional[int] = None) -> int:
        """Run ``launch(start, n, slot)`` (:data:`~ds_acco.comm.link_pacing.Launch`) over ``per_rank`` elements
        in pieces the pacer sizes (at most ``cap_numel`` each, by default ``MAX_PIECE_NUMEL``), two on the wire
        at once; returns how many."""
        sent_per_element = (self.world_size - 1) * element_size
        cap = max(1, cap_numel or MAX_PIECE_NUMEL) * sent_per_element
        small = max(1, MIN_PIECE_BYTES // sent_per_element)  # (not a rank's own floor: every rank must agree)
        if self._probe_due and self.piece_bytes is None and per_rank > LinkPacer.probe_numel(small) and \
                4 * small * sent_per_element <= cap:
            self._probe_due = False
            return self._probe(per_rank, small, sent_per_element, cap, launch)
        return self.pacer.run(per_rank, self._piece(per_rank, cap, sent_per_element), sent_per_element, launch)

    def _piece(self, per_rank: int, cap: int, sent_per_element: int) -> int:
        limit = cap if self.piece_bytes is None else min(cap, self.piece_bytes)
        return max(1, min(per_rank, limit // sent_per_element))

    def _probe(self, per_rank: int, small: int, sent_per_element: int, cap: int, launch: Launch) -> int:
        """The job's first large collective: its head times the link (:meth:`LinkPacer.probe`), one tiny
        all-gather agrees the piece size, and the rest goes in agreed pieces. Without it a job's first round ran
        unpaced, at about half a shaped link's rate (BENCHMARKS.md, "Auto looks after step 1, and a job's first
        round is paced"). On a fast link it costs a dozen small calls once. The head goes one piece at a time:
        the probe times each."""
        head = self.pacer.probe(small, sent_per_element, lambda start, n: complete(launch(start, n, 0)))
        votes = self.all_gather_small(torch.tensor([self.pacing_vote()], dtype=torch.int64))
        self.adopt_pacing(votes.view(-1).tolist())
        rest = per_rank - head
        return 1 + 2 * PROBE_PIECES + self.pacer.run(rest, self._piece(rest, cap, sent_per_element),
                                                     sent_per_element,
                                                     lambda start, n, slot: launch(head + start, n, slot))

    def probe_link(self) -> Optional[float]:
        """Probe the link before any round needs it (collective; gloo only): the bytes per second this rank
        sends in agreed pieces, or None where there is nothing to time (another backend, one rank, a link too
        fast to time, a job whose collectives already probed it).

        :meth:`_probe` on scratch, then a few pieces of the agreed size timed as a round's would be, so
        ``mode: "auto"`` can price a round before the first one runs (1.4 to 2.5 MiB from each rank; up to 7 on
        a link with latency, whose pieces are larger). The probe's own rate is not that figure: its 256 KiB pieces
        stall on a slow link's deep queue (at 10 Mbit/s it read half the rate the agreed pieces then moved at)."""
        if not (self.reduce_scatter_via_all_to_all and self._probe_due and self.piece_bytes is None):
            return None
        self._probe_due = False
        sent_per_element = self.world_size - 1  # one byte an element
        small = max(1, MIN_PIECE_BYTES // sent_per_element)
        largest = PRICED_PIECE_SMALLS * small
        numel = max(LinkPacer.probe_numel(small), 2 * PROBE_PIECES * largest)
        rows = torch.zeros(self.world_size, numel, dtype=torch.uint8)

        def launch(start: int, n: int, slot: int) -> Callable[[], object]:
            return self._launch_exchange(rows, start, n, slot)[0].wait

        self._probe(LinkPacer.probe_numel(small), small, sent_per_element, 4 * small * sent_per_element, launch)
        if self.piece_bytes is None:
            return None
        piece = max(1, min(largest, self.piece_bytes // sent_per_element))
        pieces = self.pacer.run(2 * PROBE_PIECES * piece, piece, sent_per_element, launch)
        self.wire.add(self.world_size * (LinkPacer.probe_numel(small) + 2 * PROBE_PIECES * piece), self.world_size,
                      pieces=1 + 2 * PROBE_PIECES + pieces)
        return self.pacer.last_rate

    def _launch_exchange(self, rows: torch.Tensor, start: int, n: int, slot: int) -> tuple:
        """Start the all-to-all of columns ``[start, start + n)`` of ``rows`` (one row per destination rank),
        through scratch slot ``slot``; returns its work and where the ``(N, n)`` received rows (one per source
        rank) land once the work is waited on, valid until that slot's next piece."""
        N = self.world_size
        whole = n == rows.shape[1]
        send = rows if whole else \
            self._scratch(f"send{slot}", N * n, rows).view(N, n).copy_(rows[:, start:start + n])
        recv = self._scratch(f"recv{slot}", N * n, rows)
        work = dist.all_to_all_single(recv, send.reshape(-1), group=self.group, async_op=True)
        return work, recv.view(N, n)

    def _scratch(self, role: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        """The first ``numel`` elements of one buffer per role (and slot) and dtype (a ragged last piece or a
        smaller group reuses it: one piece's worth of scratch per role, not one per size)."""
        key = (role, like.dtype, like.device)
        buf = self._a2a_scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._a2a_scratch[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel]

    def all_gather(self, full: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``shard`` into ``full`` (rank order); ``shard`` may be this rank's own slice of
        ``full`` (in place).

        On gloo in pieces of ``MAX_PIECE_NUMEL`` elements per rank: gloo's all-gather allocates a temporary as large as
        its output (measured: 1x a 100 MB tensor), which a round would otherwise hold next to the model's buffers.
        """
        N, S = self.world_size, shard.numel()
        if not self.reduce_scatter_via_all_to_all:
            _all_gather(full, shard, group=self.group)
            self.wire.add(_nbytes(full), self.world_size)
            return full

        def launch(start: int, n: int, slot: int) -> Callable[[], object]:
            if n == S:
                return _all_gather(full, shard, group=self.group, async_op=True).wait
            # a piece writes only its own columns of every row, after its send was read: the piece after it
            # (launched first) reads other columns of this rank's row
            recv = self._scratch(f"recv{slot}", N * n, full)
            work = _all_gather(recv, shard.reshape(-1)[start:start + n], group=self.group, async_op=True)

            def finish() -> None:
                work.wait()
                full.view(N, S)[:, start:start + n].copy_(recv.view(N, n))
            return finish

        pieces = self._paced(S, full.element_size(), launch)
        self.wire.add(_nbytes(full), self.world_size, pieces=pieces)
        return full

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
        """Send the ``r``-th of ``N`` equal slices of ``inp`` to rank ``r``; slice ``s`` of
        ``out`` receives rank ``s``'s. Each rank keeps one slice, so it sends and receives
        exactly ``M * (N - 1) / N`` bytes of an ``M``-byte ``inp`` (no ring model needed).

        In one gloo call unless the link is paced (the note above): the caller's buffers are whole
        already, so only pacing needs piece scratch."""
        N, chunk = self.world_size, inp.numel() // self.world_size
        if not self.reduce_scatter_via_all_to_all:
            dist.all_to_all_single(out, inp, group=self.group)
            self.wire.add(_nbytes(inp), N)
            return out

        def launch(start: int, n: int, slot: int) -> Callable[[], object]:
            if n == chunk:  # straight into the caller's buffer: no scratch
                return dist.all_to_all_single(out, inp, group=self.group, async_op=True).wait
            work, recv = self._launch_exchange(inp.view(N, chunk), start, n, slot)

            def finish() -> None:
                work.wait()
                out.view(N, chunk)[:, start:start + n].copy_(recv)
            return finish

        pieces = self._paced(chunk, inp.element_size(), launch, cap_numel=chunk)  # no scratch unless paced
        self.wire.add(_nbytes(inp), N, pieces=pieces)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def destroy(self) -> None:
        try:
            dist.destroy_process_group(self.group)
        except (RuntimeError, ValueError):
            pass
