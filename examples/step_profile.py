"""``--profile-steps A:B``: a torch profile of optimizer steps A+1 to B, every thread, as a gzipped Chrome trace.

Why every thread: a round runs on ds_acco's communication thread (and, on a GPU, its own stream), and what it
takes from compute shows as the training thread's operations running long while the round's run beside them.
torch's profiler records the thread that started it unless asked for all (``profile_all_threads``, torch 2.6+);
on an older torch the trace holds the training thread and the GPU's streams only, and a line says so.
``benchmarks/report/round_trace.py`` reads the trace (``python -m benchmarks.gpu_overlap --profile``).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from typing import Optional

import torch


def parse_window(text: str) -> tuple[int, int]:
    """``"A:B"`` with ``0 <= A < B``: profile the steps after step A up to step B."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"got {text!r}; expected A:B, two step numbers with A < B") from None
    if not 0 <= a < b:
        raise ValueError(f"got {text!r}; expected 0 <= A < B")
    return a, b


class StepProfile:
    """Starts a profiler after optimizer step A and writes its trace after step B (this rank's file)."""

    def __init__(self, window: Optional[tuple[int, int]], path: Optional[str], rank: int):
        self.window, self.rank = window, rank
        self.path = None if window is None else (path or "profile") + (f".rank{rank}" if rank else "") + ".json"
        self._prof = None

    def _sync(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def after_step(self, step: int) -> None:
        if self.window is None:
            return
        if step == self.window[0] and self._prof is None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            try:
                from torch._C._profiler import _ExperimentalConfig

                config = _ExperimentalConfig(profile_all_threads=True)
            except (ImportError, TypeError):
                config = None
                print("[train_lm] this torch profiles the training thread only (no profile_all_threads)",
                      file=sys.stderr, flush=True)
            self._sync()
            self._prof = profile(activities=activities, experimental_config=config)
            self._prof.__enter__()
        elif step == self.window[1] and self._prof is not None:
            self._sync()
            self._prof.__exit__(None, None, None)
            self._prof.export_chrome_trace(self.path)
            with open(self.path, "rb") as raw, gzip.open(self.path + ".gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            os.remove(self.path)
            self._prof = None
            if self.rank == 0:
                print(f"[train_lm] profile of steps {self.window[0] + 1}-{self.window[1]}: {self.path}.gz", flush=True)
