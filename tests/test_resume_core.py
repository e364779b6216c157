"""A fixed-policy run saved at any micro-batch and resumed in new processes continues bit-identically."""

from __future__ import annotations

import pytest
import torch

from tests import workloads as W
from tests.dist_harness import run_distributed


@pytest.mark.parametrize("mode, save_at, extra", [
    ("acco", 13, {}),
    ("dpu", 10, {}),
    # the int8 residual kept by error feedback is part of the round state
    ("acco", 13, {"comm_quantization": "int8", "error_feedback": True, "quantization_block_size": 8}),
    # low-bit parameter all-gathers: the replicas' int8-rounded parameters are what resumes
    ("acco", 11, {"comm_quantization": "int8", "error_feedback": True, "all_gather_quantization": "int8",
                  "quantization_block_size": 8}),
    # saved with an int4 estimate in flight: what it lost, which the commit sends on, is part of the round state
    ("acco", 11, {"comm_quantization": "int8", "error_feedback": True, "all_gather_quantization": "int8",
                  "estimate_quantization": "int4", "quantization_block_size": 8}),
])
def test_resume_is_bit_identical(tmp_path, mode, save_at, extra):
    kw = dict(config={"mode": mode, "warmup_steps": 1, **extra}, G=4, steps=8, clip=0.5, schedule=True)
    full = run_distributed(W.train_with_engine, 2, **kw)[0]["trajectory"]
    run_distributed(W.train_with_engine, 2, save_at=save_at, ckpt_dir=str(tmp_path), **kw)
    resumed = run_distributed(W.train_with_engine, 2, ckpt_dir=str(tmp_path), resume=True, **kw)[0]["trajectory"]
    assert len(resumed) == len(full) == 8
    for t, (a, b) in enumerate(zip(resumed, full)):
        for x, y in zip(a, b):
            assert torch.equal(x, y), f"step {t} differs after resume"


def _resume_logging(rank, world, **kw):
    """``train_with_engine`` resumed, with ds_acco's WARNING lines of the resume."""
    from tests.log_capture import ds_acco_lines

    with ds_acco_lines() as lines:
        out = W.train_with_engine(rank, world, **kw)
    return dict(out, warnings=lines)


CHANGES = {"mode sync": ({"mode": "sync"}, ["acco.mode: saved 'acco', now 'sync'"]),
           "int8 reduce-scatter": ({"comm_quantization": "int8", "error_feedback": True, "quantization_block_size": 8},
                                   ["acco.comm_quantization: saved 'none', now 'int8'",
                                    "acco.error_feedback: saved False, now True"])}


def test_plain_resume_under_a_changed_block_carries_on_from_the_commit(tmp_path):
    base = {"mode": "acco", "warmup_steps": 1}
    kw = dict(G=4, steps=8, clip=0.5, schedule=True)
    full = run_distributed(W.train_with_engine, 2, config=base, **kw)[0]["trajectory"]
    run_distributed(W.train_with_engine, 2, config=base, save_at=13, ckpt_dir=str(tmp_path), **kw)
    for label, (change, fields) in CHANGES.items():
        got = run_distributed(_resume_logging, 2, config=dict(base, **change), ckpt_dir=str(tmp_path), resume=True,
                              **kw)
        for rank, run in enumerate(got):
            resumed = run["trajectory"]
            # at micro-batch 13 commit 3 had finished (in the masters) but was not swapped in: the resumed run
            # starts from it, so the trajectory (one entry per commit the loop sees) has no entry of its own for it
            assert len(resumed) == 7 and all(torch.isfinite(p).all() for p in resumed[-1]), label
            assert not all(torch.equal(x, y) for x, y in zip(resumed[-1], full[-1])), label  # another block
            lines = [w for w in run["warnings"] if "changed acco block" in w]
            if rank == 0:
                assert len(lines) == 1 and "rebuilt from the committed parameters at step 3" in lines[0], (
                    label, run["warnings"])
                assert all(f in lines[0] for f in fields), lines[0]
            else:
                assert lines == [], label
