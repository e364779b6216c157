"""Each test module runs its distributed jobs on worker processes of its own (tests/dist_harness.py says why);
tests marked ``alone`` run with no other test beside them (tests/alone_lock.py says why); the longest modules start
first."""

import os

import pytest

from tests import dist_harness
from tests.alone_lock import pytest_configure, pytest_runtest_protocol, pytest_unconfigure  # noqa: F401 (hooks)

LONGEST_FIRST = ("test_launchers", "test_deepspeed_frontend", "test_mpi_launch", "test_bench_smoke_gpu",
                 "test_bench_smoke", "test_hf_trainer", "test_preemption", "test_checkpoint_verify", "test_faults",
                 "test_clean_exit", "test_torchft_peer", "test_auto_first_look", "test_lowbit", "test_exactness",
                 "test_round_ops")
"""Modules by the seconds they took in a full run, longest first (the 25 slowest tests are printed at the end of
every run). pytest-xdist hands each of its two workers a whole module at a time (``--dist loadfile``: a module's
launches and pools are set up once) in this order, so no long module starts last while the other worker idles.
A module missing here runs after these, in file order; a stale order costs seconds, never a result."""


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def module_rank(item):
        return rank.get(os.path.splitext(os.path.basename(str(item.fspath)))[0], len(rank))

    items.sort(key=module_rank)  # stable: file order within a module and among the rest


@pytest.fixture(scope="module", autouse=True)
def _worker_pools_per_module():
    yield
    dist_harness._close_pools()
