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
import signal
import subprocess

import pytest

from benchmarks.clean_exit import ABORT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    """Run a launcher; past ``timeout`` its whole process group (the ranks too) is killed and the test fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[0]} launch did not finish within {timeout}s:\n{out[-3000:]}{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def finished_cleanly(proc: subprocess.CompletedProcess) -> None:
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, out
    assert abort_in(proc.stdout + proc.stderr) is None, out
