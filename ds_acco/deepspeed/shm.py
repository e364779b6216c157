"""DeepSpeed's per-rank shared-memory segments, unlinked once every rank has mapped them.

Why: when a launcher starts every rank on one CPU node (``LOCAL_SIZE`` equal to the world size, as the ``deepspeed``
launcher sets it), DeepSpeed's communication backend creates a 66 MB ``/dev/shm`` segment per rank for its shared-memory
all-reduce (``deepspeed/ops/csrc/cpu/comm/shm.cpp``, named
``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``) and never unlinks it. ``/dev/shm`` is memory:
every launch leaves ``world_size x 66 MB`` behind, after a clean exit as after a crash, until the node reboots (found on
the CI machine: 254 segments, 16 GB of its 24 GB, after a day of test and benchmark launches; a full ``/dev/shm`` later
kills jobs with SIGBUS). A segment's name is only needed until every rank has mapped it, which each rank does before
DeepSpeed's initialisation returns; after that the mappings stay valid without the name, and the kernel frees the memory
when the last process using it exits, however it exits.
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional


def segment_path(rank: int) -> str:
    """Where DeepSpeed's segment of ``rank`` lives, for this job's ``MASTER_ADDR``/``MASTER_PORT``."""
    return (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{rank}")


def release_shm_names() -> Optional[str]:
    """Unlink this rank's DeepSpeed segment name once every rank has mapped every segment; collective
    (a barrier over DeepSpeed's world) where DeepSpeed created segments, a no-op elsewhere. Returns the path
    unlinked, or None when DeepSpeed created no segment (GPU backends, ranks on several nodes, no local launcher).
    """
    from deepspeed import comm as ds_comm

    from . import _internals as internals

    if not internals.shm_segments_made() or not ds_comm.is_initialized():
        return None
    if os.environ.get("LOCAL_SIZE") != str(ds_comm.get_world_size()):  # DeepSpeed's own condition
        return None
    ds_comm.barrier()  # every rank is past DeepSpeed's initialisation: it has mapped every segment
    path = segment_path(ds_comm.get_rank())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        return path
    return None
