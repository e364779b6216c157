"""Streaming DiLoCo as a phase of a sharded job: where ``mode: "auto"`` goes when no gradient round can hide.

Why a phase and not the streaming front end: a job in ``mode: "auto"`` runs on its front end's ZeRO-1
layout (DeepSpeed's flat groups and fp32 partitions, or the plain front end's), and the user's script
holds that engine. Switching to streaming keeps the engine and changes what a step does:

* the replica ``θ_i`` is the model's own parameters, re-bound into fragment buffers by the
  :class:`~ds_acco.streaming.engine.StreamingEngine`; every rank starts from the committed parameters,
  which are also ``θ_g`` (with ``all_gather_quantization: "int8"``: the parameters the last int8 all-gather
  gave, one quantisation step from the masters, which an exact fp32 all-gather of the model would cost
  seconds on the links where the switch happens);
* the inner optimizer is a full-size twin of the shard optimizer (same class and instance settings,
  param group for param group) whose state starts as the all-gathered shard states: no moment is lost
  (:meth:`StreamingPhase._gather`, behind the first streaming step's compute);
* a step's gradient is this rank's accumulator divided as a round would divide it, clipped by this
  rank's norm, stepped at the learning rate the scheduler gives the shard optimizer;
* ``θ_g`` and the outer momentum are the streaming engine's fragment shards.

The phase is the round engine's schedule from the switch on (ARCHITECTURE.md). The switch is one-way: fragment
rounds say nothing about what a gradient round would cost now, so auto does not choose again (a resume re-enters the
phase from its state).

It costs a full copy of the optimizer state per rank (stage 0's memory): ``acco.auto.streaming`` is off
unless set. The shard state the gradient modes keep (masters and moments) is idle here; :meth:`write_back`
fills it from ``θ_g`` and the ranks' mean inner moments at every checkpoint, so the front end's files hold
one consistent model that loads anywhere (another world size, weights only, stock DeepSpeed), while this
phase's own state (:meth:`state_dict`) resumes the run exactly.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
from collections import defaultdict
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ds_acco.comm.clock import ClockLike
from ds_acco.comm.int8_collectives import ShardAllGather
from ds_acco.config import AccoConfig
from ds_acco.config.names import Kind, Mode
from ds_acco.errors import AccoConfigError
from ds_acco.layout.flat_buffer import rebind_params
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.records import RoundRecord

from .engine import StreamingEngine

FIELD = "acco.auto.streaming"
logger = logging.getLogger("ds_acco")


class StreamingPhase:
    """The streaming half of a job that started on gradient rounds (see the module docstring).

    Args:
        groups: the round engine's sharded groups (fp32, no packing: :meth:`PhaseFactory.check`).
        shard_optimizer: steps the master shards; its class, settings and state seed the inner optimizer.
        fragments: ``P`` lists of the groups' parameters (:func:`ds_acco.streaming.fragments_of`).
        config: the ``"acco"`` block (mode ``auto``); G: micro-batches per worker per inner step (the configured
            accumulation, or half of it where auto priced that batch best); clip: this rank's clip.
        piece_bytes: the piece size the round engine's collectives agreed on (None: unpaced): a fresh group
            starts unpaced, and on a shaped link the state's all-gather then moved at half the link rate.
        rounds: the round engine whose schedule the phase becomes; None: a phase stepped by hand.
    """

    def __init__(self, groups: Sequence[ShardedGroup], shard_optimizer: ShardOptimizer,
                 fragments: Sequence[list[nn.Parameter]], *, config: AccoConfig,
                 process_group: Optional[dist.ProcessGroup], G: int, clip: float, on_stop: Callable[[], None],
                 piece_bytes: Optional[int] = None, clock: ClockLike = None, rounds: Any = None):
        self.groups, self.shard_optimizer, self.G, self.clip = list(groups), shard_optimizer, G, clip
        self.rounds, self.quota = rounds, G
        self._where = {id(p): (gi, j) for gi, g in enumerate(self.groups) for j, p in enumerate(g.params)}
        self._group_of = {id(g.master): g for g in self.groups}
        cfg = config.model_copy(update={"mode": "streaming", "comm_quantization": "none", "estimate_quantization":
                                        "same", "all_gather_quantization": "none"})
        # every rank holds the parameters of the commit just applied: no broadcast
        self.engine = StreamingEngine(None, None, fragments, config=cfg, process_group=process_group, on_stop=on_stop,
                                      broadcast=False, clock=clock)
        self.engine.coll.piece_bytes = piece_bytes  # the round engine's agreed pacing (ds_acco.comm.link_pacing)
        if rounds is not None:  # fragment rounds are this job's rounds, and the schedule counts its steps
            self.engine.telemetry, self.engine.inner_steps = rounds.telemetry, rounds.state.commits
            for frag in self.engine.fragments:
                frag.last_sync = rounds.state.commits  # (a fragment round's record counts the steps since)
        self.rank, self.world_size = self.engine.rank, self.engine.world_size
        self.inner, pending = self._twin(shard_optimizer.optimizer)
        self.engine.inner_optimizer = self.inner
        self.gathered_bytes, self.gather_s, self.waited_s, self.switch_s = 0, 0.0, 0.0, 0.0  # (real time: costs)
        self._pending = self.engine.submit("optimizer state", lambda h: self._gather(pending))

    # ------------------------------------------------------------ the inner optimizer
    def _twin(self, opt: torch.optim.Optimizer) -> tuple:
        """A full-size copy of ``opt``: instance settings kept (DeepSpeed's FusedAdam keeps ``adam_w_mode`` on
        the object, not in its groups), parameters and state replaced. Returns it with the state shards still to
        gather: ``(group, key, this rank's shard)`` each."""
        inner = copy.copy(opt)
        inner.param_groups = [dict({k: v for k, v in pg.items() if k != "params"},
                                   params=[p for m in pg["params"] for p in self._group_of[id(m)].params])
                              for pg in opt.param_groups]
        inner.state = defaultdict(dict)
        pending = []
        for m in [m for pg in opt.param_groups for m in pg["params"]]:
            g, state = self._group_of[id(m)], opt.state.get(m) or {}
            sharded = {key for key, v in state.items() if torch.is_tensor(v) and v.numel() == g.layout.shard_numel}
            for p in g.params:
                inner.state[p] = {key: torch.empty(p.shape, dtype=v.dtype, device=p.device) if key in sharded else
                                  (v.clone() if torch.is_tensor(v) else copy.deepcopy(v)) for key, v in state.items()}
            pending += [(g, key, state[key].detach().reshape(-1)) for key in sorted(sharded)]
        return inner, pending

    def _gather(self, pending: list) -> None:
        """On the communication thread, behind the first inner step's compute: every state shard, whole, written
        into the inner optimizer's state (which nothing reads before :meth:`_ready`).

        Exact in fp32 with ``streaming.all_gather_dtype: "fp32"``; otherwise one byte an element: a tensor
        that is non-negative on every rank (Adam's second moment) on a per-block log scale
        (:func:`~ds_acco.numerics.quantization.quantize_log`), any other (the first moment) as blockwise int8,
        both through :class:`~ds_acco.comm.int8_collectives.ShardAllGather`'s wire rows.
        On the links where auto switches, bf16 moments took 2.2 s against a first step of 1.3 s."""
        t0, coll = time.perf_counter(), self.engine.coll
        sent = coll.wire.sent
        exact = self.engine.config.streaming.all_gather_dtype == "fp32"
        floating = any(s.is_floating_point() for _, _, s in pending)
        if not exact and floating:  # (the same keys on every rank: one optimizer)
            mine = torch.tensor([int(bool((s >= 0).all())) for _, _, s in pending if s.is_floating_point()],
                                dtype=torch.int64, device=self.engine.device)
            non_negative = iter(coll.all_gather_small(mine).all(dim=0).tolist())
        for g, key, shard in pending:  # one at a time: one full fp32 buffer in memory
            full = torch.empty(g.layout.padded_numel, dtype=shard.dtype, device=shard.device)
            if exact or not shard.is_floating_point():
                coll.all_gather(full, shard)
            else:
                ShardAllGather(shard.numel(), self.world_size, "log8" if next(non_negative) else "int8",
                               device=shard.device)(coll, full, shard)
            for p, v in zip(g.params, g.layout.views(full)):
                self.inner.state[p][key].copy_(v)
        self.gather_s, self.gathered_bytes = time.perf_counter() - t0, coll.wire.sent - sent

    def _ready(self) -> None:  # the optimizer state, before anything reads it or uses the group
        if self._pending is None:
            return
        handle, self._pending = self._pending, None
        t0 = time.perf_counter()
        handle.wait()
        self.waited_s = time.perf_counter() - t0
        if self.rank == 0:
            logger.info("ds_acco: the optimizer state arrived (%.1f MB sent by rank 0 in %.2f s, %.2f s of it not "
                        "hidden behind the first streaming step)", self.gathered_bytes / 1e6, self.gather_s,
                        self.waited_s)

    # ------------------------------------------------------------ the round engine's schedule
    def after_micro_batch(self) -> tuple[bool, None]:  # every G micro-batches an inner step
        return (self.rounds.state.n >= self.G and self._step_rounds(self.rounds.state.n)), None

    def _step_rounds(self, count: int) -> bool:  # counted and recorded as a commit would be
        r, s = self.rounds, self.rounds.state
        t0 = r.clock.now()
        scheduler_steps = r.lr_clock.advances(count * r.world_size)
        norm, skipped, lr = self.step(r.grads.active_buffers(), s.active_scale, count, scheduler_steps)
        t1 = r.clock.now()
        s.n = 0
        s.commits += 1
        r.swapped(RoundRecord(index=-1, kind=Kind.COMMIT, mode=Mode.STREAMING, step=s.commits - 1,
                              counts=[count] * r.world_size, compute_s=t0 - r.last_swap_t, waited_s=t1 - t0,
                              grad_norm=norm, skipped=skipped, lr=lr, nominal_step=r.lr_clock.nominal_steps), t1)
        return True

    def wait(self) -> None:
        self.engine.finish()

    def quiesce(self) -> None:
        self.engine.quiesce()

    def committed_buffers(self) -> list[torch.Tensor]:
        return self.global_buffers()  # θ_g (collective in the streaming phase)

    def finish(self) -> None:
        """The end of training in the phase: a step for micro-batches past the last boundary, then every replica
        takes ``θ_g`` (so the module holds the model the run trained), and so do the masters, with the ranks' mean
        moments (what anything reading the front end's optimizer sees: a save, ``zero_to_fp32``, a later export)."""
        if self.rounds.state.n:
            self._step_rounds(self.rounds.state.n)
        self.consolidate()
        self.write_back()

    def exact_parameters(self) -> None:
        self.consolidate()

    # ------------------------------------------------------------ a step
    def step(self, accumulators: Sequence[torch.Tensor], scale: float, count: int, scheduler_steps: int) -> tuple:
        """One inner step on this rank's ``count`` micro-batches (the parameters' ``.grad`` are views of
        ``accumulators``), then the fragment schedule. Returns ``(local gradient norm, skipped, lr)``.

        A non-finite gradient skips this rank's step (and its scheduler steps, as stock DeepSpeed does) but
        not the fragment schedule, which every rank must keep in step."""
        self._ready()
        mean = 1.0 / (scale * count)
        norm = float(torch.nn.utils.get_total_norm(accumulators)) * mean  # of the mean gradient
        skipped = not math.isfinite(norm)
        lr = self.shard_optimizer.lr
        if not skipped:
            # one pass over the gradients: the mean and the clip (torch.nn.utils.clip_grad_norm_'s factor) together
            factor = mean * (self.clip / (norm + 1e-6) if self.clip and norm > self.clip else 1.0)
            torch._foreach_mul_(list(accumulators), factor)
            for mine, shard in zip(self.inner.param_groups, self.shard_optimizer.optimizer.param_groups):
                mine["lr"] = shard["lr"]
            self.inner.step()
            sched = self.shard_optimizer.lr_scheduler
            for _ in range(scheduler_steps if sched is not None else 0):
                sched.step()
        for buf in accumulators:
            buf.zero_()
        self.engine.after_inner_step()
        return norm, skipped, lr

    # ------------------------------------------------------------ the global parameters
    def global_buffers(self) -> list[torch.Tensor]:
        """``θ_g`` in the groups' flat layout (collective; the round in flight is waited for, not merged)."""
        self._ready()
        self.engine.quiesce()
        out = [g.layout.new_buffer(g.flat) for g in self.groups]
        views = [g.layout.views(buf) for g, buf in zip(self.groups, out)]
        for frag in self.engine.fragments:
            full = torch.empty_like(frag.anchor)
            self.engine.coll.all_gather(full, frag.master)
            for p, v in zip(frag.params, frag.layout.views(full)):
                gi, j = self._where[id(p)]
                views[gi][j].copy_(v)
        return out

    def write_back(self) -> None:
        """Masters ``← θ_g`` and the shard optimizer's state ``←`` the ranks' mean inner state (collective):
        what a checkpoint's front-end files then hold."""
        opt = self.shard_optimizer.optimizer
        for g, full in zip(self.groups, self.global_buffers()):
            g.master.detach().copy_(g.layout.shard(full, self.rank))
        for m in [m for pg in opt.param_groups for m in pg["params"]]:
            g, state = self._group_of[id(m)], opt.state.get(m) or {}
            first = self.inner.state.get(g.params[0], {})
            for key, value in list(state.items()):
                if torch.is_tensor(value) and value.numel() == g.layout.shard_numel:
                    full = g.layout.new_buffer(value)
                    for p, v in zip(g.params, g.layout.views(full)):
                        v.copy_(self.inner.state[p][key])
                    self.engine.coll.reduce_scatter_sum(value.view(-1), full)
                    value.div_(self.world_size)
                elif key in first:
                    state[key] = first[key].clone() if torch.is_tensor(first[key]) else copy.deepcopy(first[key])
        for mine, shard in zip(self.inner.param_groups, opt.param_groups):
            if "step" in mine:  # DeepSpeed's FusedAdam counts steps per group
                shard["step"] = mine["step"]

    def consolidate(self) -> None:  # every replica becomes θ_g exactly (collective)
        self._ready()
        self.engine.consolidate()

    def rebind(self) -> None:
        for frag in self.engine.fragments:
            rebind_params(frag.params, frag.layout, frag.flat)

    # ------------------------------------------------------------ checkpoints and the end
    def state_dict(self) -> dict:
        """This rank's replica, inner optimizer and streaming state (waits for a round, merges nothing), after
        :meth:`write_back` (collective): the front end's files then hold ``θ_g`` and the mean inner state."""
        self.write_back()
        self._ready()
        return {"streaming": self.engine.state_dict(), "inner": self.inner.state_dict(),
                "replica": [f.flat.clone() for f in self.engine.fragments]}

    def load_state_dict(self, saved: dict) -> None:
        self._ready()
        self.inner.load_state_dict(saved["inner"])
        with torch.no_grad():
            for frag, replica in zip(self.engine.fragments, saved["replica"]):
                frag.flat.copy_(replica)
        self.engine.load_state_dict(saved["streaming"])

    def leave(self) -> None:
        """End the phase, dropping it: the parameters point at the groups' buffers again, whose values a
        checkpoint load is about to overwrite (the only way out: the switch is one-way)."""
        self._ready()
        self.engine.close(drain=False)
        for g in self.groups:
            g.bind(g.flat)

    def close(self, drain: bool) -> None:
        if drain:
            self._ready()
        self.engine.close(drain=drain)


class PhaseFactory:
    """What a front end hands the round engine as ``streaming_phase``: the fragments, cut before training (a model
    that cannot be cut fails at start-up), and the phase built over them at the switch."""

    def __init__(self, fragments: Sequence[list[nn.Parameter]]):
        self.fragments = [list(f) for f in fragments]

    def check(self, groups: Sequence[ShardedGroup], accum_dtype: torch.dtype) -> None:
        """At start-up: buffers the phase can step, and fragments that cut exactly the parameters being trained."""
        if any(g.packing is not None for g in groups):
            raise AccoConfigError(f"{FIELD}: got true with the FSDP2 front end, whose shards are per-parameter "
                                  "chunks; allowed there: false (DeepSpeed ZeRO-1 and ds_acco.plain.build can switch)")
        dtypes = sorted({str(g.flat.dtype) for g in groups} | {str(accum_dtype)})
        if dtypes != ["torch.float32"]:
            raise AccoConfigError(f"{FIELD}: got true with {'/'.join(dtypes)} parameters or accumulators; the inner "
                                  "optimizer steps the parameters themselves, so it needs fp32 (as mode 'streaming' "
                                  "does): use fp32 parameters (torch_autocast for lower-precision compute) or set "
                                  "it to false")
        trained = {id(p) for g in groups for p in g.params}
        cut = {id(p) for f in self.fragments for p in f}
        if trained != cut:
            raise AccoConfigError(f"{FIELD}: the fragments cut from the model hold {len(cut)} parameters, the "
                                  f"optimizer's groups {len(trained)} ({len(cut & trained)} in both); pass the model "
                                  "whose trainable parameters are the ones being trained, or set it to false")

    def bytes_needed(self, groups: Sequence[ShardedGroup], shard_optimizer: ShardOptimizer) -> int:
        """About what the phase allocates on top of the job: the inner optimizer's state (the shard state's size
        times the world size), the fragment buffers and ``θ_g``'s all-gathered copies (fp32), a round's scratch,
        and while the state arrives one state tensor's fp32 copy and its 8-bit one."""
        opt = shard_optimizer.optimizer
        state = sum(t.numel() * t.element_size() for g in groups for t in (opt.state.get(g.master) or {}).values()
                    if torch.is_tensor(t) and t.numel() > 1)
        numel = sum(g.layout.padded_numel for g in groups)
        largest = max(sum(p.numel() for p in f) for f in self.fragments)
        return state * groups[0].layout.world_size + 8 * numel + 8 * largest + 5 * numel

    def __call__(self, groups, shard_optimizer, **options) -> StreamingPhase:
        return StreamingPhase(groups, shard_optimizer, self.fragments, **options)

    def enter(self, rounds: Any) -> Optional[StreamingPhase]:
        """The phase as ``rounds``' schedule, at a step boundary where every rank holds the committed parameters
        (collective). None where some rank has not the memory for it: a job must not fail mid-run for a switch it
        did not need."""
        need, free = self.bytes_needed(rounds.groups, rounds.shard_optimizer), free_bytes(rounds.device)
        fits = rounds.coll.all_gather_small(torch.tensor([int(free is None or need < 0.8 * free)],
                                                         device=rounds.device))
        if not bool(fits.all()):
            if rounds.rank == 0:
                logger.warning("ds_acco: auto chose streaming, but it needs about %.2f GiB more per rank and some rank "
                               "has not that much free (this one: %s); the job stays in the gradient modes",
                               need / 2**30, "unknown" if free is None else f"{free / 2**30:.2f} GiB")
            return None
        t0 = time.perf_counter()  # what the switch cost: real time, whatever the engine's clock
        G = rounds.state.step_quota or rounds.G  # auto may run streaming's inner steps at half the accumulation
        phase = self(rounds.groups, rounds.shard_optimizer, config=rounds.config, process_group=rounds.coll.group,
                     G=G, clip=rounds.clip, on_stop=rounds.on_stop, piece_bytes=rounds.coll.piece_bytes,
                     clock=rounds.clock, rounds=rounds)
        phase.switch_s = time.perf_counter() - t0
        if rounds.rank == 0:
            logger.info("ds_acco: streaming from step %d on, %d micro-batches an inner step; the switch took %.2f s "
                        "(the optimizer state follows, gathered behind that step's compute)", rounds.state.commits + 1,
                        G, phase.switch_s)
        return phase


def free_bytes(device: torch.device) -> Optional[int]:
    """Memory free on ``device`` (CUDA: the driver's figure; CPU: the kernel's ``MemAvailable``, which counts the
    page cache it can drop, unlike the free pages), None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
