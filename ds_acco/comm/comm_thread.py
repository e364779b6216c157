"""The background thread (and, on GPUs, the CUDA stream) that rounds run on.

[Note: why a thread and a stream]
A round is a chain of blocking collectives plus a shard optimizer step. Running it on a Python thread lets the training
thread return to forward/backward at once: gloo and NCCL release the GIL while they wait, and so do the optimizer's
kernels. On a GPU the round's kernels must also not queue behind the training thread's kernels, so they go to one
dedicated stream, ``comm_stream``, created here and nowhere else. Tensors cross between the streams with events:

* ``ready`` is recorded on the training (current) stream when a round is launched; the comm stream waits on it before
  touching the gradient buffer or overwriting the staging parameter buffer the compute stream read last.
* ``done`` is recorded on the comm stream at the end of the round; the training stream waits on it at the swap, before
  reading the new parameters or accumulating into the buffer the round zeroed.

Timeline (acco, one optimizer step)::

    training |  B_t micro-batches @ θ_t  |swap| A_{t+1} micro-batches @ θ̃_{t+1} |swap|
    comm     |  estimate round E_t       |    |  commit round C_t              |

The thread is a daemon: a collective stuck on a dead peer must never keep the process alive after the training thread
has raised.

A handle's stamps (launch, stages, end) are on the engine's clock (:mod:`ds_acco.comm.clock`); its time-out is on real
time whatever the clock.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Optional

import torch

from ds_acco.errors import AccoRoundError, AccoTimeoutError

from .clock import WALL, Clock
from .thread_policy import yield_to_compute


def record_ready(device: torch.device) -> Optional[torch.cuda.Event]:
    """Mark "everything the training stream queued so far" for the comm stream to wait on (None on CPU)."""
    if device.type != "cuda":
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(device))
    return ev


class RoundHandle:
    """The future of one round; ``wait()`` re-raises the round's exception here."""

    def __init__(self, index: int, kind: str, timeout_s: float, clock: Clock = WALL):
        self.index = index
        self.kind = kind
        self.timeout_s = timeout_s
        self.clock = clock
        self.launched_at = clock.now()
        self.finished_at: Optional[float] = None
        """When the round ended, on the clock (the communication thread's time then)."""
        self._launched_real = time.perf_counter()  # what the time-out counts from
        self.stage = "queued"
        self.stage_s: dict[str, float] = {}
        """Seconds the communication thread spent in each stage (host time; on a GPU the
        collectives are asynchronous, so there it is the time to enqueue them)."""
        self.stage_cpu_s: dict[str, float] = {}
        """CPU seconds of the communication thread in each stage. On a CPU host this thread shares
        the cores with compute: what a round costs the training thread is this, not ``stage_s``."""
        self._stage_t0: Optional[float] = None
        self._stage_cpu0 = 0.0
        self._finished = threading.Event()
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._done_event: Optional[torch.cuda.Event] = None

    @classmethod
    def completed(cls, index: int, kind: str, timeout_s: float, result: Any) -> "RoundHandle":
        """A handle whose round already finished with ``result`` (a round restored from a checkpoint)."""
        handle = cls(index, kind, timeout_s)
        handle._finish(result, None, None)
        return handle

    def started(self) -> None:
        """On the communication thread, as the round starts: it cannot start before its launch."""
        self.clock.waited_for(self.launched_at)

    def enter_stage(self, stage: str) -> None:
        """Move to ``stage``, charging the time since the last call to the stage left."""
        now, cpu = self.clock.now(), time.thread_time()
        if self._stage_t0 is not None and self.stage != "queued":
            self.stage_s[self.stage] = self.stage_s.get(self.stage, 0.0) + (now - self._stage_t0)
            self.stage_cpu_s[self.stage] = self.stage_cpu_s.get(self.stage, 0.0) + (cpu - self._stage_cpu0)
        self.stage, self._stage_t0, self._stage_cpu0 = stage, now, cpu

    def _finish(self, result: Any, error: Optional[BaseException], done_event) -> None:
        self._result, self._error, self._done_event = result, error, done_event
        self.finished_at = self.clock.now()
        self._finished.set()

    def done(self) -> bool:
        """True once the round's work is complete (on a GPU: its kernels too). On a simulated clock, once the
        asking thread's time has reached the round's end, after waiting for the work itself (real time, the
        time-out at most): the answer is then a function of the stamps, not of how the threads were scheduled."""
        if self.clock.simulated:
            if not self._finished.wait(max(0.0, self.timeout_s - self.elapsed())):
                return False
            if self._done_event is not None:
                self._done_event.synchronize()
            return self.finished_at <= self.clock.now()
        if not self._finished.is_set():
            return False
        return self._done_event is None or self._done_event.query()

    def failed(self) -> bool:
        return self._finished.is_set() and self._error is not None

    def elapsed(self) -> float:
        """Real seconds since the launch, whatever the clock: what the time-out counts."""
        return time.perf_counter() - self._launched_real

    def wait(self) -> Any:
        """Block until the round ends (``timeout_s`` after its launch at most); make the CUDA stream wait on it."""
        if not self._finished.wait(max(0.0, self.timeout_s - self.elapsed())):
            raise AccoTimeoutError(
                f"ds_acco round {self.index} ({self.kind}) did not finish within acco.timeout_s="
                f"{self.timeout_s:g}s; it was in stage '{self.stage}'. A peer is probably dead or stalled."
            )
        if self._error is not None:
            raise AccoRoundError(
                f"ds_acco round {self.index} ({self.kind}) failed in stage '{self.stage}' after "
                f"{self.elapsed():.1f}s (acco.timeout_s={self.timeout_s:g}s): {type(self._error).__name__}: "
                f"{self._error}. If a peer died or lost its connection every rank reports this; "
                "restart from the last checkpoint."
            ) from self._error
        self.clock.waited_for(self.finished_at)
        if self._done_event is not None:
            torch.cuda.current_stream().wait_event(self._done_event)
        return self._result


class CommThread:
    """One daemon thread that runs submitted rounds in order."""

    def __init__(self, device: torch.device, name: str = "ds_acco-comm"):
        self.device = device
        # The one CUDA stream rounds run on (see the note above); None on CPU.
        self.comm_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._jobs: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, handle: RoundHandle, fn: Callable[[RoundHandle], Any], ready: Optional[torch.cuda.Event]) -> None:
        if not self._thread.is_alive():
            raise AccoRoundError("the ds_acco communication thread is not running (closed or crashed)")
        self._jobs.put((handle, fn, ready))

    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:  # on a CPU host the round shares the cores with compute (ds_acco.comm.thread_policy)
            yield_to_compute()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            handle, fn, ready = job
            done_event = None
            try:
                handle.started()
                if self.comm_stream is not None:
                    with torch.cuda.stream(self.comm_stream):
                        if ready is not None:
                            self.comm_stream.wait_event(ready)
                        result = fn(handle)
                        done_event = torch.cuda.Event()
                        done_event.record(self.comm_stream)
                else:
                    result = fn(handle)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the training thread
                handle._finish(None, exc, None)
                continue
            handle._finish(result, None, done_event)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop after the queued rounds, waiting at most ``timeout_s`` for the thread to end."""
        self._jobs.put(None)
        self._thread.join(timeout_s)
