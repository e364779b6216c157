"""A gradient round's life on the training thread: launched, waited for, swapped in. Schedules say when.

The round engine below its schedules: a schedule calls it and it calls no schedule back, so one step reads top
down: engine, schedule, driver, round (:mod:`ds_acco.rounds.round_work`), collectives.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from ds_acco.comm.engine_lifecycle import EngineLifecycle
from ds_acco.config import AccoConfig
from ds_acco.config.names import Kind, Mode, Policy
from ds_acco.errors import AccoRoundError
from ds_acco.layout.grad_buffers import GradBuffers
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.numerics.dtypes import resolve_dtype
from ds_acco.optim.lr_schedule import LrScheduleClock
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.records import RoundRecord

from .alignment import RoundAlignment
from .auto.mode import AutoMode
from .group_buffers import build_group_buffers, round_bytes
from .landing import Landing
from .round_work import RoundOutcome, RoundWork
from .state import InFlight, RoundState

logger = logging.getLogger("ds_acco")


class RoundDriver(EngineLifecycle):
    """Launch, wait, swap; :class:`~ds_acco.rounds.engine.RoundEngine` documents the arguments."""

    def __init__(self, groups: Sequence[ShardedGroup], shard_optimizer: ShardOptimizer, config: AccoConfig,
                 accum: torch.dtype, G: int, clip: float, process_group, grad_scale, on_swap, on_stage, on_stop, clock):
        self.groups = list(groups)
        super().__init__(config, process_group, self.groups[0].flat.device, "ds_acco-comm", on_stop, clock)
        self.shard_optimizer, self.G, self.clip = shard_optimizer, G, clip
        self._grad_scale, self._on_swap = grad_scale, on_swap
        self._agree_with_peers(
            (config.fingerprint(), G, clip, [g.layout.padded_numel for g in self.groups]),
            "acco config, gradient_accumulation_steps, gradient_clipping or model layout "
            "(fingerprint, G, clip, buffer sizes)")
        self.align = RoundAlignment(self.coll, config.policy != Policy.FIXED, config.timeout_s, self.device)
        self.grads = GradBuffers(self.groups, accum)
        self.landing = Landing(self.groups, self.grads)  # no staging buffer: see the note in ds_acco/rounds/landing.py
        comm = resolve_dtype(config.comm_dtype, accum, "acco.comm_dtype")
        self.buffers = build_group_buffers(self.groups, config, accum, comm, self.world_size, self.device)
        self.lr_clock = LrScheduleClock(G * self.world_size, by_tokens=config.policy != Policy.FIXED)
        self.work = RoundWork(self.groups, self.buffers, self.landing, self.coll, shard_optimizer, self.lr_clock,
                              config, clip, on_stage)
        estimate, commit = round_bytes(self.buffers, self.groups, self.world_size, comm)
        self.auto = AutoMode(config, G, self.world_size, self.rank, estimate / commit if commit else 1.0, commit,
                             clock=self.clock.now) if config.mode == Mode.AUTO else None  # (None in other modes)
        self.state = RoundState(mode=Mode.SYNC if self.auto else config.mode, active_scale=self.current_scale(),
                                policy=Policy.FIXED if config.policy == Policy.AUTO else config.policy)
        self.state.next_kind = self.first_kind()
        self.last_swap_t = self.clock.now()  # the last swap's (or streaming step's) end: the next compute's start
        self.figures: Optional[list] = None  # mode auto: every rank's figures from the last count all-gather

    @property
    def flight(self) -> Optional[InFlight]:  # the round on the communication thread (or finished, not swapped in)
        return self._inflight

    @property
    def overlapping(self) -> bool:  # warm-up over, in a mode that overlaps rounds with compute
        return self.state.mode != Mode.SYNC and self.state.commits >= self.config.warmup_steps

    def first_kind(self) -> str:
        return Kind.ESTIMATE if self.state.mode == Mode.ACCO else Kind.COMMIT

    def current_scale(self) -> float:
        return float(self._grad_scale() if callable(self._grad_scale) else self._grad_scale)

    # ------------------------------------------------------------ a round
    def launch(self, kind: str, mode: str) -> None:
        """Hand the active accumulator to a round of ``kind`` on the communication thread; the other one fills."""
        s = self.state
        grads = self.grads.take()
        # the parameters every rank holds now: the base of an int8-delta all-gather (read-only;
        # they stay bound until this round's swap)
        bases = [g.flat for g in self.groups]
        scale, s.active_scale = s.active_scale, self.current_scale()
        count, s.n = s.n, 0
        figures = self.auto.timer.local() if self.auto else ()
        handle = self.submit(kind, lambda h: self.work.run(h, kind, mode, grads, bases, count, scale, figures))
        self._inflight = InFlight(handle, kind, mode, s.commits)
        if mode == Mode.ACCO:
            s.next_kind = Kind.COMMIT if kind == Kind.ESTIMATE else Kind.ESTIMATE

    def complete(self) -> str:
        """Wait for the round in flight, swap it in, record it; returns its kind (its errors raise here)."""
        flight = self._inflight
        t0 = self.clock.now()
        try:
            outcome: RoundOutcome = flight.handle.wait()
        except AccoRoundError:
            self._inflight = None
            raise
        t1 = self.clock.now()
        self.landing.install()
        self._inflight = None
        s = self.state
        s.compute_committed = flight.kind == Kind.COMMIT
        if flight.kind == Kind.COMMIT:
            s.commits += 1
        record = RoundRecord(
            index=flight.handle.index, kind=flight.kind, mode=flight.mode, step=flight.step, counts=outcome.counts,
            compute_s=t0 - self.last_swap_t, round_s=outcome.round_s, waited_s=t1 - t0,
            bytes_sent=outcome.bytes_sent, bytes_received=outcome.bytes_received, grad_norm=outcome.grad_norm,
            skipped=outcome.skipped, lr=outcome.lr, stage_s={k: round(v, 6) for k, v in flight.handle.stage_s.items()},
            stage_cpu_s={k: round(v, 6) for k, v in flight.handle.stage_cpu_s.items()},
            nominal_step=self.lr_clock.nominal_steps,
        )
        self.last_swap_t, self.figures = t1, outcome.figures
        if self.auto:
            committed = self.lr_clock.committed_micro_batches if flight.kind == Kind.COMMIT else None
            self.auto.after_round(record, outcome, now=t1, committed=committed)
        if self.config.telemetry.enabled:
            self.telemetry.add(record)
        if self._on_swap is not None:
            self._on_swap(record)  # may change the loss scale...
        if s.n == 0:  # ...which then applies to the (still empty) active accumulator
            s.active_scale = self.current_scale()
        if outcome.skipped:
            logger.warning("ds_acco: non-finite gradients, %s at step %d skipped on every rank", flight.kind,
                           flight.step)
        if outcome.stop and not self.stop_agreed:
            self.stop_agreed = True
            if self.rank == 0:
                logger.warning("ds_acco: a rank was sent SIGTERM: every rank stops after round %d (step %d)",
                               flight.handle.index, s.commits)
        every = self.config.telemetry.log_every
        if every and self.rank == 0 and flight.kind == Kind.COMMIT and s.commits % every == 0:
            logger.info(self.telemetry.format_line(record))
        return flight.kind

    _drain = complete

    def swapped(self, record: RoundRecord, now: float) -> None:  # a step without a round (streaming)
        self.last_swap_t = now
        if self._on_swap is not None:
            self._on_swap(record)  # the front end's step counters; telemetry keeps the fragment rounds

    def catch_up(self) -> None:  # launch the round some other rank already launched (adaptive policy only)
        target = self.align.most(self._round_index)  # at most one ahead: see rounds/alignment.py
        while self._round_index < target:
            if self._inflight is not None:
                self.complete()
            self.launch(self.state.next_kind, self.state.mode if self.overlapping else Mode.SYNC)
