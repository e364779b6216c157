"""Preemption: SIGTERM on any rank stops every rank at the same round boundary.

Why: SLURM, Kubernetes and the launchers send SIGTERM some seconds before they kill a job. Python's default is to die at
once, and then the peers fail at their next collective, with nothing saved. ds_acco instead only notes the signal here;
every round's first collective (the micro-batch count all-gather, or a streaming fragment's flag all-gather) carries the
note, so every rank learns of it in the same round, and the front end stops at that round's boundary: it optionally
saves a checkpoint (``acco.preemption.checkpoint_dir``), then every rank raises :class:`~ds_acco.errors.AccoPreempted`,
a ``SystemExit`` with ``acco.preemption.exit_code``. A save in progress when the signal arrives simply finishes (the
handler only sets a flag), and the stop comes at the next boundary.

The handler is process-wide by nature (a signal has one handler per process); it is installed from the main thread when
the first engine starts, and a handler the program had installed before is still called after ds_acco notes the signal.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Optional

logger = logging.getLogger("ds_acco")


class _StopSignal:
    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Catch SIGTERM (idempotent; only possible on the main thread, elsewhere the default stays)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def _handle(self, signum: int, frame: Optional[Any]) -> None:
        if not self.requested:
            logger.warning("ds_acco: SIGTERM received: every rank stops at the next round boundary")
        self.requested = True
        if callable(self._previous):
            self._previous(signum, frame)


STOP = _StopSignal()
