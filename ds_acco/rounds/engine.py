"""The round engine: when rounds launch, what they compute, and the swap.

Framework-agnostic: it sees :class:`~ds_acco.layout.flat_buffer.ShardedGroup` buffers,
a :class:`~ds_acco.optim.shard_optimizer.ShardOptimizer` and a process group. The
front ends (DeepSpeed, plain PyTorch) build those and call
:meth:`RoundEngine.after_micro_batch` after every backward.

[Note: how acco's estimate/commit is computed with two gradient buffers]
docs/algorithms.md keeps ``A_t`` in the local accumulator so ``B_t`` adds on top of it
and the commit reduce-scatters ``A_t + B_t``. Reduce-scatter is linear, so this
engine reduce-scatters ``A_t`` in the estimate round, keeps this rank's summed
shard of it (``O(params / N)`` fp32), and lets the commit reduce-scatter only
``B_t`` and add the kept shard. The update is the same (up to fp32 summation
order), and the commit moves the same bytes. The accumulator a round has
reduce-scattered is where its all-gather lands (no staging buffer; see the note
in ds_acco/rounds/landing.py), and it comes back to the training thread zeroed at the swap.
"""

from __future__ import annotations

import atexit
import logging
import math
import time
from typing import Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ds_acco.comm.collectives import RoundCollectives
from ds_acco.comm.chunked_cast import ChunkedCastReduceScatter
from ds_acco.comm.comm_thread import AccoRoundError, CommThread, RoundHandle, drain_at_exit, record_ready
from ds_acco.config.schema import AccoConfig, AccoConfigError, parse_acco_config
from ds_acco.numerics.dtypes import resolve_dtype
from ds_acco.layout.flat_buffer import ShardedGroup
from ds_acco.layout.grad_buffers import GradBuffers
from ds_acco.comm.int8_collectives import Int8DeltaAllGather, Int8ReduceScatter
from .landing import Landing
from ds_acco.optim.lr_schedule import LrScheduleClock
from .alignment import RoundAlignment
from .state import COMMIT, ESTIMATE, RoundStateMixin, _InFlight, _RoundOutcome
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.records import RoundRecord, Telemetry, ensure_log_output

logger = logging.getLogger("ds_acco")

def _all_finite(t: torch.Tensor) -> bool:
    """No inf/NaN in ``t``, without ``isfinite``'s model-sized bool temporary (min and max carry them)."""
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


class RoundEngine(RoundStateMixin):
    """Runs gradient rounds in the background of a training loop.

    Args:
        groups: the sharded parameter groups (compute buffers and master shards).
        shard_optimizer: steps the master shards.
        config: the ``"acco"`` block (dict or :class:`AccoConfig`).
        gradient_accumulation_steps: ``G``, micro-batches per worker per optimizer step.
        clip_grad_norm: clip ``mean(X)`` to this global L2 norm (None or 0: off).
        process_group: the data-parallel group (default: WORLD). The engine runs its
            collectives on a private copy created with ``config.timeout_s``.
        grad_scale: the factor backward multiplied gradients by (a float or a
            callable read at each round), e.g. ``1/G`` when the framework divides
            the loss by ``G``, or the fp16 loss scale; the mean divides it out. It is
            read when an accumulator becomes active, so a loss scale that changes at a
            swap applies to exactly the micro-batches computed under it.
        on_swap: called on the training thread after every swap with the round's
            record (front ends advance their step counters and loss scalers here).
        on_stage: called on the communication thread as a round enters each stage
            (round index, stage name); for tracing and fault-injection tests.
    """

    def __init__(
        self,
        groups: Sequence[ShardedGroup],
        shard_optimizer: ShardOptimizer,
        *,
        config: Union[AccoConfig, dict],
        gradient_accumulation_steps: int,
        clip_grad_norm: Optional[float] = None,
        process_group: Optional[dist.ProcessGroup] = None,
        grad_scale: Union[float, Callable[[], float]] = 1.0,
        on_swap: Optional[Callable[[RoundRecord], None]] = None,
        on_stage: Optional[Callable[[int, str], None]] = None,
    ):
        self.config = parse_acco_config(config)
        self.config.check_accumulation(gradient_accumulation_steps)
        if clip_grad_norm is not None and clip_grad_norm < 0:
            raise AccoConfigError(f"gradient_clipping: got {clip_grad_norm}; must be >= 0 (0 disables it)")
        self.groups = list(groups)
        self.shard_optimizer = shard_optimizer
        self.G = gradient_accumulation_steps
        self.clip = float(clip_grad_norm or 0.0)
        self._grad_scale = grad_scale
        self._on_swap = on_swap
        self._on_stage = on_stage
        self.device = self.groups[0].flat.device
        self.coll = RoundCollectives(process_group, self.config.timeout_s)
        self.rank, self.world_size = self.coll.rank, self.coll.world_size
        self._check_peers_agree()
        self._align = RoundAlignment(self.coll, self.config.policy == "adaptive", self.config.timeout_s, self.device)

        accum = resolve_dtype(self.config.grad_accum_dtype, self.groups[0].flat.dtype, "acco.grad_accum_dtype")
        self.grads = GradBuffers(self.groups, accum)
        comm = resolve_dtype(self.config.comm_dtype, accum, "acco.comm_dtype")
        self._comm_dtype = comm
        self._landing = Landing(self.groups, self.grads)  # no staging buffer: see the note in ds_acco/rounds/landing.py
        self._shard32 = [torch.zeros(g.layout.shard_numel, dtype=torch.float32, device=self.device) for g in self.groups]
        int8 = self.config.comm_quantization == "int8"  # the int8 exchange reads any dtype, sums in fp32
        self._rs_out = [  # the chunked cast (comm != accum, unpacked groups) sums into fp32 itself
            s if comm == torch.float32 or int8 or (comm != accum and g.packing is None)
            else torch.empty(s.numel(), dtype=comm, device=self.device)
            for g, s in zip(self.groups, self._shard32)
        ]
        # Packed (rank-major, FSDP2) groups copy their gradients into a rank-major send buffer,
        # cast on the way when the comm dtype differs; the others reduce-scatter the accumulator
        # itself, or cast it in chunks (never a model-sized cast buffer).
        self._comm_scratch = [
            g.layout.new_buffer(g.flat, accum if int8 else comm) if g.packing is not None else None
            for g in self.groups
        ]
        # a packed group's rank-major all-gather output (its send buffer when the dtypes agree: it is free by then)
        self._gather_scratch = [
            None if g.packing is None else s if s.dtype == g.flat.dtype else g.layout.new_buffer(g.flat)
            for g, s in zip(self.groups, self._comm_scratch)
        ]
        self._cast_rs = [
            None if comm == accum or int8 or g.packing is not None else ChunkedCastReduceScatter(
                g.layout.padded_numel, self.world_size, comm, self.device)
            for g in self.groups
        ]
        # a packed group's slice of the landing buffer is in another layout than its shard: it publishes
        # into a shard-sized buffer of its own
        self._publish_packed = [
            None if g.packing is None else torch.empty(g.layout.shard_numel, dtype=g.flat.dtype, device=self.device)
            for g in self.groups
        ]
        self._int8_rs = [
            Int8ReduceScatter(g.layout.padded_numel, self.world_size, block_size=self.config.quantization_block_size,
                              error_feedback=self.config.error_feedback, device=self.device)
            for g in self.groups
        ] if int8 else None
        self._kept = [torch.zeros_like(s) for s in self._shard32] if self.config.mode == "acco" else []
        if self.config.all_gather_quantization != "none" and any(g.packing is not None for g in self.groups):
            raise AccoConfigError(
                f"acco.all_gather_quantization: got {self.config.all_gather_quantization!r} for rank-major packed "
                "groups (FSDP2 layouts), whose int8 delta would be taken in another layout than the parameters; "
                "allowed: 'none'"
            )
        # Low-bit parameter all-gather: rounds that send an int8 delta publish fp32 values
        # (the delta is taken from the fp32 result, not from its compute-dtype rounding).
        self._delta_ag = [
            Int8DeltaAllGather(g.layout.shard_numel, self.world_size, block_size=self.config.quantization_block_size,
                               device=self.device)
            for g in self.groups
        ] if self.config.all_gather_quantization != "none" else None
        self._publish32 = None if self._delta_ag is None or all(
            g.flat.dtype == torch.float32 for g in self.groups) else [torch.empty_like(s) for s in self._shard32]
        self._kept_count = 0
        self._kept_nonfinite = False

        tcfg = self.config.telemetry
        path = f"{tcfg.jsonl_path}.rank{self.rank}" if tcfg.jsonl_path else None
        self.telemetry = Telemetry(keep_last=tcfg.keep_last, jsonl_path=path)
        if tcfg.log_every and self.rank == 0:
            ensure_log_output()
        self._comm = CommThread(self.device)

        self.commits = 0
        self.micro_batches = 0
        self.lr_clock = LrScheduleClock(self.G * self.world_size, by_tokens=self.config.policy == "adaptive")
        self._compute_committed = True  # False while the compute parameters hold an estimate
        self._n = 0
        self._round_index = 0
        self._inflight: Optional[_InFlight] = None
        self._next_kind = ESTIMATE if self.config.mode == "acco" else COMMIT
        self._last_swap_t = time.perf_counter()
        self._active_scale = self._current_scale()
        self._closed = False
        # A script may end with a round in flight on every rank (it always does in acco);
        # finishing it before interpreter shutdown keeps the collective from being torn
        # down under the communication thread.
        self._atexit = drain_at_exit(self)

    # ------------------------------------------------------------------ set-up
    def _check_peers_agree(self) -> None:
        """Fail at start-up, not with a hang, when ranks were given different configs or models."""
        self.coll.check_peers_agree(
            (self.config.fingerprint(), self.G, self.clip, [g.layout.padded_numel for g in self.groups]),
            "acco config, gradient_accumulation_steps, gradient_clipping or model layout "
            "(fingerprint, G, clip, buffer sizes)",
        )

    # ------------------------------------------------------------ training side
    @property
    def overlapping(self) -> bool:
        """True once warmup is over and the mode overlaps rounds with compute."""
        return self.config.mode != "sync" and self.commits >= self.config.warmup_steps

    @property
    def quota(self) -> int:
        return self.config.quota(self.G) if self.overlapping else self.G

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    def after_micro_batch(self) -> bool:
        """Account for one finished backward; launch, wait and swap as the policy says.

        Returns:
            True when the compute parameters changed (a swap happened).

        Raises:
            AccoRoundError: a round failed or timed out (re-raised from the comm thread).
        """
        self._ensure_open()
        if self._inflight is not None and self._inflight.handle.failed():
            self._complete()  # raises the round's error here
        self.grads.repair()
        self._n += 1
        self.micro_batches += 1
        if not self.overlapping:
            if self._n < self.G:
                return False
            self._launch(COMMIT, "sync")
            self._complete()
            if self.overlapping:
                self._next_kind = ESTIMATE if self.config.mode == "acco" else COMMIT
            return True
        if self._inflight is None:  # bootstrap after start or warmup
            if self._n >= self.quota:
                self._launch(self._next_kind, self.config.mode)
            return False
        if not self._round_ready():
            return False
        self._complete()
        self._launch(self._next_kind, self.config.mode)
        return True

    def _round_ready(self) -> bool:
        if self.config.policy == "fixed":
            return self._n >= self.quota
        cap = self.config.max_micro_batches_per_round
        if self._inflight.handle.done() or (cap is not None and self._n >= cap):
            return True
        if self._inflight.handle.elapsed() > self.config.timeout_s:
            return True  # _complete() raises the timeout with the round's stage
        return False

    def _current_scale(self) -> float:
        return float(self._grad_scale() if callable(self._grad_scale) else self._grad_scale)

    def _sends_delta(self, kind: str) -> bool:
        """Whether a round of this kind all-gathers an int8 delta (acco.all_gather_quantization)."""
        q = self.config.all_gather_quantization
        return q == "int8" or (q == "int8_estimate" and kind == ESTIMATE)

    def _launch(self, kind: str, mode: str) -> None:
        grads = self.grads.take()
        # the parameters every rank holds now: the base of an int8-delta all-gather (read-only;
        # they stay bound until this round's swap)
        bases = [g.flat for g in self.groups]
        scale, self._active_scale = self._active_scale, self._current_scale()
        count, self._n = self._n, 0
        handle = RoundHandle(self._round_index, kind, self.config.timeout_s)
        self._round_index += 1
        self._inflight = _InFlight(handle, kind, mode, self.commits)
        ready = record_ready(self.device)
        self._comm.submit(handle, lambda h: self._run_round(h, kind, mode, grads, bases, count, scale), ready)
        if mode == "acco":
            self._next_kind = COMMIT if kind == ESTIMATE else ESTIMATE

    def _complete(self) -> None:
        """Wait for the round in flight, swap its parameters in, and record telemetry."""
        flight = self._inflight
        t0 = time.perf_counter()
        try:
            outcome: _RoundOutcome = flight.handle.wait()
        except AccoRoundError:
            self._inflight = None
            raise
        t1 = time.perf_counter()
        self._landing.install()
        self._inflight = None
        self._compute_committed = flight.kind == COMMIT
        if flight.kind == COMMIT:
            self.commits += 1
        record = RoundRecord(
            index=flight.handle.index,
            kind=flight.kind,
            mode=flight.mode,
            step=flight.step,
            counts=outcome.counts,
            compute_s=t0 - self._last_swap_t,
            round_s=outcome.round_s,
            waited_s=t1 - t0,
            bytes_sent=outcome.bytes_sent,
            bytes_received=outcome.bytes_received,
            grad_norm=outcome.grad_norm,
            skipped=outcome.skipped,
            lr=outcome.lr,
            stage_s={k: round(v, 6) for k, v in flight.handle.stage_s.items()},
            nominal_step=self.lr_clock.nominal_steps,
        )
        self._last_swap_t = t1
        if self.config.telemetry.enabled:
            self.telemetry.add(record)
        if self._on_swap is not None:
            self._on_swap(record)  # may change the loss scale...
        if self._n == 0:  # ...which then applies to the (still empty) active accumulator
            self._active_scale = self._current_scale()
        if outcome.skipped:
            logger.warning("ds_acco: non-finite gradients, %s at step %d skipped on every rank", flight.kind, flight.step)
        every = self.config.telemetry.log_every
        if every and self.rank == 0 and flight.kind == COMMIT and self.commits % every == 0:
            logger.info(self.telemetry.format_line(record))

    # ------------------------------------------------------------ comm side
    def _run_round(
        self, handle: RoundHandle, kind: str, mode: str, grads: list[torch.Tensor], bases: list[torch.Tensor],
        count: int, scale: float,
    ) -> _RoundOutcome:
        start = time.perf_counter()
        sent0, recv0 = self.coll.wire.sent, self.coll.wire.received
        nonfinite = False
        if self.config.check_finite:
            nonfinite = any(not _all_finite(b) for b in grads)
        self._enter_stage(handle, "count all-gather")
        local = torch.tensor([count, int(nonfinite), self.coll.pacing_vote()], dtype=torch.int64, device=self.device)
        per_rank = self.coll.all_gather_small(local).cpu()
        self.coll.adopt_pacing(per_rank[:, 2].tolist())  # piece sizes on gloo (ds_acco.comm.link_pacing)
        counts = per_rank[:, 0].tolist()
        total = sum(counts)
        nonfinite = bool(per_rank[:, 1].any())

        self._enter_stage(handle, "reduce-scatter")
        for i, (g, buf, scratch, out, shard) in enumerate(
                zip(self.groups, grads, self._comm_scratch, self._rs_out, self._shard32)):
            send = g.comm_input(buf, scratch)
            if self._int8_rs is not None:
                self._int8_rs[i](self.coll, out, send)
            elif self._cast_rs[i] is not None:
                self._cast_rs[i](self.coll, out, send)
            else:
                self.coll.reduce_scatter_sum(out, send)
            if self._landing.round_zeroes(i):
                buf.zero_()  # "local grads reset"; otherwise the all-gather lands here and the swap zeroes
            if out is not shard:
                shard.copy_(out)
            if scale != 1.0:
                shard.mul_(1.0 / scale)  # unscaled sums, so an estimate and a commit made under
                # different loss scales add up correctly
        if kind == ESTIMATE:
            for kept, shard in zip(self._kept, self._shard32):
                kept.copy_(shard)
            self._kept_count, self._kept_nonfinite = total, nonfinite
        elif mode == "acco":
            for kept, shard in zip(self._kept, self._shard32):
                shard.add_(kept)
            total += self._kept_count
            nonfinite = nonfinite or self._kept_nonfinite

        self._enter_stage(handle, "shard step")
        delta = self._sends_delta(kind)
        landing = self._landing.targets(grads)
        # this rank's new shard goes straight into its slice of the all-gather destination
        publish = self._publish32 if delta and self._publish32 else [
            own if own is not None else g.layout.shard(full, self.rank)
            for g, full, own in zip(self.groups, landing, self._publish_packed)]
        skipped = (self.config.check_finite and nonfinite) or total == 0
        grad_norm = float("nan")
        if skipped:
            if kind == COMMIT:
                self.shard_optimizer.skip()
            self._publish_masters(publish)
        else:
            for shard in self._shard32:
                shard.div_(total)
            if self.clip > 0:
                grad_norm = self._clip_global_norm()
            if kind == ESTIMATE:
                self._publish_masters(publish)  # padding beyond a master's own elements comes from here
                self.shard_optimizer.lookahead(self._shard32, publish)
            else:
                self.shard_optimizer.commit(self._shard32, scheduler_steps=self.lr_clock.advances(total))
                self._publish_masters(publish)

        self._enter_stage(handle, "all-gather")
        for i, (full, part) in enumerate(zip(landing, publish)):
            if delta:
                self._delta_ag[i](self.coll, full, bases[i], part)
            else:
                self.all_gather_compute(i, full, part)
        self._enter_stage(handle, "done")
        return _RoundOutcome(
            counts=[int(c) for c in counts],
            round_s=time.perf_counter() - start,
            bytes_sent=self.coll.wire.sent - sent0,
            bytes_received=self.coll.wire.received - recv0,
            grad_norm=grad_norm,
            skipped=skipped,
            lr=self.shard_optimizer.lr,
        )

    def _enter_stage(self, handle: RoundHandle, stage: str) -> None:
        handle.enter_stage(stage)
        if self._on_stage is not None:
            self._on_stage(handle.index, stage)

    def _publish_masters(self, publish: list[torch.Tensor]) -> None:
        for part, g in zip(publish, self.groups):
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
            self.coll.all_gather(self._gather_scratch[i], part)
            g.packing.unpack(self._gather_scratch[i], full)

    def _clip_global_norm(self) -> float:
        """Clip the mean gradient shards in place by the norm over every rank's shards."""
        sq = torch.zeros(1, dtype=torch.float64, device=self.device)
        for shard in self._shard32:
            # vector_norm reduces without a shard-sized temporary (a .double() copy cost 8 B/element)
            sq += torch.linalg.vector_norm(shard).double() ** 2
        self.coll.all_reduce_sum(sq)
        norm = math.sqrt(float(sq.item()))
        coef = self.clip / (norm + 1e-6)
        if coef < 1.0:
            for shard in self._shard32:
                shard.mul_(coef)
        return norm

    # ------------------------------------------------------------ lifecycle
    def _ensure_open(self) -> None:
        if self._closed:
            raise AccoRoundError("this ds_acco RoundEngine is closed")

    def wait(self) -> None:
        """Wait for the round in flight and apply it (drain)."""
        self._ensure_open()
        if self._inflight is not None:
            self._complete()

    def quiesce(self) -> None:
        """Wait for the round in flight to end *without* swapping it in.

        The training trajectory is unchanged (a fixed-policy swap still happens at the
        quota), and the engine's state is now at rest, ready for :meth:`state_dict`.
        Under the adaptive policy the ranks first agree on the rounds launched
        (collective: every rank calls it; see :mod:`ds_acco.rounds.alignment`).
        """
        self._ensure_open()
        self._catch_up()
        if self._inflight is not None:
            self._inflight.handle.wait()

    def committed_buffers(self) -> Optional[list[torch.Tensor]]:
        """One full buffer per group holding the committed parameters (cast to the compute dtype).

        Waits for the round in flight without swapping it in (:meth:`quiesce`), so the
        training trajectory is unchanged, and communicates nothing: with a commit in
        flight its all-gathered result is where it landed; otherwise the compute
        buffers hold the last commit (an estimate round leaves them alone while in flight).
        Returns None where neither holds them exactly: the compute parameters being an
        estimate with nothing in flight (after :meth:`wait`, or a load that restored one),
        or ``all_gather_quantization: "int8"`` (commits arrive as int8 deltas); then
        all-gather the master shards (every rank).
        """
        self.quiesce()
        if self.config.all_gather_quantization == "int8":
            return None  # every all-gathered buffer trails the masters by an int8 delta's rounding
        if self._inflight is not None and self._inflight.kind == COMMIT:
            return self._landing.in_flight_targets()
        if self._compute_committed:
            return [g.flat for g in self.groups]
        return None

    def finish(self) -> None:
        """Drain and commit everything accumulated, so the compute parameters equal the
        committed master parameters (end of training, before export).

        After an estimate the commit covers its micro-batches and those added since; after
        a commit, micro-batches accumulated since its launch get one commit of their own.
        Under the fixed policy a loop that stops at a step boundary has nothing left, and
        this only waits.
        """
        self._ensure_open()
        self._catch_up()
        self.wait()
        if self.overlapping and self.config.mode == "acco" and self._next_kind == COMMIT:
            self._launch(COMMIT, "acco")
            self._complete()
        elif self._align.anyone(self._n > 0):
            self._launch(COMMIT, "sync")
            self._complete()
        if self.config.mode == "acco":
            self._next_kind = ESTIMATE
        for buf in self.grads.active_buffers():
            buf.zero_()
        self._n = 0
        if self.config.all_gather_quantization == "int8":
            self.exact_parameters()

    def exact_parameters(self) -> None:
        """Make the compute parameters exactly the master parameters on every rank.

        With ``all_gather_quantization: "int8"`` the replicas trail the masters by one
        quantisation step of the last delta; an export wants the committed values. One
        exact all-gather (collective: every rank calls it, with no round in flight).
        Later int8 deltas are taken against these values, so training continues as usual.
        """
        self._ensure_open()
        if self._inflight is not None:
            raise AccoRoundError("exact_parameters needs an idle engine (call finish() or wait() first)")
        for i, g in enumerate(self.groups):
            if g.packing is None:
                own = g.layout.shard(g.flat, self.rank)
                g.read_master(own)
                self.coll.all_gather(g.flat, own)  # in place: nothing reads the parameters while idle
            else:
                self.all_gather_masters(i, g.flat)

    def _catch_up(self) -> None:
        """Launch the round some other rank has already launched (adaptive policy only)."""
        target = self._align.most_launched(self._round_index)  # at most one ahead: see round_alignment
        while self._round_index < target:
            if self._inflight is not None:
                self._complete()
            self._launch(self._next_kind, self.config.mode if self.overlapping else "sync")

    def close(self, drain: bool = True) -> None:
        """Drain (or abandon) the round in flight, stop the thread, release the group."""
        if self._closed:
            return
        try:
            if drain and self._inflight is not None:
                self._complete()
        finally:
            self._closed = True
            self._inflight = None
            atexit.unregister(self._atexit)
            self._comm.close(timeout_s=5.0)
            self.grads.remove_hooks()
            self._align.destroy()
            self.coll.destroy()

    def __del__(self):  # pragma: no cover - best effort at garbage collection
        try:
            if not self._closed:
                self._comm.close(timeout_s=0.1)
        except Exception:
            pass
