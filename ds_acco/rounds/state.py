"""The round engine's own state in a checkpoint: what a resume needs beyond the front end's files.

A front end's checkpoint (DeepSpeed's files, FSDP2's DCP shards) holds the compute
parameters, the master shards and the optimizer; what only the round engine knows is
here: its schedule (:class:`RoundState`), the accumulator being filled, the kept estimate
shard and what an int4 estimate lost, the int8 residuals, the learning-rate clock, and a round that finished but was not
yet swapped in (its result, as this rank's shard of the buffer it landed in). Saving waits
for the round in flight without swapping it in, so a checkpoint never changes the
trajectory; loading all-gathers that pending result back (the engine does that part).

The dict format is stable: checkpoints of earlier releases load (keys added since then have
defaults on load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ds_acco.comm.comm_thread import RoundHandle
from ds_acco.config import check_saved_state_fits
from ds_acco.layout.grad_buffers import GradBuffers
from ds_acco.optim.lr_schedule import LrScheduleClock

from .group_buffers import GroupBuffers
from .round_work import COMMIT, KeptEstimate, RoundOutcome

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
    next_kind: str = COMMIT
    """The kind of the next round: ``estimate`` or ``commit`` (acco alternates them)."""
    active_scale: float = 1.0
    """The gradient scale the active accumulator's micro-batches were computed under."""
    compute_committed: bool = True
    """False while the compute parameters hold an estimate rather than committed parameters."""
    mode: str = "sync"
    """The mode rounds run in: the configured one, or what ``mode: "auto"`` chose last."""
    policy: str = "fixed"
    """The acco policy rounds run under: the configured one, or what ``policy: "auto"`` chose last."""
    sync_quota: int = 0
    """Micro-batches per worker a sync round commits (0: ``G``); ``mode: "auto"`` sets ``G/2`` when it runs sync at
    half the accumulation (where the policy may change the batch)."""


@dataclass
class InFlight:
    """The round on the communication thread, as the training thread knows it."""

    handle: RoundHandle
    kind: str
    mode: str
    step: int


def identity(engine) -> dict:
    """What a saved round state must match to load: the config's fingerprint, the world size, the buffer sizes."""
    return {"fingerprint": engine.config.fingerprint(), "world_size": engine.world_size,
            "padded_numels": [g.layout.padded_numel for g in engine.groups]}


def pending_of(flight: Optional[InFlight], groups: Sequence, targets: Sequence[torch.Tensor],
               rank: int) -> Optional[dict]:
    """The round in flight, finished (the engine quiesced), as a checkpoint entry: its record and this rank's
    shards of the buffers it landed in."""
    if flight is None:
        return None
    return {"kind": flight.kind, "mode": flight.mode, "step": flight.step, "index": flight.handle.index,
            "outcome": dict(vars(flight.handle.wait()), stop=False),  # a SIGTERM stops this job, not the one resuming
            "staging_shards": [g.compute_shard(t, rank) for g, t in zip(groups, targets)]}


def restore_pending(pending: Optional[dict], targets: Sequence[torch.Tensor],
                    all_gather_compute: Callable[[int, torch.Tensor, torch.Tensor], None],
                    timeout_s: float) -> Optional[InFlight]:
    """All-gather a saved pending round's shards back into the buffers it landed in (collective); the round in
    flight it becomes, finished, to be swapped in at its boundary."""
    if pending is None:
        return None
    for i, (full, part) in enumerate(zip(targets, pending["staging_shards"])):
        all_gather_compute(i, full, part.to(full.dtype))
    handle = RoundHandle.completed(pending["index"], pending["kind"], timeout_s,
                                   RoundOutcome(**dict(pending["outcome"], stop=False)))
    return InFlight(handle, pending["kind"], pending["mode"], pending["step"])


def snapshot(state: RoundState, *, identity: dict, round_index: int, grads: GradBuffers,
             buffers: Sequence[GroupBuffers], kept: KeptEstimate, lr_clock: LrScheduleClock,
             pending: Optional[dict]) -> dict:
    """This rank's round state as a checkpoint dict (the engine is at rest: nothing in flight is changing it);
    ``identity`` and ``pending`` are what :func:`identity` and :func:`pending_of` return.

    Holds ``O(params / N)`` tensors, plus the active accumulator when micro-batches have been
    accumulated since the last launch (checkpoint right after a step to avoid that).
    """
    return {
        "format": FORMAT,
        **identity,
        "commits": state.commits,
        "micro_batches": state.micro_batches,
        "round_index": round_index,
        "n": state.n,
        "next_kind": state.next_kind,
        "active_scale": state.active_scale,
        "active_grads": [b.clone() for b in grads.active_buffers()] if state.n else None,
        "kept": [b.kept.clone() for b in buffers if b.kept is not None],
        "kept_count": kept.count,
        "kept_nonfinite": kept.nonfinite,
        "estimate_residuals": [b.est_residual.clone() for b in buffers if b.est_residual is not None]
        if any(b.est_residual is not None and bool(b.est_residual.any()) for b in buffers) else None,
        "residuals": [b.int8_rs.residual.clone() if b.int8_rs.residual is not None else None for b in buffers]
        if buffers[0].int8_rs is not None else None,
        "pending": pending,
        "lr_clock": lr_clock.state_dict(),
        "compute_committed": state.compute_committed,
        "mode": state.mode,
        "policy": state.policy,
        "sync_quota": state.sync_quota,
    }


def restore(saved: dict, *, identity: dict, grads: GradBuffers, buffers: Sequence[GroupBuffers],
            lr_clock: LrScheduleClock, mode: str, policy: str = "fixed",
            block: Optional[dict] = None) -> tuple[RoundState, int, KeptEstimate]:
    """Put a :func:`snapshot` back into the buffers; returns the schedule, the round index and the kept count
    (``mode``/``policy``: what rounds ran in, for a state saved before it was kept). A state saved with another
    mode/policy, world size or layout raises :class:`~ds_acco.errors.AccoConfigError`."""
    check_saved_state_fits(
        saved, identity, "the ACCO round state", "Resume with the same acco block and world size, or load the model "
        "and optimizer only (a fresh round state bootstraps).", block=block)
    state = RoundState(commits=saved["commits"], micro_batches=saved["micro_batches"], n=saved["n"],
                       next_kind=saved["next_kind"], active_scale=saved["active_scale"],
                       compute_committed=saved.get("compute_committed", True),
                       mode=saved.get("mode", mode), policy=saved.get("policy", policy),
                       sync_quota=saved.get("sync_quota", 0))
    lr_clock.load_state_dict(saved.get("lr_clock"), state.commits)  # absent in older checkpoints
    reset_buffers(grads, buffers)  # what the state does not hold starts from zero
    for buf, kept in zip(grads.active_buffers(), saved["active_grads"] or []):
        buf.copy_(kept)
    for b, kept in zip([b for b in buffers if b.kept is not None], saved["kept"]):
        b.kept.copy_(kept)
    lost = saved.get("estimate_residuals") or []  # absent: no int4 estimate pending (or saved before they existed)
    for b, residual in zip([b for b in buffers if b.est_residual is not None], lost):
        b.est_residual.copy_(residual)
    residuals = saved.get("residuals") or []  # absent before error feedback was saved
    for b, residual in zip([b for b in buffers if b.int8_rs is not None], residuals):
        if b.int8_rs.residual is not None and residual is not None:
            b.int8_rs.residual.copy_(residual)
    return state, saved["round_index"], KeptEstimate(saved["kept_count"], saved["kept_nonfinite"])


def reset_buffers(grads: GradBuffers, buffers: Sequence[GroupBuffers]) -> None:
    """Zero what a dropped round state leaves behind: the active accumulator, kept shards, int8 residuals."""
    for buf in grads.active_buffers():
        buf.zero_()
    for b in buffers:
        if b.kept is not None:
            b.kept.zero_()
        if b.est_residual is not None:
            b.est_residual.zero_()
        if b.int8_rs is not None:
            b.int8_rs.reset_error_feedback()
