"""The round engine's side of ``mode: "auto"`` switching a job to streaming (``acco.auto.streaming``).

Why the engine keeps running instead of handing over: the front end (DeepSpeed's engine, the plain
build) and the user's loop hold the round engine; after the switch ``after_micro_batch`` still counts
micro-batches, and every ``G`` of them it steps the phase (:class:`ds_acco.streaming.phase.StreamingPhase`,
built by the factory the front end passed: this layer does not import ``ds_acco.streaming``) and tells the
front end as a commit would (``on_swap``: DeepSpeed's step counters). The switch happens where every rank
holds the committed parameters: after a sync commit, after the commit an acco step ends with, or before a job's
first round (``θ_0``; step 1's gradients are then the first inner step, priced from a probe of the link). It is
one-way: streaming's fragment rounds say nothing about what a gradient round would cost now, so auto
does not choose again (a resume re-enters the phase from its state).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

import torch

from ds_acco.errors import AccoConfigError
from ds_acco.telemetry.records import RoundRecord

from .auto.mode import STREAMING, SYNC
from .round_work import COMMIT

logger = logging.getLogger("ds_acco")


def check(cfg, groups, accum_dtype, factory) -> None:
    """At start-up: ``acco.auto.streaming`` needs a front end that can build the phase, and buffers it can step."""
    if not (cfg.mode == "auto" and cfg.auto.streaming):
        return
    if factory is None:
        raise AccoConfigError("acco.auto.streaming: got true, but this front end cannot switch to streaming (it "
                              "needs the model to cut fragments: DeepSpeed ZeRO-1, or ds_acco.plain.build with "
                              "model=); allowed here: false")
    factory.check(groups, accum_dtype)


def enter(engine) -> bool:
    """Build the phase at a step boundary where every rank holds the committed parameters (collective).

    Where some rank has not the memory for it (the inner optimizer's full state and the fragment buffers, with
    room to spare), every rank stays in the gradient modes instead, with a WARNING, and auto does not offer
    streaming again: a job must not fail mid-run for a switch it did not need. Returns whether it switched."""
    need, free = engine.streaming_factory.bytes_needed(engine.groups, engine.shard_optimizer), free_bytes(engine.device)
    fits = engine.coll.all_gather_small(torch.tensor([int(free is None or need < 0.8 * free)], device=engine.device))
    if not bool(fits.all()):
        if engine.rank == 0:
            logger.warning("ds_acco: auto chose streaming, but it needs about %.2f GiB more per rank and some rank "
                           "has not that much free (this one: %s); the job stays in the gradient modes",
                           need / 2**30, "unknown" if free is None else f"{free / 2**30:.2f} GiB")
        engine.auto.streaming_refused = True
        engine.auto.timer.enter(SYNC)
        engine.state.mode = SYNC
        return False
    t0 = time.perf_counter()  # what the switch cost: real time, whatever the engine's clock
    phase = engine.streaming_factory(engine.groups, engine.shard_optimizer, config=engine.config,
                                     process_group=engine.coll.group, G=engine.G, clip=engine.clip,
                                     on_stop=engine._on_stop, piece_bytes=engine.coll.piece_bytes, clock=engine.clock)
    phase.engine.telemetry = engine.telemetry  # fragment rounds are this job's rounds
    phase.engine.inner_steps = engine.state.commits  # the fragment schedule counts the job's steps
    for frag in phase.engine.fragments:
        frag.last_sync = engine.state.commits  # (a fragment round's record counts the steps since)
    engine.phase = phase
    engine.state.mode = STREAMING
    took = time.perf_counter() - t0
    if engine.auto.choices:
        engine.auto.choices[-1]["switch_s"] = took
    if engine.rank == 0:
        logger.info("ds_acco: streaming from step %d on; the switch took %.2f s (the optimizer state follows, "
                    "gathered behind that step's compute)", engine.state.commits + 1, took)
    return True


def free_bytes(device: torch.device):
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


def probe_if_due(engine) -> None:
    """After a fresh job's first micro-batch, in auto with streaming: the link probe goes to the communication
    thread, behind the rest of step 1's compute (:meth:`ds_acco.comm.collectives.RoundCollectives.probe_link`)."""
    auto, s = engine.auto, engine.state
    if auto is not None and s.commits == 0 and s.micro_batches == 1 and engine.phase is None and auto.look_first():
        auto.probe = engine._submit("link probe", lambda handle: engine.coll.probe_link())


def wait_probe(engine) -> Optional[float]:
    """The link probe's rate, once it is over (None where none ran); training-thread collectives come after it."""
    auto = engine.auto
    if auto is None or auto.probe is None:
        return None
    handle, auto.probe = auto.probe, None
    return handle.wait()


def look_before_first_round(engine) -> bool:
    """At the end of step 1, before its round: every rank's figures from the probe in one tiny all-gather, and a
    choice that may start streaming (and nothing else, as any look inside the warm-up). Streaming's first inner
    step is then step 1's accumulated gradients, so the job never sends a gradient round the link cannot hide:
    at 25 Mbit/s the look after step 1 paid a sync step of 2.7 s where a streaming step takes 1.3 s. Returns
    whether the job switched (and stepped)."""
    auto = engine.auto
    if auto is None or auto.probe is None:
        return False
    figures = auto.gathered(engine._submit, engine.coll, engine.device, auto.first_figures(wait_probe(engine)))
    if auto.decide(figures, engine.state, 0) != STREAMING or not enter(engine):
        return False
    return step(engine, engine.state.n)


def enter_if_chosen(engine) -> None:
    """After a choice: enter the phase when auto chose streaming (or stay in sync where it does not fit)."""
    if engine.state.mode == STREAMING and engine.phase is None:
        enter(engine)


def step(engine, count: int) -> bool:
    s = engine.state
    t0 = engine.clock.now()
    scheduler_steps = engine.lr_clock.advances(count * engine.world_size)
    norm, skipped, lr = engine.phase.step(engine.grads.active_buffers(), s.active_scale, count, scheduler_steps)
    t1 = engine.clock.now()
    s.n = 0
    s.commits += 1
    record = RoundRecord(index=-1, kind=COMMIT, mode=STREAMING, step=s.commits - 1, counts=[count] * engine.world_size,
                         compute_s=t0 - engine._last_swap_t, waited_s=t1 - t0, grad_norm=norm, skipped=skipped, lr=lr,
                         nominal_step=engine.lr_clock.nominal_steps)
    engine._last_swap_t = t1
    if engine._on_swap is not None:
        engine._on_swap(record)  # the front end's step counters; telemetry keeps the fragment rounds
    return True


def finish(engine) -> None:
    """The end of training in the phase: a step for micro-batches past the last boundary, then every replica
    takes ``θ_g`` (so the module holds the model the run trained), and so do the masters, with the ranks' mean
    moments (what anything reading the front end's optimizer sees: a save, ``zero_to_fp32``, a later export)."""
    if engine.state.n:
        step(engine, engine.state.n)
    engine.phase.consolidate()
    engine.phase.write_back()


def load(engine, saved: dict) -> None:
    """Match the phase to a loaded round state: enter it (and restore its state) or leave it."""
    phase_state = saved.get(STREAMING)
    if phase_state is None:
        if engine.phase is not None:
            leave(engine)
        return
    if engine.phase is None:
        if engine.streaming_factory is None:
            raise AccoConfigError("acco.auto.streaming: the checkpoint was saved in a streaming phase, which this "
                                  "job cannot run (set acco.auto.streaming to true, on DeepSpeed ZeRO-1 or "
                                  "ds_acco.plain.build with model=)")
        if not enter(engine):
            raise AccoConfigError("acco.auto.streaming: the checkpoint was saved in a streaming phase, for which some "
                                  "rank has not the memory now; resume with acco.auto.streaming false to go on from "
                                  "the global model its files hold")
    engine.phase.load_state_dict(phase_state)


def leave(engine) -> None:
    """Drop the phase (before a checkpoint load overwrites the buffers): parameters back on the groups."""
    engine.phase.leave()
    engine.phase = None
