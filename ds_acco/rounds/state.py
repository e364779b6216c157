"""The round engine's own state in a checkpoint: what a resume needs beyond the front end's files.

A front end's checkpoint (DeepSpeed's files, FSDP2's DCP shards) holds the compute
parameters, the master shards and the optimizer; what only the round engine knows
is here: its counters, the accumulator being filled, the kept estimate shard, the
int8 residuals, the learning-rate clock, and a round that finished but was not yet
swapped in (its result, as this rank's shard of the buffer it landed in). Saving
waits for the round in flight without swapping it in, so a checkpoint never
changes the trajectory; loading all-gathers that pending result back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from ds_acco.comm.comm_thread import AccoRoundError, RoundHandle
from ds_acco.config.schema import check_saved_state_fits

ESTIMATE, COMMIT = "estimate", "commit"


@dataclass
class _RoundOutcome:
    counts: list[int]
    round_s: float
    bytes_sent: int
    bytes_received: int
    grad_norm: float
    skipped: bool
    lr: float


@dataclass
class _InFlight:
    handle: RoundHandle
    kind: str
    mode: str
    step: int


class RoundStateMixin:
    """``state_dict`` / ``load_state_dict`` / ``reset_rounds`` of :class:`ds_acco.rounds.engine.RoundEngine`."""

    def state_dict(self) -> dict:
        """This rank's round state: counters, pending result, kept estimate shard, accumulator.

        Holds ``O(params / N)`` tensors, plus the active accumulator when micro-batches
        have been accumulated since the last launch (checkpoint right after a step to
        avoid that). Master shards, optimizer and scheduler state and the compute
        parameters are the front end's to save (DeepSpeed's checkpoint holds them).
        """
        self.quiesce()
        pending = None
        if self._inflight is not None:
            f, outcome = self._inflight, self._inflight.handle.wait()
            pending = {
                "kind": f.kind, "mode": f.mode, "step": f.step, "index": f.handle.index,
                "outcome": vars(outcome).copy(),
                "staging_shards": [g.compute_shard(st, self.rank)
                                   for g, st in zip(self.groups, self._landing.in_flight_targets())],
            }
        return {
            "format": 1,
            "fingerprint": self.config.fingerprint(),
            "world_size": self.world_size,
            "padded_numels": [g.layout.padded_numel for g in self.groups],
            "commits": self.commits,
            "micro_batches": self.micro_batches,
            "round_index": self._round_index,
            "n": self._n,
            "next_kind": self._next_kind,
            "active_scale": self._active_scale,
            "active_grads": [b.clone() for b in self.grads.active_buffers()] if self._n else None,
            "kept": [k.clone() for k in self._kept],
            "kept_count": self._kept_count,
            "kept_nonfinite": self._kept_nonfinite,
            "residuals": [rs.residual.clone() if rs.residual is not None else None for rs in self._int8_rs]
            if self._int8_rs is not None else None,
            "pending": pending,
            "lr_clock": self.lr_clock.state_dict(),
            "compute_committed": self._compute_committed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output on every rank (collective: it all-gathers the pending result).

        Raises:
            AccoConfigError: the state was saved with another mode/policy, world size or layout.
        """
        self._ensure_open()
        if self._inflight is not None:
            raise AccoRoundError("load_state_dict needs an idle engine; a round is in flight")
        check_saved_state_fits(
            state, {"fingerprint": self.config.fingerprint(), "world_size": self.world_size,
                    "padded_numels": [g.layout.padded_numel for g in self.groups]},
            "the ACCO round state", "Resume with the same acco block and world size, or load the model and "
            "optimizer only (a fresh round state bootstraps).")
        self.commits, self.micro_batches = state["commits"], state["micro_batches"]
        self._round_index, self._n, self._next_kind = state["round_index"], state["n"], state["next_kind"]
        self._active_scale = state["active_scale"]
        self.lr_clock.load_state_dict(state.get("lr_clock"), self.commits)  # absent in older checkpoints
        self._compute_committed = state.get("compute_committed", True)
        for buf, saved in zip(self.grads.active_buffers(), state["active_grads"] or []):
            buf.copy_(saved)
        if state["active_grads"] is None:
            for buf in self.grads.active_buffers():
                buf.zero_()
        for kept, saved in zip(self._kept, state["kept"]):
            kept.copy_(saved)
        self._kept_count, self._kept_nonfinite = state["kept_count"], state["kept_nonfinite"]
        saved_residuals = state.get("residuals") or [None] * len(self.groups)  # absent before error feedback was saved
        for rs, saved in zip(self._int8_rs or [], saved_residuals):
            if rs.residual is not None and saved is not None:
                rs.residual.copy_(saved)
            else:
                rs.reset_error_feedback()
        pending = state["pending"]
        if pending is not None:
            for i, (full, part) in enumerate(zip(self._landing.in_flight_targets(), pending["staging_shards"])):
                self.all_gather_compute(i, full, part.to(full.dtype))
            handle = RoundHandle.completed(pending["index"], pending["kind"], self.config.timeout_s,
                                           _RoundOutcome(**pending["outcome"]))
            self._inflight = _InFlight(handle, pending["kind"], pending["mode"], pending["step"])
        self._last_swap_t = time.perf_counter()

    def reset_rounds(self, commits: Optional[int] = None, compute_committed: bool = True) -> None:
        """Drop the round state (after waiting for the round in flight) so rounds bootstrap afresh.

        Used before loading a checkpoint; ``commits`` sets the step counter (warmup counts from it);
        ``compute_committed=False`` when the compute parameters loaded may be an estimate.
        """
        self.quiesce()
        if self._inflight is not None:
            self._landing.zero_in_flight()  # it held the dropped round's parameters
        self._inflight = None
        for buf in self.grads.active_buffers():
            buf.zero_()
        for kept in self._kept:
            kept.zero_()
        self._kept_count, self._kept_nonfinite, self._n = 0, False, 0
        for rs in self._int8_rs or []:
            rs.reset_error_feedback()
        self._next_kind = ESTIMATE if self.config.mode == "acco" else COMMIT
        if commits is not None:
            self.commits = commits
        self.lr_clock.load_state_dict(None, self.commits)
        self._compute_committed = compute_committed
        self._last_swap_t = time.perf_counter()
