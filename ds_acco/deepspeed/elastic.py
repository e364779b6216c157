"""Loading an ACCO/ZeRO-1 checkpoint with a different data-parallel world size.

DeepSpeed refuses a ZeRO-1 optimizer checkpoint saved with another DP size;
its supported route is the *universal checkpoint*: ``ds_to_universal`` turns the
per-rank partitions into per-parameter fp32 fragments (weights, Adam moments,
step), and ``load_universal`` re-partitions them for the current world. This
module runs that conversion once (rank 0, into ``<load_dir>/<tag>.universal``)
and loads from it. The ACCO round state is per-rank and ``O(params / N)``; it
does not survive a change of N, so rounds bootstrap afresh, and the module's
compute parameters are restored from the checkpoint so training resumes from
exactly the weights it was saved with.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Iterator

import torch

MODEL_STATES = "mp_rank_00_model_states.pt"
DONE_MARKER = "ds_acco_conversion_complete"


def saved_dp_world_size(load_dir: str, tag: str) -> int:
    state = torch.load(os.path.join(load_dir, tag, MODEL_STATES), map_location="cpu", weights_only=False)
    return int(state["dp_world_size"])


def saved_module_state(load_dir: str, tag: str) -> dict:
    return torch.load(os.path.join(load_dir, tag, MODEL_STATES), map_location="cpu", weights_only=False)["module"]


def universal_dir(load_dir: str, tag: str) -> str:
    return os.path.join(load_dir, f"{tag}.universal")


def convert_to_universal(load_dir: str, tag: str) -> str:
    """Convert ``<load_dir>/<tag>`` once; returns the folder to load with ``load_universal``."""
    from deepspeed.checkpoint import ds_to_universal

    root = universal_dir(load_dir, tag)
    if os.path.exists(os.path.join(root, DONE_MARKER)):
        return root
    args = argparse.Namespace(
        input_folder=os.path.join(load_dir, tag), output_folder=os.path.join(root, tag),
        num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
        inject_missing_state=True,
    )
    ds_to_universal.main(args)
    with open(os.path.join(root, DONE_MARKER), "w", encoding="utf-8") as f:
        f.write(tag)
    return root


@contextlib.contextmanager
def universal_loading(engine) -> Iterator[None]:
    saved = engine._config.load_universal_checkpoint
    engine._config.load_universal_checkpoint = True
    try:
        yield
    finally:
        engine._config.load_universal_checkpoint = saved
