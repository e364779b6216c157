"""SIGTERM to one rank, through the real ``deepspeed`` launcher: every rank stops at the same round boundary,
saves (``acco.preemption.checkpoint_dir``), exits with ``acco.preemption.exit_code`` (143), and the
checkpoint resumes bit-exactly under the fixed policy. Mid-round (ACCO) and mid-save (streaming).
"""

from __future__ import annotations

import json

import pytest

from tests.test_checkpoint_verify import _launch

SCRIPT = "tests/scripts/preempt_script.py"


@pytest.mark.parametrize("front, extra", [("acco", ["--at", "9"]), ("streaming", ["--at", "5", "--during-save"])])
def test_sigterm_to_one_rank_stops_every_rank_saves_and_resumes_exactly(tmp_path, front, extra):
    stop = _launch("--phase", "stop", "--front", front, "--out", str(tmp_path), *extra, script=SCRIPT)
    assert stop.returncode == 143, stop.stdout[-4000:]
    assert "TRAINING FINISHED WITHOUT A STOP" not in stop.stdout
    stops = [json.loads((tmp_path / f"stop{r}.json").read_text()) for r in range(2)]
    assert stops[0]["code"] == stops[1]["code"] == 143
    assert stops[0]["steps"] == stops[1]["steps"] and stops[0]["micro_batches"] == stops[1]["micro_batches"], stops
    assert all(s["seconds_after_signal"] < 30 for s in stops), stops  # within acco.timeout_s
    assert "SIGTERM received" in stop.stdout and "stopped after a SIGTERM" in stop.stdout, stop.stdout[-3000:]
    if "--during-save" in extra:  # the save the signal interrupted finished and is intact
        assert (tmp_path / "regular" / "latest").exists()
    resume = _launch("--phase", "resume", "--front", front, "--out", str(tmp_path), script=SCRIPT)
    assert resume.returncode == 0, resume.stdout[-4000:]
    for r in range(2):
        got = json.loads((tmp_path / f"resume{r}.json").read_text())
        assert got["resumed_from"] == stops[r]["steps"] > 0, (got, stops)
        assert got["equal"], got
