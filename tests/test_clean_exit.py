"""Finished jobs exit 0 under a CPU hog: the CI smoke of benchmarks/clean_exit.py (BENCHMARKS.md has the full run).

One launch of the FSDP2 case under ``torchrun`` while a busy loop takes a core, through the benchmark itself, so its
hog, launch, log and summary are exercised. The other launchers and front ends are checked where the suite launches
them anyway: every finished launch in tests/test_deepspeed_frontend.py must exit 0 without an abort (the rounds left
in flight at exit under a busy loop too), and the stopped ones in tests/test_preemption.py with 143 without one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE = "fsdp_acco_torchrun"


def test_finished_jobs_exit_zero_under_a_cpu_hog(tmp_path):
    """A launch: a real launcher's exit status at interpreter teardown, while the CPU is contended."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.clean_exit", "--launches", "1", "--hog", "1",
                           "--cases", CASE, "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == [CASE]
    for r in rows:
        assert r["rc"] == 0 and r["abort"] is None, (r["case"], r["rc"], r["abort"], r["tail"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "total: 1 launches, 0 failed" in (tmp_path / "summary.md").read_text()
