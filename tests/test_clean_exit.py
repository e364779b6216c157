"""Finished jobs exit 0 under a CPU hog: the CI smoke of benchmarks/clean_exit.py (BENCHMARKS.md has the full run),
and the FSDP2 example trained under ``torchrun`` (launchers/fsdp_torchrun.sh) in that same launch.

One launch of the FSDP2 case while a busy loop takes a core, through the benchmark itself, so its hog, launch, log
and summary are exercised. The other launchers and front ends are checked where the suite launches them anyway:
every finished launch in tests/test_deepspeed_frontend.py and tests/test_hf_trainer.py must exit 0 without an abort
(the HF Trainers and the rounds left in flight at exit under a busy loop too), and the stopped ones in tests/test_preemption.py with 143 without one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

CASE = "fsdp_acco_torchrun"
# 3 validation batches on 2 ranks: uneven, and under FSDP2 a forward is a collective (it hung before)
TRAIN = "--steps 4 --seq-len 32 --eval-batches 3 --eval-every 2 --shard-blocks --compute-delay-ms 1"


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """One ``benchmarks.clean_exit`` launch of launchers/fsdp_torchrun.sh under a busy loop, saving a checkpoint and
    each rank's metrics."""
    out = tmp_path_factory.mktemp("clean_exit")
    extra = f"{TRAIN} --save-dir {out / 'ck'} --metrics-out {out / 'm'}"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.clean_exit", "--launches", "1", "--hog", "1",
                           "--cases", CASE, "--out", str(out), "--extra", extra], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    return proc, out


def test_finished_jobs_exit_zero_under_a_cpu_hog(launch):
    """A launch: a real launcher's exit status at interpreter teardown, while the CPU is contended."""
    proc, out = launch
    rows = [json.loads(line) for line in (out / "launches.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == [CASE]
    for r in rows:
        assert r["rc"] == 0 and r["abort"] is None, (r["case"], r["rc"], r["abort"], r["tail"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "total: 1 launches, 0 failed" in (out / "summary.md").read_text()


def test_fsdp2_gpt_trains_under_torchrun(launch):
    """The same launch: the FSDP2 example trains, validates, saves and reports its rounds under ``torchrun``."""
    _, out = launch
    stdout = (out / "launch_1.log").read_text()
    line = [ln for ln in stdout.splitlines() if ln.startswith("[train_lm_fsdp] done")]
    assert line, stdout[-3000:]
    m = re.search(r"final train loss ([\d.]+) .* comm hidden ([\d.]+)%", line[0])
    assert m, line[0]
    assert 0 < float(m.group(1)) < 10 and 0 <= float(m.group(2)) <= 100
    assert (out / "ck").is_dir()
    # one fully_shard unit per block plus the root, small enough to share one 25 MiB bucket: a
    # reduce-scatter and an all-gather a round, + counts and clip norm
    rec = json.loads((out / "m" / "fsdp_rank0.json").read_text())
    assert (rec["fsdp_units"], rec["groups"]) == (5, 1) and rec["round_calls"] == rec["rounds"] * (2 * 1 + 2)
    assert [e["step"] for e in rec["evals"]][0] == 2 and len(rec["evals"]) == 2 and len(rec["steps"]) >= 4
