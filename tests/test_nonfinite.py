"""A NaN/inf in one rank's gradients skips that commit on every rank, consistently."""

from __future__ import annotations

import torch

from tests import workloads as W
from tests.dist_harness import run_distributed


def test_nan_on_one_rank_skips_the_commit_everywhere():
    # acco, G=4: rounds E0(mb 0-1) C0(2-3) E1(4-5) C1(6-7) ...; a NaN in rank 1's micro-batch 6 poisons C1
    res = run_distributed(W.train_with_engine, 2, config={"mode": "acco"}, G=4, steps=5, poison=(1, 6))
    for r in res:
        assert r["summary"]["skipped_steps"] == 1
        assert r["skipped"][:5] == [False, False, False, True, False]
        traj = r["trajectory"]
        for a, b in zip(traj[1], traj[0]):  # the skipped step left θ unchanged
            assert torch.equal(a, b)
        assert all(torch.isfinite(p).all() for p in traj[-1])
        assert not torch.equal(traj[2][0], traj[1][0])  # training went on
    for a, b in zip(res[0]["trajectory"][-1], res[1]["trajectory"][-1]):
        assert torch.equal(a, b)


def test_nan_in_estimate_half_skips_estimate_and_its_commit():
    res = run_distributed(W.train_with_engine, 2, config={"mode": "acco"}, G=4, steps=4, poison=(0, 4))
    r = res[0]
    assert r["skipped"][:4] == [False, False, True, True]
    assert r["summary"]["skipped_steps"] == 1
    for a, b in zip(r["trajectory"][1], r["trajectory"][0]):
        assert torch.equal(a, b)
