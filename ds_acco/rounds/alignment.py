"""Agreement on the rounds launched, before a drain or an export under the adaptive policy.

Under the adaptive policy each rank ends a round when it sees the round's communication end, and launches the next one
in the same call. Where training loops stop at a micro-batch count (HF Trainer's ``max_steps``) or pause for an export,
one rank may therefore already have launched round ``k + 1`` while another has not: round ``k + 1`` needs the peer to
join its collectives, so waiting for it would hang, and the two ranks would disagree on the committed parameters. (A
rank cannot get further ahead: ending round ``k + 1`` needs every rank in it.) Before draining or exporting, the ranks
exchange their launch counts; a rank that is behind launches the round now, with the micro-batches it has (possibly
none: the mean weighs ranks by their counts). Under the fixed policy every rank launches at the same micro-batch, so
nothing is exchanged.

The exchange runs on the training thread while a round may be in flight on the communication thread, so it has its own
process group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ds_acco.comm.collectives import RoundCollectives


class RoundAlignment:
    """Small training-thread collectives on a group of their own (adaptive policy; no-ops otherwise)."""

    def __init__(self, coll: RoundCollectives, enabled: bool, timeout_s: float, device: torch.device):
        self.device = device
        self._own = RoundCollectives(coll.group, timeout_s) if enabled and coll.world_size > 1 else None

    def most(self, value: int) -> int:
        """The largest ``value`` of any rank (e.g. rounds launched; under the fixed policy: this rank's)."""
        if self._own is None:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._own.group)
        return int(t.item())

    def anyone(self, flag: bool) -> bool:
        """True when ``flag`` is true on some rank (under the fixed policy: this rank's ``flag``)."""
        return bool(self.most(int(flag)))

    def destroy(self) -> None:
        if self._own is not None:
            self._own.destroy()
            self._own = None
