"""SIGTERM to one rank, through the real ``deepspeed`` launcher: every rank stops at the same round boundary,
saves (``acco.preemption.checkpoint_dir``), exits with ``acco.preemption.exit_code`` (143), and the
checkpoint resumes bit-exactly under the fixed policy. Mid-round (ACCO), mid-save (streaming), in the streaming
phase auto switched a ZeRO-1 job to, under the adaptive policy with a slower rank; FSDP2 under ``torchrun``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.dist_harness import free_port
from tests.helpers import REPO, launch_deepspeed

SCRIPT = "tests/scripts/preempt_script.py"


@pytest.mark.parametrize("front, extra", [("acco", ["--at", "9"]), ("streaming", ["--at", "5", "--during-save"]),
                                         ("auto_streaming", ["--at", "22"]), ("acco_adaptive", ["--at", "9"])])
def test_sigterm_to_one_rank_stops_every_rank_saves_and_resumes_exactly(tmp_path, front, extra):
    stop = launch_deepspeed(SCRIPT, "--phase", "stop", "--front", front, "--out", str(tmp_path), *extra)
    assert stop.returncode == 143, stop.stdout[-4000:]
    assert "TRAINING FINISHED WITHOUT A STOP" not in stop.stdout
    stops = [json.loads((tmp_path / f"stop{r}.json").read_text()) for r in range(2)]
    assert stops[0]["code"] == stops[1]["code"] == 143
    assert stops[0]["steps"] == stops[1]["steps"], stops
    # under the adaptive policy the slower rank 1 contributed fewer micro-batches; otherwise every rank as many
    assert (stops[0]["micro_batches"] > stops[1]["micro_batches"]) if front == "acco_adaptive" else (
        stops[0]["micro_batches"] == stops[1]["micro_batches"]), stops
    assert all(s["seconds_after_signal"] < 30 for s in stops), stops  # within acco.timeout_s
    assert "SIGTERM received" in stop.stdout and "stopped after a SIGTERM" in stop.stdout, stop.stdout[-3000:]
    if "--during-save" in extra:  # the save the signal interrupted finished and is intact
        assert (tmp_path / "regular" / "latest").exists()
    resume = launch_deepspeed(SCRIPT, "--phase", "resume", "--front", front, "--out", str(tmp_path))
    assert resume.returncode == 0, resume.stdout[-4000:]
    for r in range(2):
        got = json.loads((tmp_path / f"resume{r}.json").read_text())
        assert got["resumed_from"] == stops[r]["steps"] > 0, (got, stops)
        assert got["equal"], got


def _torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "tests/scripts/fsdp_preempt_script.py", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_sigterm_to_one_fsdp2_rank_under_torchrun_stops_saves_and_resumes_exactly(tmp_path):
    stop = _torchrun("--phase", "stop", "--out", str(tmp_path))
    out = stop.stdout[-3000:] + stop.stderr[-3000:]
    assert "TRAINING FINISHED WITHOUT A STOP" not in stop.stdout, out
    stops = [json.loads((tmp_path / f"fsdp_stop{r}.json").read_text()) for r in range(2)]
    assert stops[0] == {**stops[1], "seconds_after_signal": stops[0]["seconds_after_signal"]}, stops
    assert stops[0]["code"] == 143 and stops[0]["steps"] > 0
    assert all(s["seconds_after_signal"] < 30 for s in stops), stops
    # torchrun exits 1 whenever a worker exits non-zero, and reports the worker's status
    assert stop.returncode == 1 and "exitcode: 143" in stop.stderr, out
    resume = _torchrun("--phase", "resume", "--out", str(tmp_path))
    assert resume.returncode == 0, resume.stdout[-3000:] + resume.stderr[-3000:]
    for r in range(2):
        got = json.loads((tmp_path / f"fsdp_resume{r}.json").read_text())
        assert got["resumed_from"] == stops[r]["steps"] and got["equal"], got
