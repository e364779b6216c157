"""What one round computes, on the communication thread: counts, reduce-scatter, shard step, all-gather.

The training thread decides *when* a round runs (:mod:`ds_acco.rounds.engine`); this module is
*what* it does once it runs, in the order of docs/algorithms.md's "Rounds": an all-gather of
every rank's micro-batch count (with its non-finite flag and its pacing vote), the
reduce-scatter of the accumulator it was handed into this rank's fp32 shard, the estimate's
kept shard (acco: the estimate keeps its reduced shard, the commit adds it back), the mean,
clipping by the global norm, the optimizer's lookahead or step, and the all-gather of the new
parameters into the landing buffer.

[Note: how acco's estimate/commit is computed with two gradient buffers]
docs/algorithms.md keeps ``A_t`` in the local accumulator so ``B_t`` adds on top of it
and the commit reduce-scatters ``A_t + B_t``. Reduce-scatter is linear, so this
round reduce-scatters ``A_t`` in the estimate round, keeps this rank's summed
shard of it (``O(params / N)`` fp32), and lets the commit reduce-scatter only
``B_t`` and add the kept shard. The update is the same (up to fp32 summation
order), and the commit moves the same bytes. The accumulator a round has
reduce-scattered is where its all-gather lands (no staging buffer; see the note
in ds_acco/rounds/landing.py), and it comes back to the training thread zeroed at the swap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ds_acco.comm.collectives import RoundCollectives
from ds_acco.comm.comm_thread import RoundHandle
from ds_acco.comm.stop_signal import STOP
from ds_acco.config import AccoConfig
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.numerics.finite import all_finite
from ds_acco.numerics.views import ViewCache
from ds_acco.optim.lr_schedule import LrScheduleClock
from ds_acco.optim.shard_optimizer import ShardOptimizer

from .group_buffers import GroupBuffers
from .landing import Landing

ESTIMATE, COMMIT = "estimate", "commit"
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


@dataclass
class KeptEstimate:
    """What an estimate round leaves for its commit beyond the kept shards: how many micro-batches
    they sum, and whether any of them was non-finite."""

    count: int = 0
    nonfinite: bool = False


class RoundWork:
    """The computation of a round, for every group (see the module docstring): ``buffers`` are the ``groups``'
    round buffers (same order), ``clip`` the global-norm clipping (0: off), ``on_stage`` called as a round enters
    each stage (tracing, fault-injection tests)."""

    def __init__(self, groups: Sequence[ShardedGroup], buffers: Sequence[GroupBuffers], landing: Landing,
                 coll: RoundCollectives, shard_optimizer: ShardOptimizer, lr_clock: LrScheduleClock,
                 config: AccoConfig, clip: float, on_stage: Optional[Callable[[int, str], None]] = None):
        self.groups, self.buffers, self.landing = list(groups), list(buffers), landing
        self.coll, self.shard_optimizer, self.lr_clock = coll, shard_optimizer, lr_clock
        self.config, self.clip, self._on_stage = config, clip, on_stage
        self.kept = KeptEstimate()
        self.rank, self.device = coll.rank, groups[0].flat.device
        self.measures_noise = config.mode == "auto" and config.policy != "fixed"
        """Whether rounds measure the gradient noise scale (auto weighs the adaptive policy's batches with it)."""
        self._own_slice = [ViewCache(lambda t, g=g: g.layout.shard(t, self.rank), size=4) for g in self.groups]
        """This rank's slice of a landing buffer, per group, cut once per buffer."""

    def _lookahead_writes(self) -> list[bool]:
        """Per group: whether the lookahead writes every element of its publish buffer (a master as long as its
        shard, stepped by the plain :class:`ShardOptimizer`), so the masters need not be copied there first."""
        opt = self.shard_optimizer
        plain = type(opt) is ShardOptimizer and len(opt.masters) == len(self.groups)
        return [plain and g.packing is None and opt.masters[i] is g.master and g.master.numel() == g.layout.shard_numel
                for i, g in enumerate(self.groups)]

    def sends_delta(self, kind: str) -> bool:
        """Whether a round of this kind all-gathers a low-bit delta (acco.all_gather_quantization, and
        acco.estimate_quantization for estimates)."""
        q = self.config.all_gather_quantization
        return q == "int8" or (kind == ESTIMATE and (q == "int8_estimate" or self.buffers[0].est_ag is not None))

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
        start = handle.clock.now()
        coll, bufs = self.coll, self.buffers
        sent0, recv0 = coll.wire.sent, coll.wire.received
        nonfinite = self.config.check_finite and any(not all_finite(b) for b in grads)
        # the noise scale needs a mean over exactly these accumulators: not acco's commit (it adds the estimate's)
        noise = self.measures_noise and (kind == ESTIMATE or mode == "sync")
        self._enter_stage(handle, "count all-gather")
        flags = int(nonfinite) | STOPPING * int(STOP.requested)  # two flags in one element: the gather's bytes stay
        local = [count, flags, coll.pacing_vote(), *figures]
        if noise:  # a float64 carried bit for bit in an int64 element
            local.append(int(np.float64(_squared_norm(grads) / (scale * scale)).view(np.int64)))
        per_rank = coll.all_gather_ints(local, self.device)  # numpy: reading it issues no operation
        coll.adopt_pacing(per_rank[:, 2].tolist())  # piece sizes on gloo (ds_acco.comm.link_pacing)
        counts = per_rank[:, 0].tolist()
        total = sum(counts)
        nonfinite = bool((per_rank[:, 1] & 1).any())

        self._enter_stage(handle, "reduce-scatter")
        for i, (g, buf, b) in enumerate(zip(self.groups, grads, bufs)):
            send = g.comm_input(buf, b.comm_scratch)
            rs_out = b.rs_out
            if b.est_rs is not None and kind == COMMIT and mode == "acco":
                send.add_(b.est_residual)
                b.est_residual.zero_()
            if b.est_rs is not None and kind == ESTIMATE:  # int4; what it loses goes on with the commit
                rs_out = b.shard32
                b.est_rs(coll, rs_out, send, residual_out=b.est_residual)
            elif b.int8_rs is not None:
                b.int8_rs(coll, rs_out, send)
            elif b.cast_rs is not None:
                b.cast_rs(coll, rs_out, send)
            else:
                coll.reduce_scatter_sum(rs_out, send)
            if self.landing.round_zeroes(i):
                buf.zero_()  # "local grads reset"; otherwise the all-gather lands here and the swap zeroes
            if rs_out is not b.shard32:
                b.shard32.copy_(rs_out)
        shards = [b.shard32 for b in bufs]
        if scale != 1.0:  # unscaled sums, so an estimate and a commit made under different loss scales add up
            _each("mul_", shards, 1.0 / scale)
        if kind == ESTIMATE:
            _each("copy_", [b.kept for b in bufs], shards)
            self.kept = KeptEstimate(total, nonfinite)
        elif mode == "acco":
            _each("add_", shards, [b.kept for b in bufs])
            total += self.kept.count
            nonfinite = nonfinite or self.kept.nonfinite

        self._enter_stage(handle, "shard step")
        delta = self.sends_delta(kind)
        landing = self.landing.targets(grads)
        # this rank's new shard goes straight into its slice of the all-gather destination
        publish = [b.publish32 for b in bufs] if delta and bufs[0].publish32 is not None else [
            b.publish_packed if b.publish_packed is not None else self._own_slice[i](full)
            for i, (full, b) in enumerate(zip(landing, bufs))]
        skipped = (self.config.check_finite and nonfinite) or total == 0
        grad_norm = float("nan")
        if skipped:
            if kind == COMMIT:
                self.shard_optimizer.skip()
            self.publish_masters(publish)
        else:
            _each("div_", shards, total)
            if self.clip > 0 or noise:
                grad_norm = self._clip_global_norm(shards)
            scratch = [b.step_scratch for b in bufs]
            if kind == ESTIMATE:
                # padding beyond a master's own elements comes from here; the lookahead writes the rest
                whole = self._lookahead_writes()
                self.publish_masters([p for p, w in zip(publish, whole) if not w],
                                     [g for g, w in zip(self.groups, whole) if not w])
                self.shard_optimizer.lookahead(shards, publish, scratch=scratch)
            else:
                self.shard_optimizer.commit(shards, scheduler_steps=self.lr_clock.advances(total), scratch=scratch)
                self.publish_masters(publish)

        self._enter_stage(handle, "all-gather")
        for i, (full, part) in enumerate(zip(landing, publish)):
            if delta:
                ag = bufs[i].est_ag if kind == ESTIMATE and bufs[i].est_ag is not None else bufs[i].delta_ag
                ag(coll, full, bases[i], part)
            else:
                self.all_gather_compute(i, full, part)
        self._enter_stage(handle, "done")
        return RoundOutcome(
            counts=[int(c) for c in counts],
            round_s=handle.clock.now() - start,
            bytes_sent=coll.wire.sent - sent0,
            bytes_received=coll.wire.received - recv0,
            grad_norm=grad_norm,
            skipped=skipped,
            lr=self.shard_optimizer.lr,
            stop=bool((per_rank[:, 1] & STOPPING).any()),
            figures=per_rank[:, 3:3 + len(figures)].tolist() if figures else None,
            noise=(per_rank[:, -1].copy().view(np.float64).tolist(), grad_norm ** 2) if noise else None,
        )

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
        g = self.groups[i]
        if g.packing is None:
            self.coll.all_gather(full, part)
        else:
            scratch = self.buffers[i].gather_scratch
            self.coll.all_gather(scratch, part)
            g.packing.unpack(scratch, full)

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
