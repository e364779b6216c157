"""Real 2-process launches under MPICH's ``mpiexec`` (launchers/mpirun.sh, launchers/fsdp_mpirun.sh): ranks that find
each other through MPI discovery, and a rank that fails before or after it. What a config trains to is checked on
pooled ranks (tests/test_launchers.py); what only ``mpiexec`` can show is here, each test saying which. Launches run
on a free port, in their own process group with a hard timeout (tests/launcher_checks.py)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time

import pytest

from tests import launcher_checks as C
from tests.launcher_checks import CONFIGS, STEPS, SUMMARY, TRAIN_ARGS


@pytest.fixture(scope="module")
def mpirun_launch(tmp_path_factory):
    return C.train_launch("mpirun.sh", os.path.join(CONFIGS, "zero1_baseline.json"), tmp_path_factory.mktemp("mpirun"))


def test_mpirun_trains_two_ranks(mpirun_launch):
    """Two ranks that find each other through MPI discovery alone, and DeepSpeed's segments do not outlive them:
    only ``mpiexec`` starts ranks with MPI's variables instead of torch's."""
    run = mpirun_launch
    # DeepSpeed's CPU shared-memory segments (66 MB per rank) do not outlive the job (ds_acco.deepspeed.shm)
    assert run["leftover_segments"] == [], run["leftover_segments"]
    C.check_trained(C.summary(run["result"]), run["log"], run["config"], min_rounds=STEPS)


def _mpi_rank_failure(failure: str, config: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(C.clean_env(), TRAIN_MODULE="tests.scripts.mpi_rank_failure_script", MPI_RANK_FAILURE=failure,
               MPI_RANK_FAILURE_FLAG=str(tmp_path / "rank0_discovering"))
    return C.launch("mpirun.sh", config, *TRAIN_ARGS, timeout=150, env=env)


def test_one_rank_dying_mid_run_ends_an_mpi_job(tmp_path):
    """Only rank 1 fails, after distributed init. Under MPICH's mpiexec the peer would
    otherwise wait in its next collective for the 30-minute gloo timeout; only mpiexec can show it does not."""
    result = _mpi_rank_failure("mid_run", "ds_configs/acco_fixed.json", tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "rank 1 failed, aborting the MPI job: RuntimeError: injected failure on rank 1" in result.stdout, \
        result.stdout[-3000:]
    assert not SUMMARY.search(result.stdout)


WATCHDOG_S = 2  # acco.timeout_s: the watchdog has to fire, not to wait long


def test_one_rank_dying_before_start_up_ends_an_mpi_job(tmp_path):
    """Rank 1 exits before MPI_Init: MPICH's mpiexec leaves rank 0 blocked in DeepSpeed's MPI discovery (no time
    limit, in C). ds_acco runs that discovery under a watchdog of acco.timeout_s, so the job ends in seconds; only
    mpiexec can start a rank that never reaches MPI_Init."""
    with open(os.path.join(CONFIGS, "acco_fixed.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["acco"]["timeout_s"] = WATCHDOG_S
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    result = _mpi_rank_failure("before_init", str(tmp_path / "config.json"), tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert f"Timeout (0:00:{WATCHDOG_S:02d})!" in result.stdout, result.stdout[-3000:]
    assert "mpi_discovery_within_acco_timeout_s" in result.stdout, result.stdout[-3000:]
    assert time.monotonic() - t0 < 100  # without it, forever
    assert not SUMMARY.search(result.stdout)


FSDP_SUMMARY = re.compile(r"\[train_lm_fsdp\] done: steps (\d+) \| ranks (\d+) \| final train loss (\S+) \|.*"
                          r"comm hidden ([\d.]+)%")


def test_fsdp_example_under_mpiexec():
    """examples.train_lm_fsdp finds its ranks through MPI discovery under mpiexec (its only launch), with the FSDP2
    low-bit preset (mode auto, int8 reduce-scatter and all-gathers, int4 estimates)."""
    result = C.launch("fsdp_mpirun.sh", os.path.join(CONFIGS, "fsdp_auto_lowbit.json"), "--steps", "3", "--seq-len",
                     "64")
    assert result.returncode == 0, result.stdout[-4000:]
    found = FSDP_SUMMARY.findall(result.stdout)
    assert len(found) == 1, result.stdout[-4000:]
    steps, ranks, loss, hidden = found[0]
    assert int(steps) >= 3 and int(ranks) == 2 and math.isfinite(float(loss)) and 0 <= float(hidden) <= 100
