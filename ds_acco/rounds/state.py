"""The round engine's own state in a checkpoint: what a resume needs beyond the front end's files.

A front end's checkpoint (DeepSpeed's files, FSDP2's DCP shards) holds the compute parameters, the master shards
and the optimizer; what only the round engine knows is held by parts that each save and load their own
(``state_dict``/``load_state_dict``, as torch DCP's ``Stateful``): the schedule's position (:class:`RoundState`), the
accumulator being filled (:class:`~ds_acco.layout.grad_buffers.GradBuffers`), the kept estimate, what an int4
estimate lost and the int8 residuals (:class:`~ds_acco.rounds.group_buffers.RoundBuffers`), the learning-rate
clock, a round that finished but was not yet swapped in (:class:`InFlight`: its result, as this rank's shard of the
buffer it landed in) and a streaming phase's state; :meth:`RoundEngine.state_dict
<ds_acco.rounds.engine.RoundEngine.state_dict>` composes them into one flat dict. Saving waits for the round in
flight without swapping it in, so a checkpoint never changes the trajectory.

The dict format is stable: checkpoints of earlier releases load (keys added since then have defaults on load), and
every value is a plain ``str``, number, list or tensor, which torch's restricted unpickler loads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Optional, Sequence

import torch

from ds_acco.comm.comm_thread import RoundHandle
from ds_acco.config.names import Kind, Mode, Policy

from .round_work import RoundOutcome

FORMAT = 1


@dataclass
class RoundState:
    """Where the engine is in its schedule; every field is saved and restored."""

    commits: int = 0
    """Commits applied (optimizer steps); warmup counts from it."""
    micro_batches: int = 0
    """Micro-batches this rank computed since the start of training."""
    n: int = 0
    """Micro-batches accumulated since the last launch (in the active accumulator)."""
    next_kind: str = Kind.COMMIT
    """The kind of the next round: ``estimate`` or ``commit`` (acco alternates them)."""
    active_scale: float = 1.0
    """The gradient scale the active accumulator's micro-batches were computed under."""
    compute_committed: bool = True
    """False while the compute parameters hold an estimate rather than committed parameters."""
    mode: str = Mode.SYNC
    """The mode rounds run in: the configured one, or what ``mode: "auto"`` chose last."""
    policy: str = Policy.FIXED
    """The acco policy rounds run under: the configured one, or what ``policy: "auto"`` chose last."""
    sync_quota: int = 0
    """Micro-batches per worker a sync round commits (0: ``G``); ``mode: "auto"`` sets ``G/2`` when it runs sync at
    half the accumulation (where the policy may change the batch)."""

    def state_dict(self) -> dict:
        return {f.name: str(v) if isinstance(v, str) else v for f in fields(self) for v in [getattr(self, f.name)]}

    def load_state_dict(self, saved: dict) -> None:
        """Every field from ``saved``; one an earlier release did not save takes its default (the mode and policy:
        what rounds run in now)."""
        now = {"mode": self.mode, "policy": self.policy}
        for f in fields(self):
            setattr(self, f.name, saved.get(f.name, now.get(f.name, f.default)))


@dataclass
class InFlight:
    """The round on the communication thread, as the training thread knows it."""

    handle: RoundHandle
    kind: str
    mode: str
    step: int

    def state_dict(self, groups: Sequence, targets: Sequence[torch.Tensor], rank: int) -> dict:
        """The round, finished (the engine quiesced), as a checkpoint entry: its record and this rank's shards of
        the buffers it landed in (``targets``)."""
        return {"kind": str(self.kind), "mode": str(self.mode), "step": self.step, "index": self.handle.index,
                "outcome": dict(vars(self.handle.wait()), stop=False),  # a SIGTERM stops this job, not the next
                "staging_shards": [g.compute_shard(t, rank) for g, t in zip(groups, targets)]}

    @classmethod
    def restore(cls, pending: Optional[dict], targets: Sequence[torch.Tensor],
                all_gather_compute: Callable[[int, torch.Tensor, torch.Tensor], None],
                timeout_s: float) -> Optional["InFlight"]:
        """All-gather a saved round's shards back into the buffers it landed in (collective); the round in flight
        it becomes, finished, to be swapped in at its boundary (None: none was pending)."""
        if pending is None:
            return None
        for i, (full, part) in enumerate(zip(targets, pending["staging_shards"])):
            all_gather_compute(i, full, part.to(full.dtype))
        handle = RoundHandle.completed(pending["index"], pending["kind"], timeout_s,
                                       RoundOutcome(**dict(pending["outcome"], stop=False)))
        return cls(handle, pending["kind"], pending["mode"], pending["step"])
