"""A checkpoint the previous release wrote resumes bit-identically: the round state's format is a promise.

tests/data/pre_issue48/ holds checkpoints written by the code before issue 48's refactor (plain front end: the
round state with a kept int4 estimate, int8 residuals and a pending round; DeepSpeed: its files, the round state
and the manifest), each rank's parameters after the save beside them (tests/compat_workers.py made both).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tests import compat_workers as C
from tests.dist_harness import run_distributed

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "pre_issue48")
LIBRARY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds_acco")


def _assert_resumed_exactly(got: list, label: str) -> None:
    for rank, (after, where) in enumerate(got):
        assert os.path.dirname(where) == LIBRARY, where  # this checkout's library resumed it
        want = torch.load(os.path.join(DATA, f"{label}_rank{rank}.after.pt"), weights_only=True)
        assert len(after) == len(want) > 2, (label, rank, len(after), len(want))
        for step, (a, b) in enumerate(zip(after, want)):
            for x, y in zip(a, b):
                assert torch.equal(x, y), f"{label}: rank {rank}, swap {step} after the resume differs"


@pytest.mark.parametrize("name", sorted(C.PLAIN))
def test_a_plain_checkpoint_of_the_previous_release_resumes_exactly(tmp_path, name):
    for rank in range(2):
        shutil.copy(os.path.join(DATA, f"plain_{name}_rank{rank}.pt"), tmp_path)
    _assert_resumed_exactly(run_distributed(C.plain_job, 2, name=name, folder=str(tmp_path), write=False),
                            f"plain_{name}")


def test_a_deepspeed_checkpoint_of_the_previous_release_resumes_exactly(tmp_path):
    """Its manifest verifies (the files are the ones written then) and the round state loads."""
    shutil.copytree(os.path.join(DATA, "deepspeed"), tmp_path / "deepspeed")
    _assert_resumed_exactly(run_distributed(C.deepspeed_job, 2, folder=str(tmp_path / "deepspeed"), write=False),
                            "deepspeed")
