"""Verification of DeepSpeed-layout checkpoints, shared by both DeepSpeed front ends.

A ds_acco DeepSpeed tag holds DeepSpeed's files (``mp_rank_00_model_states.pt``, one
``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per rank under ZeRO-1) plus one ds_acco state file per rank (round state
or streaming state) and the manifest. With the saved world size each rank reads the model file, its own optimizer file
and its own state file, and hashes its own files and its share of the model file's ranges (see
:func:`ds_acco.checkpoint.manifest.share_out`), while DeepSpeed parses them (see :mod:`ds_acco.checkpoint.gate`); after
a world-size change every rank may read every file, so every file is hashed, before anything is read.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
from typing import Optional

from ds_acco.checkpoint.gate import PendingVerdict
from ds_acco.checkpoint.safe_load import classes_beyond
from ds_acco.checkpoint.manifest import read_manifest, tag_files
from ds_acco.checkpoint.verify import describe, size_problems, verify_for_load
from ds_acco.errors import CheckpointError

from . import _internals as internals

logger = logging.getLogger("ds_acco")

MODEL_FILE = "mp_rank_00_model_states.pt"
OPTIM_FILE = "zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def start_verify_tag(load_dir: str, tag: str, *, state_file: str, dp_rank: int, dp_world: int, salvage: bool,
                     group, timeout_s: float, key: Optional[bytes] = None, weights_only: bool = True) -> PendingVerdict:
    """Start verifying ``load_dir/tag`` in the background (see :mod:`ds_acco.checkpoint.gate`); collective over
    ``group`` (a :class:`~ds_acco.checkpoint.gate.VerificationGroup`'s), on a background thread.

    The manifest is read and every file's size checked here, on the calling thread: that is cheap, and tells whether the
    load may run while the hashes do (``pending.up_front`` False) or must wait for the verdict first: no usable
    manifest, another world size than at the save, salvage on, a file missing or of the wrong size, or a signing key (a
    signed checkpoint's files are parsed only once the signature and every hash are checked). ``state_file`` has a
    ``{rank}`` field; ``weights_only`` refuses files whose pickles name classes beyond DeepSpeed's
    (:mod:`ds_acco.checkpoint.safe_load`).
    """
    folder = os.path.join(load_dir, tag)
    if tag.endswith(".partial") or not os.path.isdir(folder):
        what = "is a save that did not finish" if tag.endswith(".partial") else "does not exist"
        raise CheckpointError(describe(folder, {"(tag folder)": f"expected a complete checkpoint, found it {what}"},
                                       f"named by {os.path.join(load_dir, 'latest')} or the caller"))
    pattern = state_file.format(rank="*")
    saved = sorted(glob.glob(os.path.join(folder, pattern)))
    manifest_read = read_manifest(folder)
    manifest = manifest_read[0]
    saved_world = manifest["world_size"] if manifest else len(saved)
    if saved_world == dp_world:
        reads = [MODEL_FILE, OPTIM_FILE.format(rank=dp_rank), state_file.format(rank=dp_rank)]
    else:
        reads = manifest["files"] if manifest else tag_files(folder)
    scan = (lambda path: classes_beyond(path, internals.CHECKPOINT_CLASSES)) if weights_only else None
    return PendingVerdict(
        lambda: verify_for_load(folder, reads=reads, ours=bool(saved), salvage=salvage, group=group,
                                droppable=lambda name: fnmatch.fnmatch(name, pattern), manifest_read=manifest_read,
                                key=key, scan=scan),
        folder, timeout_s, manifest=manifest,
        up_front=manifest is None or saved_world != dp_world or salvage or key is not None
        or bool(size_problems(folder, manifest)))


def refuse_if_written_by_ds_acco(load_dir: str, tag: str, client_state: Optional[dict]) -> None:
    """After an unverified (stock) load: a tag whose client state says ds_acco wrote it lost its own files."""
    if client_state and "ds_acco" in client_state:
        folder = os.path.join(load_dir, tag)
        raise CheckpointError(describe(folder, {
            "ds_acco_manifest.json and acco_*_dp_rank_<r>.pt": "expected present (its model file says ds_acco "
            "wrote it), found none"}, "is missing parts"))

