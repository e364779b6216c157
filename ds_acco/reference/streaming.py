"""A single-process, unsharded Streaming DiLoCo (``docs/algorithms.md``, section streaming).

It simulates ``N`` workers in one process with no threads or collectives and full-precision exchanges (no int8, fp32
all-gather), so it reads like the spec; the tests compare :mod:`ds_acco.streaming` against it. Worker ``w`` consumes one
micro-batch per inner step, in order ``0, 1, 2, ...``, exactly as a real rank iterates its data loader. With ``P = 1``
and ``tau = 0`` it is plain DiLoCo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from .rules import GradFn


@dataclass
class StreamingTrace:
    """What the simulated job did.

    Attributes:
        workers: per inner step (1-based step ``s`` at index ``s - 1``), every worker's
            ``θ_i`` after that step's sync logic.
        global_params: ``θ_g`` after each inner step.
        syncs: ``(launch_step, fragment, applied_step)`` for every round.
    """

    workers: list[list[list[torch.Tensor]]] = field(default_factory=list)
    global_params: list[list[torch.Tensor]] = field(default_factory=list)
    syncs: list[tuple[int, int, int]] = field(default_factory=list)


def streaming_reference(
    params: Sequence[torch.Tensor],
    grad_fn: GradFn,
    make_inner_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    world_size: int,
    fragments: Sequence[Sequence[int]],
    steps: int,
    *,
    sync_every: int,
    overlap_steps: int = 0,
    alpha: float = 0.5,
    outer_lr: float = 0.7,
    outer_momentum: float = 0.9,
    first_step: int = 0,
) -> StreamingTrace:
    """Run ``steps`` inner steps of Streaming DiLoCo on ``world_size`` simulated workers from ``θ_0 = params`` (every
    worker's and ``θ_g``); ``grad_fn(worker, k, params)`` is the gradient of a worker's ``k``-th micro-batch,
    ``fragments`` are ``P`` lists of indices into ``params``, and ``sync_every`` / ``overlap_steps`` / ``alpha`` /
    ``outer_lr`` / ``outer_momentum`` are ``H``, ``tau``, ``α`` and the outer Nesterov SGD, as in ``acco.streaming``;
    ``first_step``: the job's steps before the first inner step (a phase entered mid-job: its fragment schedule
    counts the job's steps, so fragment ``p`` still syncs at the job's steps ``≡ p·H/P (mod H)``). The trace counts
    inner steps from 1."""
    N, H, P, tau = world_size, sync_every, len(fragments), overlap_steps
    workers = [[torch.nn.Parameter(p.detach().clone().float()) for p in params] for _ in range(N)]
    inner = [make_inner_optimizer(ws) for ws in workers]
    theta_g = [torch.nn.Parameter(p.detach().clone().float()) for p in params]
    outer = [
        torch.optim.SGD([theta_g[i] for i in frag], lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
        for frag in fragments
    ]
    due_fragment = {p * H // P: p for p in range(P)}  # fragment p syncs at steps t ≡ p·H/P (mod H)
    trace = StreamingTrace()
    pending: Optional[tuple[int, int, int, list[torch.Tensor]]] = None  # (fragment, launch, due, θ_g,p)

    def merge(frag_index: int, gathered: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for w in range(N):
                for i, g in zip(fragments[frag_index], gathered):
                    workers[w][i].mul_(alpha).add_(g, alpha=1.0 - alpha)  # θ_i ← α θ_i + (1 − α) θ_g

    for step in range(1, steps + 1):
        for w in range(N):  # one inner step per worker on its (step - 1)-th micro-batch
            for p, g in zip(workers[w], grad_fn(w, step - 1, workers[w])):
                p.grad = g.detach().clone()
            inner[w].step()
            inner[w].zero_grad(set_to_none=True)
        if pending is not None and step >= pending[2]:
            merge(pending[0], pending[3])
            trace.syncs.append((pending[1], pending[0], step))
            pending = None
        frag_index = due_fragment.get((first_step + step) % H)
        if frag_index is not None:
            with torch.no_grad():
                for i in fragments[frag_index]:
                    total = torch.zeros_like(theta_g[i])
                    for w in range(N):
                        total += theta_g[i] - workers[w][i]  # Δ = θ_g − θ_i
                    theta_g[i].grad = total / N
            outer[frag_index].step()
            outer[frag_index].zero_grad(set_to_none=True)
            gathered = [theta_g[i].detach().clone() for i in fragments[frag_index]]
            pending = (frag_index, step, step + tau, gathered)
            if tau == 0:
                merge(frag_index, gathered)
                trace.syncs.append((step, frag_index, step))
                pending = None
        trace.workers.append([[p.detach().clone() for p in ws] for ws in workers])
        trace.global_params.append([p.detach().clone() for p in theta_g])
    return trace
