"""A busy loop on one core while a real launch runs, and the abort a clean exit must not show.

Why: a finished job that exits non-zero makes schedulers retry it; the abort at interpreter teardown that
ds_acco's exit order prevents (``ds_acco.comm.engine_lifecycle``) is load-dependent, so the launches the suite
makes anyway run while the CPU is contended, and their output is searched for it (benchmarks/clean_exit.py's
pattern, which its many-launch run counts).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import subprocess

from benchmarks.clean_exit import ABORT
from tests.helpers import REPO, run_group


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_loop():
    hog = mp.get_context("spawn").Process(target=_spin, daemon=True)
    hog.start()
    try:
        yield
    finally:
        hog.terminate()
        hog.join()


def abort_in(output: str):
    """The first sign of an abort at teardown in a launch's output, or None."""
    found = ABORT.search(output)
    return found.group(0) if found else None


def launch(cmd: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    """Run a launcher (its stderr apart, where an abort shows) in a group killed past ``timeout``."""
    return run_group(cmd, dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO), timeout, merge_stderr=False)


def finished_cleanly(proc: subprocess.CompletedProcess) -> None:
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    assert abort_in(proc.stdout + proc.stderr) is None, out
