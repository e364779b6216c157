"""The harness the distributed tests stand on: a worker that dies of a signal says where it was, and the ports its
jobs bind are handed out so that nothing else takes them meanwhile."""

from __future__ import annotations

import os
import socket
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


def test_free_ports_lie_below_the_ephemeral_range_never_repeat_and_keep_to_their_worker(monkeypatch):
    """A port a job binds later must not be handed meanwhile to a connection as its local port (the kernel gives
    those from its ephemeral range), nor to another xdist worker or a second job of this one."""
    from benchmarks.cluster import system

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    low = system._ephemeral_low()
    ports = [system.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(low - system.EPHEMERAL_MARGIN <= p < low and p % 2 == 1 for p in ports), ports
    with socket.socket() as s:  # free when handed out
        s.bind(("127.0.0.1", ports[-1]))
