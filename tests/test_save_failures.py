"""A full disk during a save: every rank fails it with one message, ``latest`` stays, the partial tag goes.

The save folder is a real tmpfs sized for one and a half checkpoints (mounting needs root, as on
this project's CI machines; elsewhere the test says so and skips). Real DeepSpeed engines on the
pooled gloo ranks of tests/dist_harness.py.
"""

from __future__ import annotations

import subprocess

import pytest

from tests import trust_workloads as T
from tests.dist_harness import run_distributed


@pytest.fixture
def small_disk(tmp_path):
    whole, tag = run_distributed(T.one_save_size, 2, folder=str(tmp_path / "measure"), timeout=120)[0]
    mount = tmp_path / "small"
    mount.mkdir()
    pages = (whole + tag // 2 + 4095) // 4096  # one save and half a tag
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages * 4096}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield str(mount), tag
    subprocess.run(["umount", "-l", str(mount)], check=False)


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
