"""DeepSpeed universal checkpoints of a ds_acco job, tried as a new user would (tests/test_universal_checkpoint.py).

The job saves as any ds_acco script does; ``ds_to_universal`` converts the tag as its command line would, without
``--inject_missing_state`` (the save wrote ``universal_checkpoint_info``); then stock ZeRO-1, ds_acco ``sync`` and
ds_acco ``acco`` each resume from the universal folder with DeepSpeed's own switch, ``checkpoint.load_universal``.
"""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist

from tests import checkpoint_workloads as C
from tests import ds_workloads as D
from tests import workloads as W

SAVED_STEPS, MORE_STEPS = 3, 3


def save_convert_resume(rank, world, *, folder: str) -> dict:
    """Save under ds_acco (acco, 3 steps), convert on rank 0, resume three ways from the universal folder."""
    from deepspeed.checkpoint import ds_to_universal

    from tests.log_capture import ds_acco_lines

    G = 4
    saving = C.engine_of(D.ds_config(G, {"mode": "acco", "warmup_steps": 1}, clip=0.5))
    C.train(saving, 0, SAVED_STEPS, [])
    saving.save_checkpoint(folder, tag="saved")
    saving.destroy()
    if rank == 0:  # what `python ds_to_universal.py --input_folder ... --output_folder ...` runs
        ds_to_universal.main(argparse.Namespace(
            input_folder=os.path.join(folder, "saved"), output_folder=os.path.join(folder, "universal"),
            num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
            inject_missing_state=False))
    dist.barrier()
    out = {}
    for name, acco in (("stock", None), ("sync", {"mode": "sync"}), ("acco", {"mode": "acco", "warmup_steps": 1})):
        config = dict(D.ds_config(G, acco, clip=0.5), checkpoint={"load_universal": True})
        engine = C.engine_of(config, stock=acco is None)
        with ds_acco_lines() as lines:
            engine.load_checkpoint(folder, tag="universal")
        loaded = [p.detach().clone() for p in W.ordered_params(engine.module)]
        out[name] = {"step": engine.global_steps, "loaded": loaded, "lines": list(lines),
                     "after": C.train(engine, SAVED_STEPS * G, SAVED_STEPS + MORE_STEPS, [])}
        engine.destroy()
    out["files"] = sorted(os.listdir(os.path.join(folder, "universal")))
    return out
