"""Finished jobs exit 0 under a CPU hog: the CI smoke of benchmarks/clean_exit.py (BENCHMARKS.md has the full run).

Three launches, one per launcher kind and front end (DeepSpeed ACCO under ``deepspeed``, FSDP2 ACCO
under ``torchrun``, an HF Trainer streaming script under ``deepspeed``), while a busy loop takes a core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_finished_jobs_exit_zero_under_a_cpu_hog(tmp_path):
    cases = "ds_acco_deepspeed,fsdp_acco_torchrun,hf_streaming_deepspeed"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.clean_exit", "--launches", "3", "--hog", "1",
                           "--cases", cases, "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    rows = [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == cases.split(",")
    for r in rows:
        assert r["rc"] == 0 and r["abort"] is None, (r["case"], r["rc"], r["abort"], r["tail"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "total: 3 launches, 0 failed" in (tmp_path / "summary.md").read_text()
