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
