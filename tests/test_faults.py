"""Real kills: a dead or stopped peer becomes an error in every surviving process, never a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests import fault_workers as F
from tests.dist_harness import free_port, run_distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 5


@pytest.mark.parametrize("stage", ["reduce-scatter", "shard step", "all-gather"])
def test_peer_killed_mid_round(stage):
    res = run_distributed(F.train_with_fault, 3, config={"mode": "acco", "timeout_s": TIMEOUT_S}, victim=2,
                          stage=stage, round_index=3, sig=signal.SIGKILL, expect_dead=[2], timeout=90)
    assert res[2] is None  # the victim really died
    for r in res[:2]:
        assert r["error"] == "AccoRoundError", r
        assert "round 3" in r["message"] and f"acco.timeout_s={TIMEOUT_S}s" in r["message"]
        assert r["commits"] == 1  # rounds 0-2 completed (E0, C0, E1); round 3 is C1
        assert r["threads_after_close"] == []


def test_stopped_peer_times_out():
    res = run_distributed(F.train_with_fault, 3, config={"mode": "dpu", "timeout_s": TIMEOUT_S}, victim=1,
                          stage="reduce-scatter", round_index=2, sig=signal.SIGSTOP, expect_dead=[1], timeout=90)
    for r in (res[0], res[2]):
        assert r["error"] in ("AccoRoundError", "AccoTimeoutError"), r
        assert "round 2" in r["message"]
        assert r["threads_after_close"] == []
        assert r["thread_exit_s"] < TIMEOUT_S + 5


def test_launcher_exits_nonzero_when_a_peer_dies():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--master_port", str(free_port()),
           "tests/scripts/kill_peer_script.py"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("AccoRoundError: ds_acco round 3") >= 2, proc.stderr[-3000:]
