"""Streaming DiLoCo: local inner steps, one fragment of the model synchronised at a time.

The rules are in ``docs/algorithms.md`` (section streaming). Every rank keeps a full replica ``θ_i`` of the model and
its own inner optimizer. The global parameters ``θ_g`` and the outer Nesterov-SGD momentum are sharded ZeRO-1 style:
rank ``r`` owns slice ``r`` of every fragment's flat buffer in fp32 (the *master shard*). The training loop calls
:meth:`StreamingEngine.after_inner_step` after every inner optimizer step, and :meth:`~StreamingEngine.finish` at the
end (:func:`ds_acco.streaming.build`).

Buffers of fragment ``p`` (flat space as in :mod:`ds_acco.layout.flat_buffer`):

* ``flat``: ``θ_i,p``, the compute parameters (views), compute dtype.
* ``anchor``: ``θ̂_g,p``, the global fragment as every rank last received it from the all-gather (fp32; equals ``θ_g,p``
  when the all-gather is fp32, its bf16 or int8 rounding otherwise).
* ``master``: this rank's fp32 slice of ``θ_g,p``, stepped by the outer optimizer.

[Note: one round of fragment p, launched at inner step s]
::

    training | inner steps s+1 .. s+tau (θ_i,p keeps training)              |merge|
    comm     | RS(int8(anchor − flat)) / N -> outer step -> AG(master) -> anchor |

The training thread computes ``d = anchor − flat`` at launch (the snapshot of ``θ_i,p`` that the pseudo-gradient uses),
then the round runs on the communication thread (:class:`~ds_acco.comm.engine_lifecycle.EngineLifecycle`). Each owner
turns the mean of ``d`` into the exact pseudo-gradient of its slice by adding ``master − anchor`` (zero with an fp32
all-gather; the bf16/int8 rounding of the previous all-gather otherwise), so ``θ_g`` never accumulates all-gather
rounding. ``tau`` inner steps after the launch (at once when ``tau = 0``) the training thread waits for the round and
merges ``θ_i,p ← α θ_i,p + (1 − α) anchor``. ``tau < H / P`` (checked by the config) keeps at most one round in flight,
so the delta scratch is shared by all fragments.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import nn

from ds_acco.comm.clock import ClockLike
from ds_acco.comm.comm_thread import RoundHandle
from ds_acco.comm.engine_lifecycle import EngineLifecycle
from ds_acco.comm.stop_signal import STOP
from ds_acco.comm.int8_collectives import Int8ReduceScatter, ShardAllGather
from ds_acco.config import AccoConfig, check_saved_state_fits, parse_acco_config
from ds_acco.config.compare import carry_on_changes
from ds_acco.config.names import Mode
from ds_acco.errors import AccoConfigError
from ds_acco.layout.flat_buffer import FlatLayout, flatten_into
from ds_acco.telemetry.records import RoundRecord

from .reshard import load_resharded
from .schedule import sync_fragment, sync_offset

logger = logging.getLogger("ds_acco")

FRAGMENT_LAYOUT = ("acco.streaming.fragments", "acco.streaming.fragment_modules")
"""Fields that cut the model into other fragments: a saved streaming state does not fit another cut. Every
other field (schedule, merge weight, outer hyper-parameters, quantisation) carries on at a resume."""


@dataclass
class FragmentRecord(RoundRecord):
    """A streaming round: ``step`` is the inner step it launched at."""

    fragment: int = -1
    """Index of the fragment synchronised."""
    applied_step: int = -1
    """Inner step at which ``θ_i`` was merged with the result (``step + tau``, or the drain)."""


class _Fragment:
    """Buffers and outer optimizer of one fragment (see the module docstring)."""

    def __init__(self, index: int, params: list[nn.Parameter], offset: int, world_size: int,
                 config: AccoConfig, device: torch.device):
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"fragment {index} mixes parameter dtypes {sorted(map(str, dtypes))}; use one dtype")
        s = config.streaming
        self.index, self.params, self.offset = index, params, offset
        self.layout = FlatLayout.for_params(params, world_size)
        self.flat = self.layout.new_buffer(params[0])
        flatten_into(params, self.layout, self.flat)
        self.anchor = torch.zeros(self.layout.padded_numel, dtype=torch.float32, device=device)
        self.master = torch.zeros(self.layout.shard_numel, dtype=torch.float32, device=device)
        self.outer = torch.optim.SGD([self.master], lr=s.outer_lr, momentum=s.outer_momentum,
                                     nesterov=s.outer_momentum > 0)
        block = config.quantization_block_size
        self.rs = (Int8ReduceScatter(self.layout.padded_numel, world_size, block_size=block,
                                     error_feedback=config.error_feedback, device=device)
                   if s.quantize == "int8" else None)
        self.ag = ShardAllGather(self.layout.shard_numel, world_size, s.all_gather_dtype, block_size=block,
                                 device=device)
        self.last_sync = 0


@dataclass
class _Outcome:
    round_s: float
    bytes_sent: int
    bytes_received: int
    stop: bool = False
    """Some rank was sent SIGTERM before this round: every rank stops at its merge."""


@dataclass
class _InFlight:
    handle: RoundHandle
    fragment: _Fragment
    step: int
    due: int


class StreamingEngine(EngineLifecycle):
    """Runs Streaming DiLoCo fragment rounds for one model replica per rank.

    Args:
        model: this rank's replica; its fragment parameters become views of flat buffers.
        inner_optimizer: steps the replica (built over the model's parameters); may be None at construction and set
            afterwards, as :func:`build` does, because the engine re-points the parameters at flat buffers first.
        fragments: ``P`` lists of parameters, as :mod:`ds_acco.layout.fragments` makes them.
        broadcast: start every replica from rank 0's weights (False: the caller knows they are equal, as at auto's
            switch, where a broadcast would send the whole model over the link for nothing).
        clock: what rounds are stamped with (:mod:`ds_acco.comm.clock`; default ``time.perf_counter``).
    """

    def __init__(
        self,
        model: nn.Module,
        inner_optimizer: Optional[torch.optim.Optimizer],
        fragments: Sequence[list[nn.Parameter]],
        *,
        config: Union[AccoConfig, dict],
        process_group: Optional[dist.ProcessGroup] = None,
        on_stop: Optional[Callable[[], None]] = None,
        broadcast: bool = True,
        clock: ClockLike = None,
    ):
        config = streaming_config(config)
        s = config.streaming
        if len(fragments) != s.fragments:
            raise AccoConfigError(f"acco.streaming.fragments: got {s.fragments}, but {len(fragments)} fragments "
                                  "were built")
        first = next(p for frag in fragments for p in frag)
        super().__init__(config, process_group, first.device, "ds_acco-streaming", on_stop, clock)
        self.model, self.inner_optimizer = model, inner_optimizer
        self.H, self.P, self.tau, self.alpha = s.sync_every, s.fragments, s.overlap_steps, s.alpha
        self.fragments = [
            _Fragment(i, list(ps), sync_offset(i, self.P, self.H), self.world_size, self.config, self.device)
            for i, ps in enumerate(fragments)
        ]
        self._by_offset = {f.offset: f for f in self.fragments}
        self._agree_with_peers((self.config.fingerprint(), [f.layout.padded_numel for f in self.fragments]),
                               "acco config or fragment layout (fingerprint, sizes)")
        self._start_from_rank0(broadcast)
        self._delta = torch.empty(max(f.layout.padded_numel for f in self.fragments), dtype=torch.float32,
                                  device=self.device)
        self._shard = torch.empty(max(f.layout.shard_numel for f in self.fragments), dtype=torch.float32,
                                  device=self.device)
        self.peak_round_bytes = 0
        self.inner_steps = 0
        self._start_thread()

    def startup_fields(self) -> dict:
        s = self.config.streaming
        return {
            "mode": "streaming", "world_size": self.world_size, "fragments": s.fragments,
            "sync_every": s.sync_every, "overlap_steps": s.overlap_steps, "alpha": s.alpha,
            "pseudo_gradient_reduce_scatter": s.quantize, "global_all_gather": s.all_gather_dtype,
        }

    def _start_from_rank0(self, broadcast: bool = True) -> None:
        """Every replica and the global fragments start from rank 0's current weights."""
        src = dist.get_process_group_ranks(self.coll.group)[0]
        for frag in self.fragments:
            if broadcast:
                dist.broadcast(frag.flat, src=src, group=self.coll.group)
            frag.anchor.copy_(frag.flat)  # θ_g,p = θ̂_g,p = θ_i,p
            frag.master.copy_(frag.layout.shard(frag.anchor, self.rank))

    # ------------------------------------------------------------ training side
    def fragment_at(self, step: int) -> Optional[int]:
        """The fragment that synchronises at inner step ``step`` (1-based), or None."""
        return sync_fragment(step, self.P, self.H)

    def after_inner_step(self) -> bool:
        """Count one inner optimizer step; merge a round that is due, launch one that is. True when a merge
        changed ``θ_i`` during this call."""
        self._ensure_open()
        self.inner_steps += 1
        step, merged = self.inner_steps, False
        flight = self._inflight
        if flight is not None and (step >= flight.due or flight.handle.failed()):
            self._complete()
            merged = True
        frag = self._by_offset.get(step % self.H)
        if frag is not None:
            if self._inflight is not None:  # a round restored under another schedule may still be due: one in flight
                self._complete()
            self._launch(frag, step)
            if self.tau == 0:
                self._complete()
                merged = True
        self._stop_if_agreed()  # every rank learned of a SIGTERM in the same round: hand over
        return merged

    def _launch(self, frag: _Fragment, step: int) -> None:
        delta, shard = self._delta[: frag.layout.padded_numel], self._shard[: frag.layout.shard_numel]
        torch.sub(frag.anchor, frag.flat, out=delta)  # θ̂_g − θ_i at launch, snapshot for the round
        handle = self.submit(f"fragment {frag.index}", lambda h: self._run_round(h, frag, delta, shard))
        self._inflight = _InFlight(handle, frag, step, step + self.tau)

    def _complete(self) -> None:
        flight, self._inflight = self._inflight, None
        t0 = self.clock.now()
        outcome: _Outcome = flight.handle.wait()
        t1 = self.clock.now()
        frag = flight.fragment
        frag.flat.mul_(self.alpha).add_(frag.anchor, alpha=1.0 - self.alpha)  # θ_i ← α θ_i + (1 − α) θ_g
        record = FragmentRecord(
            index=flight.handle.index, kind="fragment", mode="streaming", step=flight.step,
            counts=[flight.step - frag.last_sync] * self.world_size,
            compute_s=t0 - flight.handle.launched_at, round_s=outcome.round_s, waited_s=t1 - t0,
            bytes_sent=outcome.bytes_sent, bytes_received=outcome.bytes_received,
            lr=self.config.streaming.outer_lr, fragment=frag.index, applied_step=self.inner_steps,
        )
        frag.last_sync = flight.step
        self.peak_round_bytes = max(self.peak_round_bytes, outcome.bytes_sent)
        self.stop_agreed = self.stop_agreed or outcome.stop
        if self.config.telemetry.enabled:
            self.telemetry.add(record)
        every = self.config.telemetry.log_every
        if every and self.rank == 0 and record.index % every == 0:
            logger.info(self.telemetry.format_line(record) + f" fragment {frag.index}")

    # ------------------------------------------------------------ comm side
    def _run_round(self, handle: RoundHandle, frag: _Fragment, delta: torch.Tensor, shard: torch.Tensor) -> _Outcome:
        start = handle.clock.now()
        sent0, recv0 = self.coll.wire.sent, self.coll.wire.received
        # every rank's SIGTERM flag (a SIGTERM on any rank stops every rank at this round's merge) and pacing
        # vote: on a shaped link unpaced fragment rounds ran at 12-19 Mbit/s of 25 (ds_acco.comm.link_pacing)
        handle.enter_stage("stop flag and pacing")
        flags = self.coll.all_gather_small(torch.tensor([int(self.config.preemption.enabled and STOP.requested),
                                                         self.coll.pacing_vote()], device=self.device))
        stop = bool(flags[:, 0].any())
        self.coll.adopt_pacing(flags[:, 1].tolist())
        handle.enter_stage("reduce-scatter")
        if frag.rs is not None:
            frag.rs(self.coll, shard, delta)
        else:
            self.coll.reduce_scatter_sum(shard, delta)
        shard.div_(self.world_size)
        # mean(θ̂_g − θ_i) + (θ_g − θ̂_g) = θ_g − mean(θ_i): the exact pseudo-gradient of this slice
        # (computed as one difference first: with an fp32 all-gather it is exactly 0, so the mean is kept bit for bit)
        shard.add_(frag.master - frag.layout.shard(frag.anchor, self.rank))
        handle.enter_stage("outer step")
        frag.master.grad = shard
        frag.outer.step()
        frag.master.grad = None
        handle.enter_stage("all-gather")
        frag.ag(self.coll, frag.anchor, frag.master)
        handle.enter_stage("done")
        return _Outcome(handle.clock.now() - start, self.coll.wire.sent - sent0, self.coll.wire.received - recv0, stop)

    def consolidate(self) -> None:
        """Make every replica the global parameters ``θ_g``, exactly (fp32 all-gather of the master shards).

        The model Streaming DiLoCo trains is ``θ_g``; the replicas only approach it between syncs. Call this (on every
        rank) before exporting or evaluating "the" model. The round in flight is merged first. Training may continue
        afterwards: it is a merge with ``alpha = 0`` of every fragment at once.
        """
        self.finish()
        for frag in self.fragments:
            self.coll.all_gather(frag.anchor, frag.master)  # fp32: θ̂_g = θ_g, so the next correction is 0
            frag.flat.copy_(frag.anchor)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """This rank's streaming state: global fragments, outer momentum, residuals, schedule.

        A round in flight is waited for, not merged (as in :meth:`quiesce`). The replica ``θ_i`` and the
        inner optimizer are the front end's to save (they differ on every rank).
        """
        self._ensure_open()
        flight, pending = self._inflight, None
        if flight is not None:
            pending = {"fragment": flight.fragment.index, "step": flight.step, "due": flight.due,
                       "index": flight.handle.index, "outcome": dict(vars(flight.handle.wait()), stop=False)}
        return {
            "format": 1,
            "fingerprint": self.config.fingerprint(),
            "block": self.config.compared_fields(),
            "world_size": self.world_size,
            "padded_numels": [f.layout.padded_numel for f in self.fragments],
            "numels": [f.layout.numel for f in self.fragments],
            "inner_steps": self.inner_steps,
            "round_index": self._round_index,
            "peak_round_bytes": self.peak_round_bytes,
            "fragments": [
                {"anchor": f.anchor.clone(), "master": f.master.clone(), "outer": f.outer.state_dict(),
                 "residual": None if f.rs is None or f.rs.residual is None else f.rs.residual.clone(),
                 "last_sync": f.last_sync}
                for f in self.fragments
            ],
            "pending": pending,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output saved by this rank with the same world size and fragments (other
        ``acco`` fields may change: the state carries on under the new block)."""
        self._ensure_idle("load_state_dict needs an idle streaming engine; a round is in flight")
        identity = {"fingerprint": self.config.fingerprint(), "world_size": self.world_size,
                    "padded_numels": [f.layout.padded_numel for f in self.fragments]}
        changed = carry_on_changes(state, identity, self.config.compared_fields(), fixed=FRAGMENT_LAYOUT)
        if not changed:
            check_saved_state_fits(
                state, identity, "the streaming state", "Resume with the same acco block and model (another "
                f"world size: load_resharded; {', '.join(FRAGMENT_LAYOUT)} cannot change at a resume).",
                block=self.config.compared_fields())
        elif self.rank == 0:
            logger.warning("ds_acco: resuming under a changed acco block (%s): the streaming state carries on "
                           "(global fragments, outer momentum, schedule position, a round in flight); the int8 "
                           "error-feedback residuals were reset", "; ".join(changed))
        for frag, saved in zip(self.fragments, state["fragments"]):
            frag.anchor.copy_(saved["anchor"])
            frag.master.copy_(saved["master"])
            frag.outer.load_state_dict(saved["outer"])
            for group in frag.outer.param_groups:  # the outer hyper-parameters are this block's
                group.update(lr=self.config.streaming.outer_lr, momentum=self.config.streaming.outer_momentum)
            frag.last_sync = saved["last_sync"]
            if frag.rs is not None and frag.rs.residual is not None:
                if saved["residual"] is None or changed:
                    frag.rs.reset_error_feedback()
                else:
                    frag.rs.residual.copy_(saved["residual"])
        self.inner_steps, self._round_index = state["inner_steps"], state["round_index"]
        self.peak_round_bytes = state["peak_round_bytes"]
        pending = state["pending"]
        if pending is not None:
            handle = RoundHandle.completed(pending["index"], f"fragment {pending['fragment']}", self.config.timeout_s,
                                           _Outcome(**pending["outcome"]))
            self._inflight = _InFlight(handle, self.fragments[pending["fragment"]], pending["step"], pending["due"])

    def load_resharded(self, saved: Sequence[dict]) -> None:
        """Restore the streaming state of a job with another number of ranks.

        ``saved`` holds :meth:`state_dict` of *every* rank of that job, in rank order
        (see :mod:`ds_acco.streaming.reshard`). Load the replica first.
        """
        self._ensure_idle("load_resharded needs an idle streaming engine; a round is in flight")
        self.inner_steps, self._round_index = load_resharded(
            self.fragments, saved, fingerprint=self.config.fingerprint(), rank=self.rank, alpha=self.alpha,
            device=self.device)

    def reset(self, inner_steps: int) -> None:
        """Start the global state afresh from the current replica (a checkpoint without streaming state)."""
        self.finish()
        self._start_from_rank0()
        for frag in self.fragments:
            frag.outer.state.clear()
            frag.last_sync = inner_steps
            if frag.rs is not None:
                frag.rs.reset_error_feedback()
        self.inner_steps = inner_steps

    # ------------------------------------------------------------ lifecycle
    def summary(self) -> dict:
        """Telemetry summary plus ``peak_round_bytes`` (the largest round's bytes sent)."""
        return dict(self.telemetry.summary(), peak_round_bytes=self.peak_round_bytes, inner_steps=self.inner_steps)

    def finish(self) -> None:
        """Wait for the round in flight and merge it now (drain)."""
        self._ensure_open()
        if self._inflight is not None:
            self._complete()

    _drain = _complete


def streaming_config(config: Union[AccoConfig, dict]) -> AccoConfig:
    """The validated block, refused unless its mode is ``streaming``."""
    cfg = parse_acco_config(config)
    if cfg.mode != Mode.STREAMING:
        raise AccoConfigError(
            f"acco.mode: got {cfg.mode!r}; ds_acco.streaming.build needs mode 'streaming' "
            "(sync/dpu/acco run through ds_acco.plain.build)"
        )
    return cfg
