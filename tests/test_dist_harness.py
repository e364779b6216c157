"""The harness the distributed tests stand on: a worker that dies of a signal says where it was."""

from __future__ import annotations

import os
import time

import pytest

from tests.dist_harness import _POOLS, run_distributed


def abort_on(rank, world, victim):
    if rank == victim:
        time.sleep(0.2)
        os.abort()  # SIGABRT, as a C++ std::terminate in a gloo thread would
    return rank


def test_a_worker_that_aborts_reports_every_threads_stack_and_the_pool_is_replaced():
    with pytest.raises(RuntimeError) as err:
        run_distributed(abort_on, 2, 1, timeout=60)
    text = str(err.value)
    assert "--- rank 1 --- died (exit code -6)" in text
    assert "its faulthandler report" in text and "Fatal Python error: Aborted" in text and "abort_on" in text
    assert 2 not in _POOLS  # the next job starts a fresh pool
    assert run_distributed(abort_on, 2, -1, timeout=60) == [0, 1]
