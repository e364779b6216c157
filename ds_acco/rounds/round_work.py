"""What one round computes, on the communication thread, in the order of docs/algorithms.md's "Rounds": counts,
reduce-scatter, kept estimate, mean, clip, lookahead or step, all-gather (the schedules say *when*).

[Note: how acco's estimate/commit is computed with two gradient buffers]
docs/algorithms.md keeps ``A_t`` in the local accumulator so ``B_t`` adds on top of it and the commit reduce-scatters
``A_t + B_t``. Reduce-scatter is linear, so this round reduce-scatters ``A_t`` in the estimate round, keeps this rank's
summed shard of it (``O(params / N)`` fp32), and lets the commit reduce-scatter only ``B_t`` and add the kept shard. The
update is the same (up to fp32 summation order), and the commit moves the same bytes. The accumulator a round has
reduce-scattered is where its all-gather lands (no staging buffer; see the note in ds_acco/rounds/landing.py), and it
comes back to the training thread zeroed at the swap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from ds_acco.comm.collectives import RoundCollectives
from ds_acco.comm.comm_thread import RoundHandle
from ds_acco.comm.stop_signal import STOP
from ds_acco.config import AccoConfig
from ds_acco.config.names import Kind, Mode, Policy
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.numerics.finite import all_finite
from ds_acco.numerics.views import ViewCache
from ds_acco.optim.lr_schedule import LrScheduleClock
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.records import DRAIN_STAGE

from .group_buffers import KeptEstimate, RoundBuffers
from .landing import Landing

STOPPING = 2
"""The bit of the count all-gather's flag element that says "this rank was sent SIGTERM"."""


@dataclass
class RoundOutcome:
    """What a finished round hands the swap (and a checkpoint keeps, for a round not yet swapped in)."""

    counts: list[int]
    round_s: float
    bytes_sent: int
    bytes_received: int
    grad_norm: float
    skipped: bool
    lr: float
    stop: bool = False
    """Some rank was sent SIGTERM before this round (:mod:`ds_acco.comm.stop_signal`): every rank stops here."""
    figures: Optional[list] = None
    """``mode: "auto"``: every rank's step figures, one row per rank (:mod:`ds_acco.rounds.auto.mode`)."""
    noise: Optional[tuple] = None
    """``policy: "auto"``/``"adaptive"`` under ``mode: "auto"``: every rank's squared norm of its accumulated sum,
    and the squared norm of the reduced mean (:mod:`ds_acco.rounds.auto.noise_scale`); None where not measured."""


class CountRow(NamedTuple):
    """What a rank sends in a round's first collective, an int64 each: the gather's bytes stay a few dozen."""

    count: int  # micro-batches in the accumulator the round reduces
    flags: int  # bit 0: a non-finite gradient; bit STOPPING: this rank was sent SIGTERM
    vote: int  # its pacing vote (ds_acco.comm.link_pacing)
    figures: Sequence[int] = ()  # mode auto: its step figures (ds_acco.rounds.auto.choice.FIGURES integers)
    noise: Sequence[int] = ()  # rounds that measure the noise scale: its sum's squared norm, a float64's bits

    def values(self) -> list[int]:
        return [self.count, self.flags, self.vote, *self.figures, *self.noise]


@dataclass
class CountRows:
    """Every rank's :class:`CountRow`, by field (read from a numpy array: reading it issues no operation)."""

    counts: list[int]
    nonfinite: bool
    stop: bool
    votes: list[int]
    figures: Optional[list]
    noise: Optional[list[float]]

    @classmethod
    def read(cls, rows: np.ndarray, figures: int, noise: bool) -> "CountRows":
        return cls(rows[:, 0].tolist(), bool((rows[:, 1] & 1).any()), bool((rows[:, 1] & STOPPING).any()),
                   rows[:, 2].tolist(), rows[:, 3:3 + figures].tolist() if figures else None,
                   rows[:, -1].copy().view(np.float64).tolist() if noise else None)


class RoundWork:
    """The computation of a round, for every group (see the module docstring): ``buffers`` are the ``groups``'
    round buffers (same order), ``clip`` the global-norm clipping (0: off), ``on_stage`` called as a round enters
    each stage (tracing, fault-injection tests)."""

    def __init__(self, groups: Sequence[ShardedGroup], buffers: RoundBuffers, landing: Landing,
                 coll: RoundCollectives, shard_optimizer: ShardOptimizer, lr_clock: LrScheduleClock,
                 config: AccoConfig, clip: float, on_stage: Optional[Callable[[int, str], None]] = None):
        self.groups, self.buffers, self.landing = list(groups), buffers, landing
        self.coll, self.shard_optimizer, self.lr_clock = coll, shard_optimizer, lr_clock
        self.config, self.clip, self._on_stage = config, clip, on_stage
        self.rank, self.device = coll.rank, groups[0].flat.device
        # the gradient noise scale weighs the adaptive policy's batches for auto
        self.measures_noise = config.mode == Mode.AUTO and config.policy != Policy.FIXED
        self._own_slice = [ViewCache(lambda t, g=g: g.layout.shard(t, self.rank), size=4) for g in self.groups]

    def _lookahead_writes(self) -> list[bool]:
        """Per group: whether the lookahead writes every element of its publish buffer (a master as long as its
        shard, stepped by the plain :class:`ShardOptimizer`), so the masters need not be copied there first."""
        opt = self.shard_optimizer
        plain = type(opt) is ShardOptimizer and len(opt.masters) == len(self.groups)
        return [plain and g.packing is None and opt.masters[i] is g.master and g.master.numel() == g.layout.shard_numel
                for i, g in enumerate(self.groups)]

    def run(self, handle: RoundHandle, kind: str, mode: str, grads: list[torch.Tensor], bases: list[torch.Tensor],
            count: int, scale: float, figures: Sequence[int] = ()) -> RoundOutcome:
        """One round over the accumulators ``grads``; ``bases`` are the parameters every rank held at launch;
        ``figures`` (``mode: "auto"``) ride along in the count all-gather. Marked for a profile
        (benchmarks/report/round_trace.py reads the mark: a round is more than a burst of host work)."""
        with torch.no_grad():  # nothing here is differentiated: no detach needed anywhere
            if not getattr(torch.autograd.profiler, "_is_profiler_enabled", True):  # a mark: 14 us, this: 0.1 us
                return self._run(handle, kind, mode, grads, bases, count, scale, figures)
            with torch.profiler.record_function(f"ds_acco round {mode} {kind}"):
                return self._run(handle, kind, mode, grads, bases, count, scale, figures)

    def _run(self, handle: RoundHandle, kind: str, mode: str, grads: list[torch.Tensor], bases: list[torch.Tensor],
             count: int, scale: float, figures: Sequence[int]) -> RoundOutcome:
        start, coll = handle.clock.now(), self.coll
        sent0, recv0 = coll.wire.sent, coll.wire.received
        # the noise scale needs a mean over exactly these accumulators: not acco's commit (it adds the estimate's)
        noise = self.measures_noise and (kind == Kind.ESTIMATE or mode == Mode.SYNC)
        rows = self._counts(handle, grads, count, scale, figures, noise)
        total, nonfinite = sum(rows.counts), rows.nonfinite
        self._enter_stage(handle, "reduce-scatter")
        shards = self._reduce_scatter(kind, mode, grads, scale)
        if kind == Kind.ESTIMATE:
            self.buffers.estimate = KeptEstimate(total, nonfinite)
        elif mode == Mode.ACCO:
            total += self.buffers.estimate.count
            nonfinite = nonfinite or self.buffers.estimate.nonfinite
        self._enter_stage(handle, "shard step")
        plans = [b.plans[kind] for b in self.buffers]
        landing = self.landing.targets(grads)
        # this rank's new shard goes straight into its slice of the all-gather destination
        publish = [b.publish32 for b in self.buffers] if plans[0].delta and self.buffers[0].publish32 is not None \
            else [b.publish_packed if b.publish_packed is not None else self._own_slice[i](full)
                  for i, (full, b) in enumerate(zip(landing, self.buffers))]
        skipped = (self.config.check_finite and nonfinite) or total == 0
        grad_norm = self._step(kind, shards, publish, total, noise) if not skipped else float("nan")
        if skipped:
            if kind == Kind.COMMIT:
                self.shard_optimizer.skip()
            self.publish_masters(publish)
        self._enter_stage(handle, "all-gather")
        for plan, full, base, part in zip(plans, landing, bases, publish):
            plan.all_gather(coll, full, base, part)
        self._enter_stage(handle, "done")
        return RoundOutcome(
            counts=[int(c) for c in rows.counts], round_s=handle.clock.now() - start,
            bytes_sent=coll.wire.sent - sent0, bytes_received=coll.wire.received - recv0, grad_norm=grad_norm,
            skipped=skipped, lr=self.shard_optimizer.lr, stop=rows.stop, figures=rows.figures,
            noise=(rows.noise, grad_norm ** 2) if noise else None)

    def _counts(self, handle: RoundHandle, grads: list[torch.Tensor], count: int, scale: float,
                figures: Sequence[int], noise: bool) -> CountRows:
        """Every rank's :class:`CountRow`, in one tiny all-gather; adopts the agreed pacing."""
        if self.device.type == "cuda":  # the round's first host read waits for the device: said as its own stage
            self._enter_stage(handle, DRAIN_STAGE)
            torch.cuda.current_stream(self.device).synchronize()  # the comm stream, behind the launch's event
        nonfinite = self.config.check_finite and any(not all_finite(b) for b in grads)
        self._enter_stage(handle, "count all-gather")
        row = CountRow(count, int(nonfinite) | STOPPING * int(STOP.requested), self.coll.pacing_vote(), figures,
                       [int(np.float64(_squared_norm(grads) / (scale * scale)).view(np.int64))] if noise else ())
        rows = CountRows.read(self.coll.all_gather_ints(row.values(), self.device), len(figures), noise)
        self.coll.adopt_pacing(rows.votes)  # piece sizes on gloo (ds_acco.comm.link_pacing)
        return rows

    def _reduce_scatter(self, kind: str, mode: str, grads: list[torch.Tensor], scale: float) -> list[torch.Tensor]:
        """Every group's accumulator summed into this rank's fp32 shard (unscaled; acco's commit adds the kept
        estimate's, an estimate keeps its own)."""
        acco = kind == Kind.COMMIT and mode == Mode.ACCO
        for i, (g, buf, b) in enumerate(zip(self.groups, grads, self.buffers)):
            b.plans[kind].reduce_scatter(self.coll, g.comm_input(buf, b.comm_scratch), acco)
            if self.landing.round_zeroes(i):
                buf.zero_()  # "local grads reset"; otherwise the all-gather lands here and the swap zeroes
        shards = [b.shard32 for b in self.buffers]
        if scale != 1.0:  # unscaled sums, so an estimate and a commit made under different loss scales add up
            _each("mul_", shards, 1.0 / scale)
        if kind == Kind.ESTIMATE:
            _each("copy_", [b.kept for b in self.buffers], shards)
        elif acco:
            _each("add_", shards, [b.kept for b in self.buffers])
        return shards

    def _step(self, kind: str, shards: list[torch.Tensor], publish: list[torch.Tensor], total: int,
              noise: bool) -> float:
        """The mean, the clip, and the optimizer's lookahead (estimate) or step (commit) into ``publish``; returns
        the global norm (NaN where neither clipping nor the noise scale needs it)."""
        _each("div_", shards, total)
        grad_norm = self._clip_global_norm(shards) if self.clip > 0 or noise else float("nan")
        scratch = [b.step_scratch for b in self.buffers]
        if kind == Kind.ESTIMATE:
            # padding beyond a master's own elements comes from here; the lookahead writes the rest
            whole = self._lookahead_writes()
            self.publish_masters([p for p, w in zip(publish, whole) if not w],
                                 [g for g, w in zip(self.groups, whole) if not w])
            self.shard_optimizer.lookahead(shards, publish, scratch=scratch)
        else:
            self.shard_optimizer.commit(shards, scheduler_steps=self.lr_clock.advances(total), scratch=scratch)
            self.publish_masters(publish)
        return grad_norm

    def _enter_stage(self, handle: RoundHandle, stage: str) -> None:
        handle.enter_stage(stage)
        if self._on_stage is not None:
            self._on_stage(handle.index, stage)

    def publish_masters(self, publish: list[torch.Tensor], groups: Optional[list[ShardedGroup]] = None) -> None:
        for part, g in zip(publish, self.groups if groups is None else groups):
            g.read_master(part)

    def all_gather_masters(self, i: int, full: torch.Tensor) -> None:
        """All-gather every rank's master shard of group ``i`` into ``full``, in its dtype (collective)."""
        g = self.groups[i]
        part = torch.empty(g.layout.shard_numel, dtype=full.dtype, device=full.device)
        g.read_master(part)
        self.all_gather_compute(i, full, part)

    def all_gather_compute(self, i: int, full: torch.Tensor, part: torch.Tensor) -> None:
        """All-gather every rank's shard ``part`` of group ``i`` into the compute buffer ``full`` (collective)."""
        self.buffers[i].gather_compute(self.coll, full, part)

    def _clip_global_norm(self, shards: list[torch.Tensor]) -> float:
        """The norm over every rank's mean gradient shards; clips them in place by it when clipping is on."""
        sq = _squared_norm(shards)
        norm = math.sqrt(self.coll.all_reduce_float(sq, self.device))
        coef = self.clip / (norm + 1e-6)
        if self.clip > 0 and coef < 1.0:
            _each("mul_", shards, coef)
        return norm


def _each(op: str, tensors: list[torch.Tensor], other) -> None:
    """The in-place ``op`` on every tensor, as one ``torch._foreach_*`` operation when there are several (the same
    per-tensor arithmetic on a CPU); ``other`` is a scalar or one tensor per tensor."""
    if len(tensors) == 1:
        getattr(tensors[0], op)(other[0] if isinstance(other, list) else other)
    else:
        getattr(torch, f"_foreach_{op}")(tensors, other)


def _squared_norm(tensors: Sequence[torch.Tensor]) -> float:
    """Sum of squared norms in fp64, in the tensors' order: two operations a tensor."""
    sq = 0.0
    for t in tensors:
        # vector_norm reduces without a full-size temporary (a .double() copy cost 8 B/element); a bf16/fp16
        # accumulator's norm comes back in fp32, not rounded to its own 8 or 11 bits
        wide = t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32
        norm = torch.linalg.vector_norm(t, dtype=wide).item()
        sq += norm * norm  # in fp64, as the tensor's ** 2 was
    return sq
