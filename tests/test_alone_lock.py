"""The lock that keeps ``@pytest.mark.alone`` tests from running beside another xdist worker's test
(tests/alone_lock.py), on real processes and real ``flock`` files, in the order the events say."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from tests.alone_lock import FOLDER, held

CTX = mp.get_context("fork")


def _hold(alone: bool, entered, release, log, name: str) -> None:
    with held(alone):
        log.put((name, "in", time.monotonic()))
        entered.set()
        release.wait(30)
        log.put((name, "out", time.monotonic()))


def _start(alone: bool, log, name: str):
    entered, release = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_hold, args=(alone, entered, release, log, name), daemon=True)
    proc.start()
    return proc, entered, release


def test_an_alone_test_waits_for_the_running_one_and_holds_back_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv(FOLDER, str(tmp_path))
    log = CTX.Queue()
    shared, shared_in, shared_go = _start(False, log, "running")
    assert shared_in.wait(30)
    alone, alone_in, alone_go = _start(True, log, "alone")
    assert not alone_in.wait(0.5)  # the other worker's test still runs
    later, later_in, later_go = _start(False, log, "next")
    assert not later_in.wait(0.5)  # queued behind the alone test, though only a shared test holds the lock
    shared_go.set()
    assert alone_in.wait(30)
    assert not later_in.wait(0.5)  # nothing beside the alone test
    alone_go.set()
    assert later_in.wait(30)
    later_go.set()
    for p in (shared, alone, later):
        p.join(30)
        assert p.exitcode == 0
    events = sorted((log.get(timeout=5) for _ in range(6)), key=lambda e: e[2])
    assert [(n, what) for n, what, _ in events] == [("running", "in"), ("running", "out"), ("alone", "in"),
                                                    ("alone", "out"), ("next", "in"), ("next", "out")]


def test_shared_tests_run_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setenv(FOLDER, str(tmp_path))
    log = CTX.Queue()
    started = [_start(False, log, name) for name in ("a", "b")]
    assert all(entered.wait(30) for _, entered, _ in started)  # both in at once
    for proc, _, release in started:
        release.set()
        proc.join(30)
        assert proc.exitcode == 0
    assert sorted(os.listdir(tmp_path)) == ["tests", "turnstile"]
