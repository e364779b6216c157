"""What every engine that runs rounds on a background thread shares: its life from start to close.

The round engine (sync, dpu, acco) and the streaming engine differ in what a round computes and when it launches, not in
how they live: each runs its collectives on a process group of its own (created with ``acco.timeout_s``, so a collective
on a dead peer fails in that time and never interleaves with the training thread's), first checks that every rank was
started the same way (a mismatch fails at start-up with every rank's values, not as a hang), records each round in
telemetry, keeps at most one round in flight on one communication thread, and closes in one order: the round in flight
drained (or abandoned), the thread joined, the groups it created destroyed. A script may end with a round in flight on
every rank (it always does in acco): an ``atexit`` hook drains it before the interpreter tears the process group down
under the thread.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ds_acco.config import AccoConfig
from ds_acco.errors import AccoPreempted, AccoRoundError
from ds_acco.telemetry.log_lines import announce, ensure_log_output
from ds_acco.telemetry.records import Telemetry

from .clock import ClockLike, as_clock
from .collectives import RoundCollectives
from .comm_thread import CommThread, RoundHandle, record_ready
from .stop_signal import STOP

logger = logging.getLogger("ds_acco")


class EngineLifecycle:
    """Process group, peer check, telemetry, communication thread, round in flight, drain at exit, close.

    Subclasses call :meth:`_start_thread` once their buffers exist, launch rounds with :meth:`submit`, keep what they
    need about the round in flight in ``_inflight`` (any object with a ``handle``), and implement :meth:`_drain` (wait
    for it and apply it), :meth:`_release` (anything else they hold) and :meth:`startup_fields`.

    Args:
        process_group: the data-parallel group (None: WORLD); rounds run on a private copy.
        device: where the round's tensors live (picks the CUDA stream or none).
        on_stop: called on the training thread after the swap or merge of the round in which every rank learned of a
            SIGTERM (:mod:`ds_acco.comm.stop_signal`): front ends save and exit there. None: :meth:`preempt`.
        clock: what rounds and swaps are stamped with (:mod:`ds_acco.comm.clock`; default ``time.perf_counter``).
    """

    def __init__(self, config: AccoConfig, process_group: Optional[dist.ProcessGroup], device: torch.device,
                 thread_name: str, on_stop: Optional[Callable[[], None]], clock: ClockLike = None):
        self.config, self.device, self._thread_name = config, device, thread_name
        self.clock = as_clock(clock)
        self._closed = False
        self._comm: Optional[CommThread] = None
        self._inflight: Any = None
        self._round_index = 0
        self.stop_agreed, self._stopping = False, False  # a SIGTERM reached every rank / handed over
        self.on_stop: Callable[[], None] = on_stop or self.preempt
        """What runs where every rank learned of a SIGTERM (the front end's save and exit, or :meth:`preempt`)."""
        self.coll = RoundCollectives(process_group, config.timeout_s)
        self.rank, self.world_size = self.coll.rank, self.coll.world_size
        tcfg = config.telemetry
        path = f"{tcfg.jsonl_path}.rank{self.rank}" if tcfg.jsonl_path else None
        self.telemetry = Telemetry(keep_last=tcfg.keep_last, jsonl_path=path)
        if tcfg.log_every and self.rank == 0:
            ensure_log_output()

    # ------------------------------------------------------------ start
    def _agree_with_peers(self, mine: object, what: str) -> None:
        """:meth:`RoundCollectives.check_peers_agree`, naming the ``acco`` fields that differ."""
        self.coll.check_peers_agree(mine, what, named=self.config.compared_fields())

    def _start_thread(self) -> None:
        if self.config.preemption.enabled:
            STOP.install()  # SIGTERM: stop every rank at a round boundary (ds_acco.comm.stop_signal)
        self._comm = CommThread(self.device, name=self._thread_name)
        EXIT_ORDER.add(self)  # closed, with a drain, at interpreter exit (see _ExitOrder)

    # ------------------------------------------------------------ preemption
    def _stop_if_agreed(self) -> None:
        """At the boundary where every rank learned of a SIGTERM, hand over to the front end (once)."""
        if self.stop_agreed and not self._stopping:
            self._stopping = True
            self.on_stop()

    def preempt(self) -> None:
        """Stop after a SIGTERM without saving: the ranks agree on the rounds launched (:meth:`quiesce`), then every
        rank raises :class:`~ds_acco.errors.AccoPreempted` (exit status ``acco.preemption.exit_code``)."""
        self.quiesce()
        raise AccoPreempted(self.config.preemption.exit_code)

    def quiesce(self) -> None:
        """Wait for the round in flight to end without applying it (it stays due where it was: the trajectory is
        unchanged)."""
        if self._inflight is not None:
            self._inflight.handle.wait()

    def startup_fields(self) -> dict:
        """What this engine runs, for the start-up line (mode, sizes, wire formats)."""
        raise NotImplementedError

    def announce(self, front_end: str) -> None:
        """Log ``ds_acco: ACCO on (<front end>): ...`` once, on rank 0."""
        announce(front_end, self.rank, self.startup_fields())

    # ------------------------------------------------------------ rounds
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    def _ensure_open(self) -> None:
        if self._closed:
            raise AccoRoundError(f"this ds_acco {type(self).__name__} is closed")

    def _ensure_idle(self, message: str) -> None:
        self._ensure_open()
        if self._inflight is not None:
            raise AccoRoundError(message)

    def submit(self, kind: str, run: Callable[[RoundHandle], Any]) -> RoundHandle:
        """Queue ``run`` as the next round on the communication thread; returns its handle."""
        handle = RoundHandle(self._round_index, kind, self.config.timeout_s, self.clock)
        self._round_index += 1
        self._comm.submit(handle, run, record_ready(self.device))
        return handle

    def _drain(self) -> None:
        """Wait for the round in flight and apply it (the subclass's swap or merge)."""
        raise NotImplementedError

    # ------------------------------------------------------------ close
    def _release(self) -> None:
        """Release what the subclass holds beyond the round group (hooks, extra groups)."""

    def close(self, drain: bool = True) -> None:
        """Drain (or abandon) the round in flight, join the thread, destroy the groups (idempotent)."""
        if self._closed:
            return
        try:
            if drain and self._inflight is not None:
                self._drain()
        finally:
            self._closed = True
            self._inflight = None
            if self._comm is not None:
                self._comm.close(timeout_s=5.0)
            self._release()
            self.coll.destroy()

    def __del__(self):  # pragma: no cover - best effort at garbage collection
        try:
            if not self._closed and self._comm is not None:
                self._comm.close(timeout_s=0.1)
        except Exception:
            pass


class _ExitOrder:
    """Every live engine, and whether ds_acco owns the default process group: torn down at interpreter exit.

    [Note: the order at exit]
    A process whose gloo process groups are still alive when the interpreter finalizes can abort (SIGABRT, "terminate
    called without an active exception"): gloo's worker threads may still hold work objects with tensors, and destroying
    those takes the GIL of an interpreter being torn down. torch leaves destroying groups to the program
    (pytorch/pytorch#190489; an atexit fix in torch, pytorch/pytorch#179291, was abandoned), and a training script often
    ends without it: HF Trainer scripts and most DeepSpeed scripts do. Measured here: a 5-rank gloo job that leaves an
    all-reduce in flight and exits aborted in 9 of 15 runs, in 0 of 15 with the groups destroyed first. So, while the
    interpreter is still whole, ds_acco closes every live engine (the round in flight drained, the communication thread
    joined, the groups the engine created destroyed), newest first, and then destroys the default group when ds_acco
    owns it: ``ds_acco.run`` ran the script, or the group was created inside a ds_acco call. A script that creates the
    default group itself owns it, and should call ``torch.distributed.destroy_process_group()`` before it ends, as
    torch's documentation asks. The hook is registered with the first engine (or front end: :meth:`arm`), so the
    ``atexit`` hooks a script registers after building its engines (a last save, say) still find them open. Last it runs
    the cycle collector: FSDP2 modules and DeepSpeed engines sit in reference cycles that hold process groups and
    finished collectives' work objects, which would otherwise be freed only during finalization, the state the abort
    above needs (seen once in a stock FSDP2 run that had destroyed its groups itself).
    """

    def __init__(self) -> None:
        self.engines: "weakref.WeakValueDictionary[int, EngineLifecycle]" = weakref.WeakValueDictionary()
        self.owns_default_group = False
        self._serial = 0
        self._armed = False

    def arm(self) -> None:
        """Register the exit hook (once); front ends call it even when they run no engine (stock mode)."""
        if not self._armed:
            self._armed = True
            atexit.register(self.teardown)

    def add(self, engine: EngineLifecycle) -> None:
        self.arm()
        self._serial += 1
        self.engines[self._serial] = engine

    def teardown(self) -> None:
        """Close every live engine with a drain, then destroy the default group if ds_acco owns it (idempotent)."""
        for key in sorted(self.engines.keys(), reverse=True):
            engine = self.engines.get(key)
            if engine is None or engine.closed:
                continue
            try:
                engine.close(drain=True)
            except Exception as exc:  # noqa: BLE001 - nothing left to raise to at exit
                logger.warning("ds_acco: %s round in flight at exit did not finish cleanly: %s",
                               type(engine).__name__, exc)
        # after an uncaught exception peers may still be inside a collective: leave the group to the exit
        if self.owns_default_group and getattr(sys, "last_value", None) is None and dist.is_initialized():
            self.owns_default_group = False
            try:
                dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001
                logger.warning("ds_acco: destroying the default process group at exit failed: %s", exc)
        gc.collect()  # cycles holding groups and work objects go now, not during finalization


EXIT_ORDER = _ExitOrder()
