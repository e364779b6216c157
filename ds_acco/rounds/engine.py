"""The round engine a front end holds: the schedule that runs (:mod:`ds_acco.rounds.schedules`), swapped where the
round state says another one runs, auto's decisions applied at their boundary, and the parts' checkpoint state
(:mod:`ds_acco.rounds.state`) composed; launching, waiting and swapping is the driver's (:mod:`ds_acco.rounds.driver`).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ds_acco.comm.clock import ClockLike
from ds_acco.config import AccoConfig, check_saved_state_fits, parse_acco_config
from ds_acco.config.compare import carry_on_changes
from ds_acco.config.names import Mode, Policy
from ds_acco.errors import AccoConfigError
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.numerics.dtypes import resolve_dtype
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.records import RoundRecord

from . import describe
from .auto.mode import Decision
from .driver import RoundDriver
from .schedules import AdaptiveSchedule, FixedSchedule, Schedule, SyncSchedule
from .state import FORMAT, InFlight

logger = logging.getLogger("ds_acco")
STREAMING = Mode.STREAMING.value  # the round state's key for the phase's state (saved in the phase only)


class RoundEngine(RoundDriver):
    """Runs gradient rounds in the background of a training loop.

    Args:
        groups: the sharded parameter groups (compute buffers and master shards).
        gradient_accumulation_steps: ``G``, micro-batches per worker per optimizer step.
        clip_grad_norm: clip ``mean(X)`` to this global L2 norm (None or 0: off).
        grad_scale: the factor backward multiplied gradients by (a float, or a callable read when an accumulator
            becomes active, so a loss scale that changes at a swap applies to exactly the micro-batches computed
            under it), e.g. ``1/G`` when the framework divides the loss by ``G``; the mean divides it out.
        on_swap: called on the training thread after every swap with the round's record (front ends advance their
            step counters and loss scalers here).
        on_stage: called on the communication thread as a round enters each stage (round index, stage name).
        streaming_phase: builds the phase ``acco.auto.streaming`` may switch to (a ``PhaseFactory``).
        clock: what rounds, swaps and auto's figures are timed with (:mod:`ds_acco.comm.clock`; default
            ``time.perf_counter``): a simulated clock makes auto's figures exact.
    """

    def __init__(self, groups: Sequence[ShardedGroup], shard_optimizer: ShardOptimizer, *,
                 config: Union[AccoConfig, dict], gradient_accumulation_steps: int,
                 clip_grad_norm: Optional[float] = None, process_group: Optional[dist.ProcessGroup] = None,
                 grad_scale: Union[float, Callable[[], float]] = 1.0,
                 on_swap: Optional[Callable[[RoundRecord], None]] = None,
                 on_stage: Optional[Callable[[int, str], None]] = None, on_stop: Optional[Callable[[], None]] = None,
                 streaming_phase: Optional[Callable] = None, clock: ClockLike = None):
        config = parse_acco_config(config)
        config.check_accumulation(gradient_accumulation_steps)
        if clip_grad_norm is not None and clip_grad_norm < 0:
            raise AccoConfigError(f"gradient_clipping: got {clip_grad_norm}; must be >= 0 (0 disables it)")
        accum = resolve_dtype(config.grad_accum_dtype, groups[0].flat.dtype, "acco.grad_accum_dtype")
        if config.mode == Mode.AUTO and config.auto.streaming:
            if streaming_phase is None:
                raise AccoConfigError("acco.auto.streaming: got true, but this front end cannot switch to streaming "
                                      "(it needs the model to cut fragments: DeepSpeed ZeRO-1, or ds_acco.plain.build "
                                      "with model=); allowed here: false")
            streaming_phase.check(groups, accum)
        self.streaming_factory, self.phase = streaming_phase, None
        """The streaming phase's factory, and the phase once auto switched to it (None before)."""
        super().__init__(groups, shard_optimizer, config, accum, gradient_accumulation_steps,
                         float(clip_grad_norm or 0.0), process_group, grad_scale, on_swap, on_stage, on_stop, clock)
        self._gradient = {Mode.SYNC: SyncSchedule(self), Policy.FIXED: FixedSchedule(self),
                          Policy.ADAPTIVE: AdaptiveSchedule(self)}
        self.schedule: Schedule = self._gradient[Mode.SYNC]  # what runs the job's steps now
        self._reschedule()
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
        self._reschedule()  # the warm-up may be over

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
    def quota(self) -> int:
        """Micro-batches per worker before a round launches: ``G/2`` in acco, ``G`` in sync (half of each where
        auto runs at half the accumulation)."""
        return self.schedule.quota

    def _reschedule(self, boundary: bool = False) -> None:
        """Hold the schedule the round state says runs now; at a step's ``boundary`` an overlapped mode entered
        from sync starts with its first kind of round."""
        if self.phase is not None:
            self.schedule = self.phase
            return
        was = self.schedule
        self.schedule = self._gradient[self.state.policy if self.overlapping else Mode.SYNC]
        if boundary and was is self._gradient[Mode.SYNC] and self.schedule is not was:
            self.state.next_kind = self.first_kind()

    def _apply(self, decision: Decision) -> None:
        """Auto's choice, at the boundary it was made for (streaming enters the phase, or sync where it cannot)."""
        decision.apply(self.state)
        if self.state.mode == Mode.STREAMING and self.phase is None:
            self._enter_phase()
        self._reschedule(boundary=True)

    def _enter_phase(self) -> bool:
        """Build the streaming phase (collective: ``PhaseFactory.enter``); where some rank has not the memory for
        it, every rank stays in sync and auto never offers streaming again. Returns whether it switched."""
        phase = self.streaming_factory.enter(self)
        if phase is None:
            self.auto.refuse_streaming()
            self.state.mode = Mode.SYNC
            return False
        self.phase, self.schedule, self.state.mode = phase, phase, Mode.STREAMING
        if self.auto.choices:
            self.auto.choices[-1]["switch_s"] = phase.switch_s
        return True

    def _leave_phase(self) -> None:  # before a checkpoint load overwrites the buffers
        self.phase.leave()
        self.phase = None
        self._reschedule()

    # ------------------------------------------------------------ training side
    def after_micro_batch(self) -> bool:
        """Account for one finished backward; launch, wait and swap as the schedule says. True when the compute
        parameters changed (a swap happened); a round that failed or timed out raises :class:`AccoRoundError` here."""
        self._ensure_open()
        if self._inflight is not None and self._inflight.handle.failed():
            self.complete()  # raises the round's error here
        self.grads.repair()
        self.state.n += 1
        self.state.micro_batches += 1
        if self.auto is not None and self.phase is None:
            self.auto.timer.micro_batch()
        swapped, decision = self.schedule.after_micro_batch()
        if decision is not None and not swapped:  # a look before the first round: the schedule that runs now ends
            self._apply(decision)                 # the step (the phase, or sync where streaming did not fit)
            swapped, decision = self.schedule.after_micro_batch()
        if decision is not None:
            self._apply(decision)
        if swapped:
            self._reschedule(boundary=True)  # the warm-up may be over
            self._stop_if_agreed()
        return swapped

    def _release(self) -> None:
        self.schedule.close(drain=False)  # at exit a streaming engine, newer, was closed first, with a drain
        self.grads.remove_hooks()
        self.align.destroy()

    # ------------------------------------------------------------ draining and exports
    def wait(self) -> None:
        """Wait for the round in flight and swap it in (drain)."""
        self._ensure_open()
        self.schedule.wait()

    def quiesce(self) -> None:
        """Wait for the round in flight to end *without* swapping it in (it still swaps at the quota); under the
        adaptive policy the ranks first agree on the rounds launched (collective: :mod:`ds_acco.rounds.alignment`)."""
        self._ensure_open()
        self.schedule.quiesce()

    def committed_buffers(self) -> Optional[list[torch.Tensor]]:
        """One full buffer per group holding the committed parameters, or None where the masters must be
        all-gathered; quiesces, and communicates nothing but in a streaming phase."""
        self._ensure_open()
        return self.schedule.committed_buffers()

    def finish(self) -> None:
        """Drain and commit everything accumulated: the compute parameters become the committed masters."""
        self._ensure_open()
        self.schedule.finish()
        self._reschedule()

    def exact_parameters(self) -> None:
        """Make the compute parameters exactly the master parameters on every rank (collective, idle engine)."""
        self._ensure_idle("exact_parameters needs an idle engine (call finish() or wait() first)")
        self.schedule.exact_parameters()

    # ------------------------------------------------------------ checkpoints
    def identity(self) -> dict:  # what a saved round state must match to load
        return {"fingerprint": self.config.fingerprint(), "world_size": self.world_size,
                "padded_numels": [g.layout.padded_numel for g in self.groups]}

    def state_dict(self) -> dict:
        """This rank's round state, composed of its parts'; quiesces first. ``O(params / N)`` tensors, plus the
        active accumulator when it holds micro-batches (checkpoint right after a step to avoid that)."""
        self.quiesce()
        flight = self._inflight  # finished: its result as this rank's shards of the buffers it landed in
        pending = flight and flight.state_dict(self.groups, self.landing.in_flight_targets(), self.rank)
        out = {"format": FORMAT, **self.identity(), "round_index": self._round_index, "pending": pending,
               "lr_clock": self.lr_clock.state_dict(), **self.state.state_dict(), **self.buffers.state_dict(),
               **self.grads.state_dict(held=self.state.n > 0),
               "block": self.config.compared_fields()}  # so a resume under another block can name what changed
        if self.phase is not None:
            out[STREAMING] = self.phase.state_dict()
        return out

    def block_changes(self, saved: dict) -> list[str]:
        """The ``acco`` fields that differ from a saved round state's, when only they differ: a front end may then
        rebuild the round state from the committed parameters instead of refusing."""
        return carry_on_changes(saved, self.identity(), self.config.compared_fields())

    def load_state_dict(self, saved: dict) -> None:
        """Restore :meth:`state_dict` output on every rank (collective: it all-gathers the pending result); a state
        saved with another mode/policy, world size or layout raises :class:`AccoConfigError`."""
        self._ensure_idle("load_state_dict needs an idle engine; a round is in flight")
        check_saved_state_fits(
            saved, self.identity(), "the ACCO round state", "Resume with the same acco block and world size, or load "
            "the model and optimizer only (a fresh round state bootstraps).", block=self.config.compared_fields())
        self.state.load_state_dict(saved)
        self.lr_clock.load_state_dict(saved.get("lr_clock"), self.state.commits)  # absent in older checkpoints
        self.grads.load_state_dict(saved)
        self.buffers.load_state_dict(saved)
        self._round_index = saved["round_index"]
        self._inflight = InFlight.restore(saved["pending"], self.landing.in_flight_targets(),
                                          self.work.all_gather_compute, self.config.timeout_s)
        self._load_phase(saved.get(STREAMING))
        self.last_swap_t = self.clock.now()
        self._reschedule()

    def _load_phase(self, phase_state: Optional[dict]) -> None:  # enter the phase (and restore it), or leave it
        if phase_state is None:
            if self.phase is not None:
                self._leave_phase()
            return
        if self.phase is None:
            if self.streaming_factory is None:
                raise AccoConfigError("acco.auto.streaming: the checkpoint was saved in a streaming phase, which this "
                                      "job cannot run (set acco.auto.streaming to true, on DeepSpeed ZeRO-1 or "
                                      "ds_acco.plain.build with model=)")
            if not self._enter_phase():
                raise AccoConfigError("acco.auto.streaming: the checkpoint was saved in a streaming phase, for which "
                                      "some rank has not the memory now; resume with acco.auto.streaming false to go "
                                      "on from the global model its files hold")
        self.phase.load_state_dict(phase_state)

    def reset_rounds(self, commits: Optional[int] = None, compute_committed: bool = True) -> None:
        """Drop the round state (the round in flight waited for) so rounds bootstrap afresh, before a load; ``commits``
        sets the step counter, ``compute_committed=False`` where the loaded parameters may be an estimate."""
        if self.phase is not None:
            self._leave_phase()
            self.state.mode, self.state.step_quota = Mode.SYNC, 0  # auto measures afresh, at the configured batch
        self.quiesce()
        if self._inflight is not None:
            self.landing.zero_in_flight()  # it held the dropped round's parameters
        self._inflight = None
        self.grads.clear()
        self.buffers.reset()
        s = self.state
        s.n, s.next_kind, s.compute_committed = 0, self.first_kind(), compute_committed
        if commits is not None:
            s.commits = commits
        self.lr_clock.load_state_dict(None, s.commits)
        self.last_swap_t = self.clock.now()
        self._reschedule()
