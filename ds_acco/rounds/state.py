"""The round engine's own state in a checkpoint: what a resume needs beyond the front end's files.

Each part saves and loads its own (``state_dict``/``load_state_dict``, as torch DCP's ``Stateful``): the schedule's
position (:class:`RoundState`), ``GradBuffers``, ``RoundBuffers``, the LR clock, a round finished but not yet swapped
in (:class:`InFlight`) and the streaming phase; ``RoundEngine.state_dict`` merges them into one flat dict. Saving
waits for the round in flight without swapping it in, so a checkpoint never changes the trajectory. The format is
stable: earlier releases' checkpoints load (newer keys have defaults), and every value is a plain ``str``, number,
list or tensor, which torch's restricted unpickler loads.
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

    commits: int = 0  # commits applied (optimizer steps); warmup counts from it
    micro_batches: int = 0  # micro-batches this rank computed since the start of training
    n: int = 0  # micro-batches accumulated since the last launch (in the active accumulator)
    next_kind: str = Kind.COMMIT  # acco alternates estimates and commits
    active_scale: float = 1.0  # the gradient scale the active accumulator's micro-batches were computed under
    compute_committed: bool = True  # False while the compute parameters hold an estimate
    mode: str = Mode.SYNC  # the configured mode, or what mode "auto" chose last
    policy: str = Policy.FIXED  # the configured acco policy, or what policy "auto" chose last
    step_quota: int = 0
    """Micro-batches per worker a step commits in sync or acco fixed, or a streaming phase's inner step (0: ``G``);
    ``mode: "auto"`` sets ``G/2`` when it runs one at half the accumulation (where the policy may change the batch;
    acco's rounds then hold ``G/4``)."""

    def state_dict(self) -> dict:
        return {f.name: str(v) if isinstance(v, str) else v for f in fields(self) for v in [getattr(self, f.name)]}

    def load_state_dict(self, saved: dict) -> None:
        """Every field from ``saved``; one an earlier release did not save takes its default (mode, policy: now's).
        Releases before acco at half the accumulation saved the quota as ``sync_quota`` (set in sync only)."""
        now = {"mode": self.mode, "policy": self.policy, "step_quota": saved.get("sync_quota", 0)}
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
