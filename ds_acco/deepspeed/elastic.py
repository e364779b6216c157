"""Loading an ACCO/ZeRO-1 checkpoint with a different data-parallel world size.

DeepSpeed refuses a ZeRO-1 optimizer checkpoint saved with another DP size; its supported route is the *universal
checkpoint*: ``ds_to_universal`` turns the per-rank partitions into per-parameter fp32 fragments (weights, Adam moments,
step), and ``load_universal`` re-partitions them for the current world. This module runs that conversion once (rank
0, into ``<load_dir>/<tag>.universal``) and loads from it. The ACCO round state is per-rank and ``O(params / N)``; it
does not survive a change of N, so rounds bootstrap afresh, and the module's compute parameters are restored from the
checkpoint so training resumes from exactly the weights it was saved with.
"""

from __future__ import annotations

import logging
import os
from deepspeed import comm as ds_dist
from deepspeed.runtime.engine import DeepSpeedEngine

from ds_acco.checkpoint import safe_load

from . import _internals as internals
from .verify import MODEL_FILE

logger = logging.getLogger("ds_acco")

DONE_MARKER = "ds_acco_conversion_complete"


def _model_states(load_dir: str, tag: str, weights_only: bool) -> dict:
    return safe_load.load(os.path.join(load_dir, tag, MODEL_FILE), map_location="cpu",
                          allow=internals.CHECKPOINT_CLASSES, weights_only=weights_only)


def saved_dp_world_size(load_dir: str, tag: str, weights_only: bool = True) -> int:
    return int(_model_states(load_dir, tag, weights_only)["dp_world_size"])


def universal_dir(load_dir: str, tag: str) -> str:
    return os.path.join(load_dir, f"{tag}.universal")


def convert_to_universal(load_dir: str, tag: str, weights_only: bool = True) -> str:
    """Convert ``<load_dir>/<tag>`` once; returns the folder to load with ``load_universal``.

    DeepSpeed's converter calls ``torch.load(weights_only=False)`` itself: it runs with every
    ``torch.load`` restricted to the classes its files hold (see :mod:`ds_acco.checkpoint.safe_load`).
    """
    root = universal_dir(load_dir, tag)
    if os.path.exists(os.path.join(root, DONE_MARKER)):
        return root
    with safe_load.torch_load_restricted(internals.CHECKPOINT_CLASSES, weights_only):
        internals.convert_to_universal(os.path.join(load_dir, tag), os.path.join(root, tag))
    with open(os.path.join(root, DONE_MARKER), "w", encoding="utf-8") as f:
        f.write(tag)
    return root


def load_universal(engine: DeepSpeedEngine, load_dir: str, tag: str, options, weights_only: bool) -> tuple:
    """DeepSpeed's own load of the universal checkpoint ``load_dir/tag`` (re-partitioned for this world; the compute
    parameters set from the fp32 masters), with every ``torch.load`` restricted (its loader calls
    ``torch.load(weights_only=False)`` itself). ``options``: a :class:`~ds_acco.deepspeed.checkpoint_io.LoadOptions`.
    Collective: every rank calls it."""
    try:
        with internals.universal_loading(engine), safe_load.torch_load_restricted(internals.CHECKPOINT_CLASSES,
                                                                                   weights_only):
            return DeepSpeedEngine.load_checkpoint(engine, load_dir, tag, options.strict, options.optimizer_states,
                                                   options.lr_scheduler_states)
    except IndexError as exc:
        raise RuntimeError(
            f"DeepSpeed's universal-checkpoint loader could not re-partition {load_dir}/{tag} for "
            f"dp={engine.dp_world_size}: a parameter group is so small that some rank would own only padding. Load "
            "with the saved world size, or merge small parameter groups."
        ) from exc


def load_resharded(engine: DeepSpeedEngine, load_dir: str, tag: str, options, saved_dp: int,
                   weights_only: bool) -> tuple:
    """Load ``load_dir/tag`` (saved with ``saved_dp`` ranks) into ``engine`` through a universal checkpoint, then the
    module's parameters as they were saved (an ACCO estimate, possibly). Collective: every rank calls it."""
    if engine.global_rank == 0:
        logger.info("ds_acco: %s/%s was saved with dp=%d; re-partitioning through a universal checkpoint",
                    load_dir, tag, saved_dp)
        convert_to_universal(load_dir, tag, weights_only)
    ds_dist.barrier()
    out = load_universal(engine, universal_dir(load_dir, tag), tag, options, weights_only)
    # The universal loader sets the compute parameters from the fp32 masters; restore the
    # weights the model actually had when it was saved (an ACCO estimate, possibly).
    engine.module.load_state_dict(_model_states(load_dir, tag, weights_only)["module"], strict=options.strict)
    return out
