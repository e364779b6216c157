"""Small helpers for :mod:`examples.train_lm`: metrics, JSONL logging, distributed sums.

Kept apart so the training script reads top to bottom as a plain DeepSpeed loop.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from examples.shakespeare import validation_loss


def comm_hidden_pct(engine) -> Optional[float]:
    """Percentage of gradient communication hidden behind compute, or None for a stock
    DeepSpeed engine (it has no ``.acco`` round engine and no such measurement)."""
    acco = getattr(engine, "acco", None)
    if acco is None:
        return None
    return float(acco.telemetry.summary()["comm_hidden_pct"])


def format_pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def _collective_device() -> torch.device:
    """NCCL only moves GPU tensors; gloo and MPI move CPU ones."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Sum a few floats over all ranks (float64, so token counts stay exact)."""
    t = torch.tensor(list(values), dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.to(_collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.to(_collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_gather_ints(value: int) -> list[int]:
    """Every rank's ``value``, in rank order."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [int(value)]
    device = _collective_device()
    out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor([int(value)], dtype=torch.int64, device=device))
    return [int(t.item()) for t in out]


def distributed_validation_loss(model: torch.nn.Module, batches: list, rank: int, world_size: int,
                                lockstep: bool = False) -> float:
    """Token-weighted mean loss over ``batches``; each rank scores ``batches[rank::world_size]``
    and the sums are all-reduced, so every rank returns the same number. Collective.

    ``lockstep``: every rank runs the same number of forwards, a rank with fewer batches scoring
    ``batches[0]`` again and dropping it. Under FSDP a forward is itself a collective (its
    all-gathers), so 3 batches on 2 ranks would otherwise leave one rank waiting for ever."""
    mine = batches[rank::world_size]
    total = count = 0.0
    if mine:
        count = float(sum(int((b["labels"][:, 1:] != -100).sum()) for b in mine))
        total = validation_loss(model, mine) * count
    extra = -(-len(batches) // world_size) - len(mine)
    if lockstep and extra and batches:
        validation_loss(model, batches[:1] * extra)  # for its collectives; the loss is dropped
    total, count = all_reduce_sum([total, count])
    return total / count if count else float("nan")


class StepMeter:
    """Local training statistics between optimizer steps, and throughput since the start.

    Time spent in evaluation and checkpointing is excluded via :meth:`pause`, so tokens/s
    measures training only. No collectives here: a per-step all-reduce would put a
    synchronisation point between ranks into every step and hide nothing. Nor a device read per
    micro-batch: a loss is kept on its device and the step's losses are read together in
    :meth:`end_step`. A ``loss.item()`` after every backward would make the host wait for that
    micro-batch's kernels, so on a GPU it could never queue the next one ahead, and whatever the host
    does between micro-batches (a swap's bookkeeping, the data loader) would leave the device idle.
    """

    def __init__(self, tokens_per_micro_batch: int, world_size: int):
        self.tokens_per_micro_batch = tokens_per_micro_batch
        self.world_size = world_size
        self.start = time.perf_counter()
        self.paused_s = 0.0
        self.micro_batches = 0  # on this rank, since the start of this run
        self._step_losses: list = []  # tensors (on the loss's device) or floats, read at the step's end
        self.last_step_losses: list[float] = []

    def add_micro_batch(self, loss) -> None:
        """``loss``: the micro-batch's loss, a tensor (kept, detached, where it is) or a float."""
        self.micro_batches += 1
        self._step_losses.append(loss.detach() if torch.is_tensor(loss) else float(loss))

    def end_step(self) -> float:
        """Close the current optimizer step; returns its mean micro-batch loss on this rank (one device read)."""
        self.last_step_losses, self._step_losses = _floats(self._step_losses), []
        return self.step_loss()

    def step_loss(self) -> float:
        losses = self.last_step_losses
        return sum(losses) / len(losses) if losses else float("nan")

    def pause(self):
        meter = self

        class _Pause:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                meter.paused_s += time.perf_counter() - self.t0

        return _Pause()

    @property
    def train_s(self) -> float:
        return max(time.perf_counter() - self.start - self.paused_s, 1e-9)

    @property
    def local_tokens(self) -> int:
        return self.micro_batches * self.tokens_per_micro_batch

    def tokens_per_s_estimate(self) -> float:
        """All ranks, assuming they ran as many micro-batches as this one (exact for the
        stock engine and the fixed policy; an estimate under the adaptive policy)."""
        return self.local_tokens * self.world_size / self.train_s


class JsonlLog:
    """Appends one JSON object per line; a no-op without a path (and on ranks other than 0)."""

    def __init__(self, path: Optional[str], enabled: bool = True):
        self.file = None
        if path and enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.file = open(path, "a", encoding="utf-8")

    def write(self, **record) -> None:
        if self.file is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _floats(values: list) -> list[float]:
    """Floats of a step's losses, the tensors among them read in one transfer."""
    tensors = [v.reshape(()).float() for v in values if torch.is_tensor(v)]
    if not tensors:
        return [float(v) for v in values]
    read = iter(torch.stack(tensors).tolist())
    return [next(read) if torch.is_tensor(v) else float(v) for v in values]
