"""The round engine: when rounds launch, and the swap that makes their result the compute parameters.

Framework-agnostic: it sees :class:`~ds_acco.layout.sharded_group.ShardedGroup` buffers,
a :class:`~ds_acco.optim.shard_optimizer.ShardOptimizer` and a process group. The
front ends (DeepSpeed, FSDP2, plain PyTorch) build those and call
:meth:`RoundEngine.after_micro_batch` after every backward. What a round computes once it
runs is :mod:`ds_acco.rounds.round_work`; its life (thread, group, close) is
:class:`~ds_acco.comm.engine_lifecycle.EngineLifecycle`'s.
The note on how acco's estimate/commit uses two gradient buffers is in ds_acco/rounds/round_work.py.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ds_acco.comm.clock import ClockLike
from ds_acco.comm.engine_lifecycle import EngineLifecycle
from ds_acco.config import AccoConfig, parse_acco_config
from ds_acco.config.compare import carry_on_changes
from ds_acco.errors import AccoConfigError, AccoRoundError
from ds_acco.layout.grad_buffers import GradBuffers
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.numerics.dtypes import resolve_dtype
from ds_acco.optim.lr_schedule import LrScheduleClock
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.records import RoundRecord

from . import describe
from . import state as round_state
from . import streaming_switch as switch
from .alignment import RoundAlignment
from .auto.mode import ACCO, SYNC, AutoMode
from .group_buffers import build_group_buffers, round_bytes
from .landing import Landing
from .round_work import COMMIT, ESTIMATE, RoundOutcome, RoundWork
from .state import InFlight, RoundState

logger = logging.getLogger("ds_acco")


class RoundEngine(EngineLifecycle):
    """Runs gradient rounds in the background of a training loop.

    Args:
        groups: the sharded parameter groups (compute buffers and master shards).
        gradient_accumulation_steps: ``G``, micro-batches per worker per optimizer step.
        clip_grad_norm: clip ``mean(X)`` to this global L2 norm (None or 0: off).
        grad_scale: the factor backward multiplied gradients by (a float or a
            callable read at each round), e.g. ``1/G`` when the framework divides
            the loss by ``G``, or the fp16 loss scale; the mean divides it out. It is
            read when an accumulator becomes active, so a loss scale that changes at a
            swap applies to exactly the micro-batches computed under it.
        on_swap: called on the training thread after every swap with the round's
            record (front ends advance their step counters and loss scalers here).
        on_stage: called on the communication thread as a round enters each stage
            (round index, stage name); for tracing and fault-injection tests.
        streaming_phase: builds the streaming phase ``acco.auto.streaming`` may switch to
            (:class:`ds_acco.streaming.phase.PhaseFactory`; :mod:`ds_acco.rounds.streaming_switch`).
        clock: what rounds, swaps and auto's figures are timed with (:mod:`ds_acco.comm.clock`; default
            ``time.perf_counter``): a simulated clock makes auto's figures exact.
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
        on_stop: Optional[Callable[[], None]] = None,
        streaming_phase: Optional[Callable] = None,
        clock: ClockLike = None,
    ):
        config = parse_acco_config(config)
        config.check_accumulation(gradient_accumulation_steps)
        if clip_grad_norm is not None and clip_grad_norm < 0:
            raise AccoConfigError(f"gradient_clipping: got {clip_grad_norm}; must be >= 0 (0 disables it)")
        self.groups = list(groups)
        accum = resolve_dtype(config.grad_accum_dtype, self.groups[0].flat.dtype, "acco.grad_accum_dtype")
        switch.check(config, self.groups, accum, streaming_phase)
        self.streaming_factory, self.phase = streaming_phase, None
        """The streaming phase's factory, and the phase once auto switched to it (None before)."""
        super().__init__(config, process_group, self.groups[0].flat.device, "ds_acco-comm", on_stop, clock)
        self.shard_optimizer = shard_optimizer
        self.G = gradient_accumulation_steps
        self.clip = float(clip_grad_norm or 0.0)
        self._grad_scale = grad_scale
        self._on_swap = on_swap
        self._agree_with_peers(
            (self.config.fingerprint(), self.G, self.clip, [g.layout.padded_numel for g in self.groups]),
            "acco config, gradient_accumulation_steps, gradient_clipping or model layout "
            "(fingerprint, G, clip, buffer sizes)")
        self._align = RoundAlignment(self.coll, self.config.policy != "fixed", self.config.timeout_s, self.device)

        self.grads = GradBuffers(self.groups, accum)
        self._landing = Landing(self.groups, self.grads)  # no staging buffer: see the note in ds_acco/rounds/landing.py
        comm = resolve_dtype(self.config.comm_dtype, accum, "acco.comm_dtype")
        self.buffers = build_group_buffers(self.groups, self.config, accum, comm, self.world_size, self.device)
        self.lr_clock = LrScheduleClock(self.G * self.world_size, by_tokens=self.config.policy != "fixed")
        self.work = RoundWork(self.groups, self.buffers, self._landing, self.coll, shard_optimizer, self.lr_clock,
                              self.config, self.clip, on_stage)
        estimate, commit = round_bytes(self.buffers, self.groups, self.world_size, comm)
        self.auto = AutoMode(self.config, self.G, self.world_size, self.rank, estimate / commit if commit else 1.0,
                             commit, clock=self.clock.now) if self.config.mode == "auto" else None
        """``mode: "auto"``'s timer and choices (:mod:`ds_acco.rounds.auto.mode`); None in the other modes."""
        self.state = RoundState(mode=SYNC if self.auto else self.config.mode, active_scale=self._current_scale(),
                                policy="fixed" if self.config.policy == "auto" else self.config.policy)
        self.state.next_kind = self._first_kind()
        self._last_swap_t, self._figures = self.clock.now(), None
        self._start_thread()

    startup_fields = describe.startup_fields

    # ------------------------------------------------------------ the schedule
    @property
    def commits(self) -> int:
        """Commits applied (optimizer steps); a front end resuming at step ``s`` sets it to ``s``."""
        return self.state.commits

    @commits.setter
    def commits(self, value: int) -> None:
        self.state.commits = value

    @property
    def micro_batches(self) -> int:
        """Micro-batches this rank computed; a front end resuming without round state sets it."""
        return self.state.micro_batches

    @micro_batches.setter
    def micro_batches(self, value: int) -> None:
        self.state.micro_batches = value

    @property
    def mode(self) -> str:
        """The mode rounds run in: the configured one, or the one ``mode: "auto"`` runs now."""
        return self.state.mode

    @property
    def overlapping(self) -> bool:
        """True once warmup is over and the mode overlaps rounds with compute."""
        return self.mode != "sync" and self.commits >= self.config.warmup_steps

    @property
    def quota(self) -> int:
        """Micro-batches per worker before a round launches: ``G/2`` in acco, ``G`` in sync (or ``G/2`` where auto
        runs sync at half the accumulation)."""
        if self.overlapping and self.mode == "acco":
            return self.G // 2
        return self.state.sync_quota if self.mode == SYNC and self.state.sync_quota else self.G

    def _first_kind(self) -> str:
        return ESTIMATE if self.mode == "acco" else COMMIT

    def _current_scale(self) -> float:
        return float(self._grad_scale() if callable(self._grad_scale) else self._grad_scale)

    # ------------------------------------------------------------ training side
    def after_micro_batch(self) -> bool:
        """Account for one finished backward; launch, wait and swap as the policy says. True when the compute
        parameters changed (a swap happened); a round that failed or timed out raises :class:`AccoRoundError` here."""
        self._ensure_open()
        if self._inflight is not None and self._inflight.handle.failed():
            self._complete()  # raises the round's error here
        self.grads.repair()
        s = self.state
        s.n += 1
        s.micro_batches += 1
        if self.phase is not None:  # every G micro-batches an inner step (and the fragment schedule)
            return s.n >= self.G and switch.step(self, s.n)
        if self.auto:
            self.auto.timer.micro_batch()
        if not self.overlapping:
            if s.n < self.quota:
                switch.probe_if_due(self)
                return False
            if not switch.look_before_first_round(self):
                self._launch(COMMIT, "sync")
                self._complete()
                if self.auto and self.auto.due(s.commits):
                    self.auto.decide(self.auto.gathered(self._submit, self.coll, self.device), s, s.commits,
                                     lr=self.shard_optimizer.lr)
                    switch.enter_if_chosen(self)
                if self.overlapping:
                    s.next_kind = self._first_kind()
            self._stop_if_agreed()
            return True
        if self._inflight is None:  # bootstrap after start or warmup
            if s.n >= self.quota:
                self._launch(s.next_kind, self.mode)
            return False
        if not self._round_ready():
            return False
        landed = self._inflight.kind
        self._complete()
        if landed == ESTIMATE and self.auto and self.auto.due(s.commits + 1) and \
                self.auto.decide(self._figures, s, s.commits + 1, lr=self.shard_optimizer.lr) != ACCO:  # (sets it)
            self._launch(COMMIT, "acco")  # the commit of this step, waited for: sync or streaming runs from θ_{t+1}
            self._complete()
            s.next_kind = COMMIT
            switch.enter_if_chosen(self)
        else:
            self._launch(s.next_kind, self.mode)
        self._stop_if_agreed()
        return True

    def _round_ready(self) -> bool:
        if self.state.policy == "fixed":
            return self.state.n >= self.quota
        cap, handle = self.config.max_micro_batches_per_round, self._inflight.handle
        # past timeout_s, _complete() raises the timeout with the round's stage
        return handle.done() or (cap is not None and self.state.n >= cap) or handle.elapsed() > self.config.timeout_s

    def _launch(self, kind: str, mode: str) -> None:
        s = self.state
        grads = self.grads.take()
        # the parameters every rank holds now: the base of an int8-delta all-gather (read-only;
        # they stay bound until this round's swap)
        bases = [g.flat for g in self.groups]
        scale, s.active_scale = s.active_scale, self._current_scale()
        count, s.n = s.n, 0
        figures = self.auto.timer.local() if self.auto else ()
        handle = self._submit(kind, lambda h: self.work.run(h, kind, mode, grads, bases, count, scale, figures))
        self._inflight = InFlight(handle, kind, mode, s.commits)
        if mode == "acco":
            s.next_kind = COMMIT if kind == ESTIMATE else ESTIMATE

    def _complete(self) -> None:
        """Wait for the round in flight, swap its parameters in, and record telemetry."""
        flight = self._inflight
        t0 = self.clock.now()
        try:
            outcome: RoundOutcome = flight.handle.wait()
        except AccoRoundError:
            self._inflight = None
            raise
        t1 = self.clock.now()
        self._landing.install()
        self._inflight = None
        s = self.state
        s.compute_committed = flight.kind == COMMIT
        if flight.kind == COMMIT:
            s.commits += 1
        record = RoundRecord(
            index=flight.handle.index, kind=flight.kind, mode=flight.mode, step=flight.step, counts=outcome.counts,
            compute_s=t0 - self._last_swap_t, round_s=outcome.round_s, waited_s=t1 - t0,
            bytes_sent=outcome.bytes_sent, bytes_received=outcome.bytes_received, grad_norm=outcome.grad_norm,
            skipped=outcome.skipped, lr=outcome.lr, stage_s={k: round(v, 6) for k, v in flight.handle.stage_s.items()},
            stage_cpu_s={k: round(v, 6) for k, v in flight.handle.stage_cpu_s.items()},
            nominal_step=self.lr_clock.nominal_steps,
        )
        self._last_swap_t = t1
        self._figures = outcome.figures
        if self.auto:
            self.auto.after_round(record, outcome, now=t1,
                                  committed=self.lr_clock.committed_micro_batches if flight.kind == COMMIT else None)
        if self.config.telemetry.enabled:
            self.telemetry.add(record)
        if self._on_swap is not None:
            self._on_swap(record)  # may change the loss scale...
        if s.n == 0:  # ...which then applies to the (still empty) active accumulator
            s.active_scale = self._current_scale()
        if outcome.skipped:
            logger.warning("ds_acco: non-finite gradients, %s at step %d skipped on every rank", flight.kind, flight.step)
        if outcome.stop and not self.stop_agreed:
            self.stop_agreed = True
            if self.rank == 0:
                logger.warning("ds_acco: a rank was sent SIGTERM: every rank stops after round %d (step %d)",
                               flight.handle.index, s.commits)
        every = self.config.telemetry.log_every
        if every and self.rank == 0 and flight.kind == COMMIT and s.commits % every == 0:
            logger.info(self.telemetry.format_line(record))

    _drain = _complete

    def _release(self) -> None:
        if self.phase is not None:
            self.phase.close(drain=False)  # at exit the streaming engine, newer, was closed first, with a drain
        self.grads.remove_hooks()
        self._align.destroy()

    # ------------------------------------------------------------ draining and exports
    def wait(self) -> None:
        """Wait for the round in flight and apply it (drain)."""
        self._ensure_open()
        if self.phase is not None:
            self.phase.engine.finish()
        if self._inflight is not None:
            self._complete()

    def quiesce(self) -> None:
        """Wait for the round in flight to end *without* swapping it in (it still swaps at the quota), ready for
        :meth:`state_dict`. Under the adaptive policy the ranks first agree on the rounds launched (collective:
        every rank calls it; see :mod:`ds_acco.rounds.alignment`)."""
        self._ensure_open()
        if self.phase is not None:
            return self.phase.engine.quiesce()
        self._catch_up()
        switch.wait_probe(self)  # (no collective of this thread may meet it on the group)
        super().quiesce()

    def committed_buffers(self) -> Optional[list[torch.Tensor]]:
        """One full buffer per group holding the committed parameters (cast to the compute dtype), or None where
        the masters must be all-gathered; waits for the round in flight without swapping it in (:meth:`quiesce`)
        and communicates nothing (:mod:`ds_acco.rounds.committed` says which buffer holds them when)."""
        if self.phase is not None:
            return self.phase.global_buffers()  # θ_g (collective in the streaming phase)
        self.quiesce()
        if self.config.all_gather_quantization == "int8":
            return None  # every all-gathered buffer trails the masters by an int8 delta's rounding
        if self._inflight is not None and self._inflight.kind == COMMIT:
            return self._landing.in_flight_targets()
        if self.state.compute_committed:
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
        if self.phase is not None:
            return switch.finish(self)
        self._catch_up()
        self.wait()
        s = self.state
        acco_commit = self.overlapping and self.mode == "acco" and s.next_kind == COMMIT
        if acco_commit or self._align.anyone(s.n > 0):
            self._launch(COMMIT, "acco" if acco_commit else "sync")
            self._complete()
        if self.mode == "acco":
            s.next_kind = ESTIMATE
        for buf in self.grads.active_buffers():
            buf.zero_()
        s.n = 0
        if self.config.all_gather_quantization == "int8":
            self.exact_parameters()

    def exact_parameters(self) -> None:
        """Make the compute parameters exactly the master parameters on every rank (collective, idle engine).

        With ``all_gather_quantization: "int8"`` the replicas trail the masters by one quantisation step of the last
        delta; an export wants the committed values. Later int8 deltas are taken against these values."""
        self._ensure_idle("exact_parameters needs an idle engine (call finish() or wait() first)")
        if self.phase is not None:
            return self.phase.consolidate()
        for i, g in enumerate(self.groups):
            if g.packing is None:
                own = g.layout.shard(g.flat, self.rank)
                g.read_master(own)
                self.coll.all_gather(g.flat, own)  # in place: nothing reads the parameters while idle
            else:
                self.work.all_gather_masters(i, g.flat)

    def _catch_up(self) -> None:
        """Launch the round some other rank has already launched (adaptive policy only)."""
        target = self._align.most(self._round_index)  # at most one ahead: see rounds/alignment.py
        while self._round_index < target:
            if self._inflight is not None:
                self._complete()
            self._launch(self.state.next_kind, self.mode if self.overlapping else "sync")

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """This rank's round state (:mod:`ds_acco.rounds.state`); waits for the round in flight first."""
        self.quiesce()
        pending = round_state.pending_of(self._inflight, self.groups, self._landing.in_flight_targets(), self.rank)
        out = round_state.snapshot(self.state, identity=round_state.identity(self), round_index=self._round_index,
                                   grads=self.grads, buffers=self.buffers, kept=self.work.kept,
                                   lr_clock=self.lr_clock, pending=pending)
        out["block"] = self.config.compared_fields()  # so a resume under another block can name what changed
        if self.phase is not None:
            self.phase.write_back()  # the front end's masters and moments: θ_g and the mean inner state
            out[switch.STREAMING] = self.phase.state_dict()
        return out

    def block_changes(self, saved: dict) -> list[str]:
        """The ``acco`` fields that differ from a saved round state's, when only they differ (same world size
        and layout): a front end may then rebuild the round state from the committed parameters instead of
        refusing (:func:`ds_acco.config.compare.carry_on_changes`)."""
        return carry_on_changes(saved, round_state.identity(self), self.config.compared_fields())

    def load_state_dict(self, saved: dict) -> None:
        """Restore :meth:`state_dict` output on every rank (collective: it all-gathers the pending result); a state
        saved with another mode/policy, world size or layout raises :class:`AccoConfigError`."""
        self._ensure_idle("load_state_dict needs an idle engine; a round is in flight")
        self.state, self._round_index, self.work.kept = round_state.restore(
            saved, identity=round_state.identity(self), grads=self.grads, buffers=self.buffers, lr_clock=self.lr_clock,
            mode=self.mode, policy=self.state.policy, block=self.config.compared_fields())
        self._inflight = round_state.restore_pending(saved["pending"], self._landing.in_flight_targets(),
                                                     self.work.all_gather_compute, self.config.timeout_s)
        switch.load(self, saved)
        self._last_swap_t = self.clock.now()

    def reset_rounds(self, commits: Optional[int] = None, compute_committed: bool = True) -> None:
        """Drop the round state (after waiting for the round in flight) so rounds bootstrap afresh.

        Used before loading a checkpoint; ``commits`` sets the step counter (warmup counts from it);
        ``compute_committed=False`` when the compute parameters loaded may be an estimate.
        """
        if self.phase is not None:
            switch.leave(self)
            self.state.mode = SYNC  # auto measures afresh
        self.quiesce()
        if self._inflight is not None:
            self._landing.zero_in_flight()  # it held the dropped round's parameters
        self._inflight = None
        round_state.reset_buffers(self.grads, self.buffers)
        self.work.kept = type(self.work.kept)()
        s = self.state
        s.n, s.next_kind, s.compute_committed = 0, self._first_kind(), compute_committed
        if commits is not None:
            s.commits = commits
        self.lr_clock.load_state_dict(None, s.commits)
        self._last_swap_t = self.clock.now()
