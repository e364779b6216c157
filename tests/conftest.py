"""Each test module runs its distributed jobs on worker processes of its own (tests/dist_harness.py says why)."""

import pytest

from tests import dist_harness


@pytest.fixture(scope="module", autouse=True)
def _worker_pools_per_module():
    yield
    dist_harness._close_pools()
