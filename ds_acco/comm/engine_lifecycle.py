"""What every engine that runs rounds on a background thread shares: its life from start to close.

The round engine (sync, dpu, acco) and the streaming engine differ in what a round computes
and when it launches, not in how they live: each runs its collectives on a process group of
its own (created with ``acco.timeout_s``, so a collective on a dead peer fails in that time and
never interleaves with the training thread's), first checks that every rank was started the
same way (a mismatch fails at start-up with every rank's values, not as a hang), records each
round in telemetry, keeps at most one round in flight on one communication thread, and closes
in one order: the round in flight drained (or abandoned), the thread joined, the groups it
created destroyed. A script may end with a round in flight on every rank (it always does in
acco): an ``atexit`` hook drains it before the interpreter tears the process group down under
the thread.
"""

from __future__ import annotations

import atexit
import functools
import logging
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ds_acco.config import AccoConfig
from ds_acco.errors import AccoRoundError
from ds_acco.telemetry.log_lines import announce, ensure_log_output
from ds_acco.telemetry.records import Telemetry

from .collectives import RoundCollectives
from .comm_thread import CommThread, RoundHandle, record_ready

logger = logging.getLogger("ds_acco")


class EngineLifecycle:
    """Process group, peer check, telemetry, communication thread, round in flight, drain at exit, close.

    Subclasses call :meth:`_start_thread` once their buffers exist, launch rounds with
    :meth:`_submit`, keep what they need about the round in flight in ``_inflight`` (any
    object with a ``handle``), and implement :meth:`_drain` (wait for it and apply it),
    :meth:`_release` (anything else they hold) and :meth:`startup_fields`.

    Args:
        config: the validated ``"acco"`` block.
        process_group: the data-parallel group (None: WORLD); rounds run on a private copy.
        device: where the round's tensors live (picks the CUDA stream or none).
        thread_name: the communication thread's name.
    """

    def __init__(self, config: AccoConfig, process_group: Optional[dist.ProcessGroup], device: torch.device,
                 thread_name: str):
        self.config, self.device, self._thread_name = config, device, thread_name
        self._closed = False
        self._comm: Optional[CommThread] = None
        self._atexit: Optional[Callable[[], None]] = None
        self._inflight: Any = None
        self._round_index = 0
        self.coll = RoundCollectives(process_group, config.timeout_s)
        self.rank, self.world_size = self.coll.rank, self.coll.world_size
        tcfg = config.telemetry
        path = f"{tcfg.jsonl_path}.rank{self.rank}" if tcfg.jsonl_path else None
        self.telemetry = Telemetry(keep_last=tcfg.keep_last, jsonl_path=path)
        if tcfg.log_every and self.rank == 0:
            ensure_log_output()

    # ------------------------------------------------------------ start
    def _agree_with_peers(self, mine: object, what: str) -> None:
        """Fail at start-up, not with a hang, when ranks were given different configs or models."""
        self.coll.check_peers_agree(mine, what)

    def _start_thread(self) -> None:
        self._comm = CommThread(self.device, name=self._thread_name)
        self._atexit = drain_at_exit(self)

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

    def _submit(self, kind: str, run: Callable[[RoundHandle], Any]) -> RoundHandle:
        """Queue ``run`` as the next round on the communication thread; returns its handle."""
        handle = RoundHandle(self._round_index, kind, self.config.timeout_s)
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
            if self._atexit is not None:
                atexit.unregister(self._atexit)
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


def drain_at_exit(engine: EngineLifecycle) -> Callable[[], None]:
    """Register (and return, for ``atexit.unregister``) a hook that closes ``engine`` with a drain at exit.

    Every rank reaches interpreter exit with the same round in flight, so finishing it
    there keeps the collectives matched and lets the process exit cleanly. The hook holds
    a weak reference: it does not keep the engine alive.
    """
    hook = functools.partial(_close_at_exit, weakref.ref(engine))
    atexit.register(hook)
    return hook


def _close_at_exit(ref: "weakref.ref") -> None:
    engine = ref()
    if engine is None or engine.closed:
        return
    try:
        engine.close(drain=True)
    except Exception as exc:  # noqa: BLE001 - nothing left to raise to at exit
        logger.warning("ds_acco: %s round in flight at exit did not finish cleanly: %s", type(engine).__name__, exc)
