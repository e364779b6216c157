"""A full disk during a save fails it on every rank with one message; a resume under a changed block carries on.

The save folder is a real tmpfs sized for one and a half checkpoints (mounting needs root, as on
this project's CI machines; elsewhere the test says so and skips). Real DeepSpeed engines on the
pooled gloo ranks of tests/dist_harness.py.
"""

from __future__ import annotations

import math
import subprocess

import pytest

from tests import trust_workloads as T
from tests.dist_harness import run_distributed


def _tmpfs(mount, size: int):
    mount.mkdir()
    pages = (size + 4095) // 4096
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages * 4096}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield str(mount)
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    whole, tag = run_distributed(T.one_save_size, 2, folder=str(tmp_path / "measure"), timeout=120)[0]
    for mount in _tmpfs(tmp_path / "small", whole + tag // 2):  # one save and half a tag
        yield mount, tag


@pytest.fixture
def small_fsdp_disk(tmp_path):
    whole = run_distributed(T.fsdp_one_save_size, 2, folder=str(tmp_path / "measure"), timeout=120)[0]
    yield from _tmpfs(tmp_path / "small", whole + whole // 2)


def test_a_full_disk_fails_the_save_on_every_rank_and_keeps_the_last_tag(small_disk):
    folder, size = small_disk
    got = run_distributed(T.full_disk_job, 2, folder=folder, timeout=240)
    first = got[0]["first"]
    for r in got:
        msg = r["raised"]
        assert msg is not None, "the second save on a full disk did not raise"
        assert msg == got[0]["raised"]  # one message, on every rank
        assert folder in msg and "could not be written" in msg, msg
        assert f"'latest' still names {first}" in msg and "needs about" in msg and "free there now" in msg, msg
        assert "No space left on device" in msg or "iostream" in msg or "unexpected pos" in msg, msg
        assert r["latest"] == first
        tags = [n for n in r["listing"] if n.startswith("global_step")]
        assert tags == [first], r["listing"]  # no .partial left behind
        assert r["loaded_steps"] == 2 and r["resumed"] == 2  # the first tag loads and trains on
        assert r["continue_returned"] is False and r["continue_trained"] >= 1 and r["finite"], r


def test_a_full_disk_fails_an_fsdp_save_on_every_rank_and_keeps_the_earlier_save(small_fsdp_disk):
    folder = small_fsdp_disk
    got = run_distributed(T.fsdp_full_disk_job, 2, folder=folder, timeout=240)
    for r in got:
        for name, msg in r["raised"].items():
            assert msg is not None, f"the save to {name} on a full disk did not raise"
            assert msg == got[0]["raised"][name]  # one message, on every rank
            assert f"{folder}/{name}" in msg and "could not be written" in msg and "free there now" in msg, msg
            assert "No space left on device" in msg, msg
            assert "a complete save needs about" in msg and "(the size of step2)" in msg, msg
        assert "no earlier complete save" in r["raised"]["step4"], r["raised"]["step4"]
        assert "still holds the last complete save" in r["raised"]["step2"], r["raised"]["step2"]
        assert r["listing"] == ["step2"], r["listing"]  # no .partial left behind, the first save intact
        assert r["loaded"] == 2 and r["resumed"] == 2  # the first save loads and trains on
        assert r["returned"] is False and r["after"] == 2 and r["finite"], r
        assert r["left"] == ["step2"], r["left"]


def test_resume_under_a_changed_acco_block_carries_on_and_names_what_changed(tmp_path):
    got = run_distributed(T.changed_block_job, 2, folder=str(tmp_path / "ck"), timeout=300)
    expected = {"policy adaptive": ["acco.policy: saved 'fixed', now 'adaptive'",
                                    "acco.max_micro_batches_per_round: saved None, now 2"],
                "int8 reduce-scatter with error feedback": ["acco.comm_quantization: saved 'none', now 'int8'",
                                                             "acco.error_feedback: saved False, now True"],
                "int8 all-gathers": ["acco.all_gather_quantization: saved 'none', now 'int8'"],
                "mode sync": ["acco.mode: saved 'acco', now 'sync'"],
                "mode dpu": ["acco.mode: saved 'acco', now 'dpu'"],
                "mode auto": ["acco.mode: saved 'acco', now 'auto'"]}
    for r, res in enumerate(got):
        for label, fields in expected.items():
            run = res[label]
            assert run["steps"] == 2, (label, run["steps"])  # resumed at the save's commit
            losses = run["losses"]
            assert all(math.isfinite(v) for v in losses), (label, losses)
            assert losses[-1] < losses[0], (label, losses)  # still learning the fixed batch
            if r == 0:  # one line, from rank 0, naming each changed field
                assert len(run["lines"]) == 1, (label, run["lines"])
                for field in fields:
                    assert field in run["lines"][0], (label, run["lines"][0])
                assert "rebuilt from the committed parameters" in run["lines"][0]
            else:
                assert run["lines"] == []
        msg = res["ranks differ"]
        assert msg and msg.startswith("AccoConfigError") and "acco.policy: rank 0 'fixed', rank 1 'adaptive'" in msg, msg


def test_fsdp_resume_under_a_changed_acco_block_names_what_changed(tmp_path):
    got = run_distributed(T.fsdp_changed_block_job, 2, folder=str(tmp_path / "ck"), timeout=300)
    fields = {"mode sync": ["acco.mode: saved 'acco', now 'sync'"],
              "int8": ["acco.comm_quantization: saved 'none', now 'int8'", "acco.error_feedback: saved False, now True"]}
    for rank, res in enumerate(got):
        for label, want in fields.items():
            run = res[label]
            assert run["loaded"] >= 1 and run["trained"] == 2 and run["finite"], (label, run)
            lines = [s for s in run["lines"] if "changed acco block" in s]
            if rank == 0:
                assert len(lines) == 1 and "rebuilt from the committed parameters" in lines[0], run["lines"]
                assert all(f in lines[0] for f in want), lines[0]
            else:
                assert lines == []
