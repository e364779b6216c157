"""When rounds launch and land: one small object per schedule, behind one protocol, so that a new mode is one class.

A job runs under one schedule at a time (or the streaming phase, which implements :class:`Schedule` without importing
this layer); ``RoundEngine._reschedule`` picks it. A schedule decides *when*; the driver below it launches, waits and
swaps; auto's :class:`~ds_acco.rounds.auto.mode.Decision` goes back up to the engine, which applies it.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from ds_acco.config.names import Kind, Mode

from .auto.mode import Decision
from .driver import RoundDriver

Boundary = tuple[bool, Optional[Decision]]
"""Whether the compute parameters changed, and auto's choice there (None: none). A choice without a swap is a look
before the first round: the engine applies it, and the schedule that runs then ends the step."""


class Schedule(Protocol):
    """What the engine asks of the schedule that runs (each method: the engine's public one of the same name)."""

    quota: int  # micro-batches per worker before a round (or a streaming step) ends

    def after_micro_batch(self) -> Boundary: ...
    def wait(self) -> None: ...
    def quiesce(self) -> None: ...
    def committed_buffers(self) -> Optional[list[torch.Tensor]]: ...
    def finish(self) -> None: ...
    def exact_parameters(self) -> None: ...

    def rebind(self) -> None: ...  # the parameters back on this schedule's buffers, after a block bound others
    def close(self, drain: bool) -> None: ...  # release what it holds (the engine closes after it)


class SyncSchedule:
    """``sync``, and every mode's warm-up: a round launches at the quota and is waited for at once. In ``mode:
    "auto"`` a choice follows the commit where due, and with ``auto.streaming`` a look before the first round."""

    def __init__(self, rounds: RoundDriver):
        self.rounds = rounds

    @property
    def quota(self) -> int:
        s = self.rounds.state
        return s.step_quota if s.mode == Mode.SYNC and s.step_quota else self.rounds.G

    def after_micro_batch(self) -> Boundary:
        r, s, auto = self.rounds, self.rounds.state, self.rounds.auto
        if s.n < self.quota:
            if auto is not None and s.commits == 0 and s.micro_batches == 1 and auto.look_first():
                auto.start_probe(r.submit, r.coll)  # behind the rest of step 1's compute
            return False, None
        if auto is not None and auto.probe is not None:  # the look before the first round
            figures = auto.gathered(r.submit, r.coll, r.device, auto.first_figures(auto.wait_probe()))
            look = auto.decision(figures, s, 0)
            if look is not None:  # streaming, the only mode a look inside the warm-up may start
                return False, look
        r.launch(Kind.COMMIT, Mode.SYNC)
        r.complete()
        if auto is None or not auto.due(s.commits):
            return True, None
        figures = auto.gathered(r.submit, r.coll, r.device)  # every rank's, this round's included
        return True, auto.decision(figures, s, s.commits, lr=r.shard_optimizer.lr)

    # ------------------------------------------------------------ what every gradient schedule does alike
    def wait(self) -> None:
        if self.rounds.flight is not None:
            self.rounds.complete()

    def quiesce(self) -> None:
        r = self.rounds
        r.catch_up()  # (adaptive policy: the ranks first agree on the rounds launched; rounds/alignment.py)
        if r.auto is not None:
            r.auto.wait_probe()  # (no collective of this thread may meet it on the group)
        if r.flight is not None:
            r.flight.handle.wait()

    def committed_buffers(self) -> Optional[list[torch.Tensor]]:  # (rounds/committed.py: which buffer, when)
        r = self.rounds
        self.quiesce()
        if r.config.all_gather_quantization == "int8":
            return None  # every all-gathered buffer trails the masters by an int8 delta's rounding
        if r.flight is not None and r.flight.kind == Kind.COMMIT:
            return r.landing.in_flight_targets()
        return [g.flat for g in r.groups] if r.state.compute_committed else None

    def finish(self) -> None:
        """After an estimate the commit covers its micro-batches and those added since; after a commit,
        micro-batches accumulated since its launch get one commit of their own. Under the fixed policy a loop that
        stops at a step boundary has nothing left, and this only waits."""
        r, s = self.rounds, self.rounds.state
        r.catch_up()
        self.wait()
        acco_commit = r.overlapping and s.mode == Mode.ACCO and s.next_kind == Kind.COMMIT
        if acco_commit or r.align.anyone(s.n > 0):
            r.launch(Kind.COMMIT, Mode.ACCO if acco_commit else Mode.SYNC)
            r.complete()
        if s.mode == Mode.ACCO:
            s.next_kind = Kind.ESTIMATE
        r.grads.clear()
        s.n = 0
        if r.config.all_gather_quantization == "int8":
            self.exact_parameters()

    def exact_parameters(self) -> None:
        """With ``all_gather_quantization: "int8"`` the replicas trail the masters by one quantisation step of the
        last delta; an export wants the committed values. Later int8 deltas are taken against these values."""
        r = self.rounds
        for i, g in enumerate(r.groups):
            if g.packing is None:
                own = g.layout.shard(g.flat, r.rank)
                g.read_master(own)
                r.coll.all_gather(g.flat, own)  # in place: nothing reads the parameters while idle
            else:
                r.work.all_gather_masters(i, g.flat)

    def rebind(self) -> None:
        pass  # the groups' buffers are the compute parameters

    def close(self, drain: bool) -> None:
        pass  # the driver holds everything


class FixedSchedule(SyncSchedule):
    """``dpu`` and ``acco`` past the warm-up, fixed policy: a round launches when this worker computed its quota
    (``G/2`` in acco, ``G/4`` where auto runs it at half the accumulation, ``G`` in dpu) and lands at the next,
    overlapped with the compute in between; acco alternates estimates and commits. In ``mode: "auto"`` a choice comes
    after an estimate, where due: leaving acco, the step's commit is waited for, so sync (or streaming) runs from the
    committed parameters."""

    @property
    def quota(self) -> int:
        s = self.rounds.state
        return (s.step_quota or self.rounds.G) // 2 if s.mode == Mode.ACCO else self.rounds.G

    def ready(self) -> bool:
        return self.rounds.state.n >= self.quota

    def after_micro_batch(self) -> Boundary:
        r, s = self.rounds, self.rounds.state
        if r.flight is None:  # bootstrap after start or warmup
            if s.n >= self.quota:
                r.launch(s.next_kind, s.mode)
            return False, None
        if not self.ready():
            return False, None
        landed, chosen = r.complete(), None
        if landed == Kind.ESTIMATE and r.auto is not None and r.auto.due(s.commits + 1):
            chosen = r.auto.decision(r.figures, s, s.commits + 1, lr=r.shard_optimizer.lr)
        if chosen is not None and chosen.mode != Mode.ACCO:
            r.launch(Kind.COMMIT, Mode.ACCO)  # this step's commit, waited for: sync or streaming runs from θ_{t+1}
            r.complete()
            s.next_kind = Kind.COMMIT
        else:
            r.launch(s.next_kind, s.mode)
        return True, chosen


class AdaptiveSchedule(FixedSchedule):
    """The adaptive policy: a round lands at the first micro-batch boundary after its communication ended (or at
    ``max_micro_batches_per_round``), with whatever each worker computed meanwhile."""

    def ready(self) -> bool:  # (past timeout_s, RoundDriver.complete raises the timeout with its stage)
        r, handle, cap = self.rounds, self.rounds.flight.handle, self.rounds.config.max_micro_batches_per_round
        return handle.done() or (cap is not None and r.state.n >= cap) or handle.elapsed() > r.config.timeout_s
