"""SIGTERM to one rank: every rank stops at the same round boundary, saves (``acco.preemption.checkpoint_dir``),
exits with ``acco.preemption.exit_code`` (143), and the checkpoint resumes bit-exactly under the fixed policy.
Mid-round (ACCO) through the real ``deepspeed`` launcher; mid-save (streaming), in the streaming phase auto
switched a ZeRO-1 job to and under the adaptive policy with a slower rank on pooled workers, where a rank signals
itself as in a launched job and the job returns what ``AccoPreempted`` carried (tests/preempt_workers.py); FSDP2's
stop under ``torchrun``. Every resume is pooled: it needs only the files a stop left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import preempt_workers as P
from tests.clean_exit_checks import abort_in
from tests.dist_harness import free_port, run_distributed
from tests.helpers import REPO, launch_deepspeed

CLEAN = {"flag": False, "ds_acco_handler": False}
"""What every pooled job must find: no SIGTERM noted and not ds_acco's handler, as in a fresh process."""


def _check_stops(stops: list, front: str) -> None:
    assert stops[0]["code"] == stops[1]["code"] == 143, stops
    assert stops[0]["steps"] == stops[1]["steps"] > 0, stops
    # under the adaptive policy the slower rank 1 contributed fewer micro-batches; otherwise every rank as many
    assert (stops[0]["micro_batches"] > stops[1]["micro_batches"]) if front == "acco_adaptive" else (
        stops[0]["micro_batches"] == stops[1]["micro_batches"]), stops
    assert all(s["seconds_after_signal"] < 30 for s in stops), stops  # within acco.timeout_s


def _check_resume(tmp_path, front: str, stops: list) -> None:
    resumed = run_distributed(P.resume_job, 2, front=front, out=str(tmp_path), timeout=180)
    for r, got in enumerate(resumed):
        assert got["found"] == CLEAN, got  # the stop job before it on this worker left nothing behind
        assert got["resumed_from"] == stops[r]["steps"] > 0, (got, stops)
        assert got["equal"], got
        if front == "auto_streaming":  # the checkpoint holds the switch: the resume runs streaming from its start
            assert got["running"] == "streaming", got


def test_sigterm_under_the_deepspeed_launcher_stops_every_rank_with_exit_143_and_resumes_exactly(tmp_path):
    """A launch: the launcher's exit status is the ranks' exit code, and processes that exit after a stop (no abort
    at teardown); the resume, from the files the launch left, is pooled."""
    stop = launch_deepspeed("tests/scripts/preempt_script.py", "--front", "acco", "--out", str(tmp_path), "--at", "9")
    assert stop.returncode == 143, stop.stdout[-4000:]
    assert abort_in(stop.stdout) is None, stop.stdout[-4000:]
    assert "TRAINING FINISHED WITHOUT A STOP" not in stop.stdout
    stops = [json.loads((tmp_path / f"stop{r}.json").read_text()) for r in range(2)]
    _check_stops(stops, "acco")
    assert "SIGTERM received" in stop.stdout and "stopped after a SIGTERM" in stop.stdout, stop.stdout[-3000:]
    _check_resume(tmp_path, "acco", stops)


@pytest.mark.parametrize("front, at, during_save", [("streaming", 5, True), ("auto_streaming", 22, False),
                                                    ("acco_adaptive", 9, False)])
def test_sigterm_to_one_rank_stops_every_rank_saves_and_resumes_exactly(tmp_path, front, at, during_save):
    got = run_distributed(P.stop_job, 2, front=front, out=str(tmp_path), at=at, during_save=during_save,
                          timeout=180)
    for r in got:
        assert r["found"] == CLEAN, r
        assert not r["finished_without_stop"], r
    _check_stops(got, front)
    lines = "\n".join(line for r in got for line in r["lines"])
    assert "SIGTERM received" in lines and "stopped after a SIGTERM" in lines, lines
    if during_save:  # the save the signal interrupted finished and is intact
        assert (tmp_path / "regular" / "latest").exists()
    _check_resume(tmp_path, front, got)


def test_sigterm_to_one_fsdp2_rank_under_torchrun_stops_saves_and_resumes_exactly(tmp_path):
    """A launch: torchrun's exit status and report when its workers stop, and an FSDP2 process's exit after a
    stop (exit code 143 on every rank, no abort at teardown)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "tests/scripts/fsdp_preempt_script.py", "--out", str(tmp_path)]
    stop = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = stop.stdout[-3000:] + stop.stderr[-3000:]
    assert "TRAINING FINISHED WITHOUT A STOP" not in stop.stdout, out
    stops = [json.loads((tmp_path / f"fsdp_stop{r}.json").read_text()) for r in range(2)]
    assert stops[0] == {**stops[1], "seconds_after_signal": stops[0]["seconds_after_signal"]}, stops
    assert stops[0]["code"] == 143 and stops[0]["steps"] > 0
    assert all(s["seconds_after_signal"] < 30 for s in stops), stops
    # torchrun exits 1 whenever a worker exits non-zero, and reports the worker's status
    assert stop.returncode == 1 and "exitcode: 143" in stop.stderr, out
    assert abort_in(stop.stdout + stop.stderr) is None, out
    # the checkpoint the launch left resumes exactly (pooled: nothing launcher-specific in a load)
    _check_resume(tmp_path, "fsdp", stops)
