"""DeepSpeed's universal checkpoints, the format users reshape and migrate with, work with ds_acco as with stock ZeRO-1."""

from __future__ import annotations

import pytest
import torch

from tests import universal_workers as U
from tests.dist_harness import run_distributed
from tests.helpers import assert_trajectories_equal


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """One pooled job: save under ds_acco, ``ds_to_universal`` on rank 0, resume stock, sync and acco from it."""
    return run_distributed(U.save_convert_resume, 2, folder=str(tmp_path_factory.mktemp("universal")), timeout=300)


def test_ds_to_universal_converts_a_ds_acco_checkpoint_as_saved(resumed):
    """Without ``--inject_missing_state``: the save wrote ``universal_checkpoint_info`` itself."""
    assert "zero" in resumed[0]["files"] and "mp_rank_00_model_states.pt" in resumed[0]["files"], resumed[0]["files"]


def test_a_ds_acco_job_resumes_from_the_universal_folder_on_every_rank(resumed):
    """The round state is rebuilt from the committed parameters (one line says so, on rank 0); the parameters
    loaded are stock ZeRO-1's, and ds_acco sync trains on from them step for step as stock ZeRO-1 does."""
    for rank, got in enumerate(resumed):
        stock, sync, acco = got["stock"], got["sync"], got["acco"]
        assert stock["step"] == sync["step"] == acco["step"] == U.SAVED_STEPS
        for name in ("sync", "acco"):
            assert all(torch.equal(a, b) for a, b in zip(got[name]["loaded"], stock["loaded"])), (rank, name)
        assert_trajectories_equal(sync["after"], stock["after"], atol=0, rtol=0)
        assert len(acco["after"]) == U.MORE_STEPS and all(torch.isfinite(p).all() for p in acco["after"][-1])
        assert not all(torch.equal(a, b) for a, b in zip(acco["after"][-1], sync["after"][-1]))  # acco ran acco
        said = [line for line in acco["lines"] if "universal checkpoint" in line]
        assert len(said) == (rank == 0) and all("rebuilt" in s or "afresh" in s for s in said), acco["lines"]
    assert all(torch.equal(a, b) for a, b in zip(resumed[0]["acco"]["after"][-1], resumed[1]["acco"]["after"][-1]))
