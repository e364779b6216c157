"""Agreement on the rounds launched, before a drain or an export under the adaptive policy.

Under the adaptive policy each rank ends a round when it sees the round's
communication end, and launches the next one in the same call. Where training
loops stop at a micro-batch count (HF Trainer's ``max_steps``) or pause for an
export, one rank may therefore already have launched round ``k + 1`` while another
has not: round ``k + 1`` needs the peer to join its collectives, so waiting for it
would hang, and the two ranks would disagree on the committed parameters. (A rank
cannot get further ahead: ending round ``k + 1`` needs every rank in it.) Before
draining or exporting, the ranks exchange their launch counts; a rank that is behind
launches the round now, with the micro-batches it has (possibly none: the mean
weighs ranks by their counts). Under the fixed policy every rank launches at the
same micro-batch, so nothing is exchanged.

The exchange runs on the training thread while a round may be in flight on the
communication thread, so it has its own process group.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ds_acco.comm.collectives import RoundCollectives


class RoundAlignment:
    """Small training-thread collectives on a group of their own (adaptive policy; no-ops otherwise)."""

    def __init__(self, coll: RoundCollectives, enabled: bool, timeout_s: float, device: torch.device):
        self.group, self.device = None, device
        if enabled and coll.world_size > 1:
            ranks = dist.get_process_group_ranks(coll.group)
            # every rank of the default group takes part in new_group (as in RoundCollectives)
            self.group = dist.new_group(ranks=ranks, timeout=timedelta(seconds=timeout_s))

    def _max(self, value: int) -> int:
        if self.group is None:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def most_launched(self, launched: int) -> int:
        """The most rounds any rank has launched."""
        return self._max(launched)

    def anyone(self, flag: bool) -> bool:
        """True when ``flag`` is true on some rank (under the fixed policy: this rank's ``flag``)."""
        return bool(self._max(int(flag)))

    def destroy(self) -> None:
        if self.group is not None:
            try:
                dist.destroy_process_group(self.group)
            except (RuntimeError, ValueError):
                pass
            self.group = None
