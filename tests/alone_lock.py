"""Tests that time something real run with no other test beside them (``@pytest.mark.alone``).

Why: the README's test command runs two pytest-xdist workers (``-n 2`` in pytest.ini), because one worker left a
core idle half the time (jobs wait on sockets, time-outs and launchers). Most tests only get slower on a busier
machine, which they tolerate; a test that checks a measured time against a bound (a probe pricing a shaped link,
a rate through ``tc``) would read the other worker's load as the link's. Such a test takes an exclusive lock that
every other test holds shared while it runs, setup and teardown included, so it starts once the other worker's
current test ends and the other worker waits for it.

A reader-writer lock on two ``flock`` files: a waiting exclusive test holds the turnstile, so the other worker
cannot keep starting shared tests ahead of it. Without xdist (``-n 0``) there is one process and the lock is free.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

import pytest

ALONE = "alone"
FOLDER = "DS_ACCO_TEST_LOCKS"
"""The environment variable naming the run's lock folder: the controller makes it before xdist starts the workers,
which inherit its environment."""


@contextlib.contextmanager
def held(alone: bool):
    folder = os.environ[FOLDER]
    with open(os.path.join(folder, "turnstile"), "a+b") as gate, open(os.path.join(folder, "tests"), "a+b") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, or the only process
        os.environ[FOLDER] = tempfile.mkdtemp(prefix="ds_acco_tests_")
    config.addinivalue_line("markers", f"{ALONE}: times something real; no other test runs beside it "
                                       "(tests/alone_lock.py)")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ.pop(FOLDER, ""), ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    with held(item.get_closest_marker(ALONE) is not None):
        yield
