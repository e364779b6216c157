"""A streaming state saved by one number of ranks, continued on another.

Each rank saved its shard of every fragment's global parameters and outer momentum; with another number of ranks they
are concatenated and cut again, exactly. What cannot be re-cut starts afresh: the int8 error-feedback residuals (each is
one rank's view of its own sends) restart at zero, and a round that was waiting to be merged is merged now (its result
is already in the saved anchor). The replica and the inner optimizer are the front end's to load (rank ``r`` continues
saved rank ``r mod N_saved``'s).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ds_acco.config import check_saved_state_fits
from ds_acco.errors import AccoConfigError


def load_resharded(fragments: Sequence, saved: Sequence[dict], *, fingerprint: str, rank: int, alpha: float,
                   device: torch.device) -> tuple[int, int]:
    """Restore the engine's ``fragments`` from *every* saved rank's state dict (rank order); returns
    ``(inner_steps, round_index)`` to continue from."""
    first = saved[0]
    numels = [f.layout.numel for f in fragments]
    check_saved_state_fits(first, {"fingerprint": fingerprint, "numels": numels},
                           "the streaming state", "Use the same acco block and model.")
    if len(saved) != first["world_size"]:
        raise AccoConfigError(f"the streaming state of a {first['world_size']}-rank job needs every rank's "
                              f"state; got {len(saved)}")
    for p, frag in enumerate(fragments):
        n = numels[p]
        parts = [state["fragments"][p] for state in saved]
        frag.anchor.zero_()
        frag.anchor[:n].copy_(parts[0]["anchor"][:n])
        frag.master.copy_(_my_shard(frag, [x["master"] for x in parts], rank, device))
        outer = frag.outer.state_dict()
        buffers = [x["outer"]["state"].get(0, {}).get("momentum_buffer") for x in parts]
        outer["state"] = {0: {"momentum_buffer": _my_shard(frag, buffers, rank, device)}} if all(
            b is not None for b in buffers) else {}
        frag.outer.load_state_dict(outer)
        frag.last_sync = parts[0]["last_sync"]
        if frag.rs is not None:
            frag.rs.reset_error_feedback()
    pending = first["pending"]
    if pending is not None:
        frag = fragments[pending["fragment"]]
        frag.flat.mul_(alpha).add_(frag.anchor, alpha=1.0 - alpha)
        frag.last_sync = pending["step"]
    return first["inner_steps"], first["round_index"]


def _my_shard(frag, shards: Sequence[torch.Tensor], rank: int, device: torch.device) -> torch.Tensor:
    """This rank's slice of a fragment-sized fp32 vector saved as another job's shards."""
    full = torch.zeros(frag.layout.padded_numel, dtype=torch.float32, device=device)
    n = frag.layout.numel
    full[:n].copy_(torch.cat([s.to(device, torch.float32) for s in shards])[:n])
    return frag.layout.shard(full, rank).clone()
