"""A single-process, unsharded implementation of ``docs/algorithms.md``.

It simulates ``N`` workers in one process with no threads, buffers or collectives, so it reads like the spec; the tests
compare the distributed engines' trajectories against it. Worker ``w`` consumes its micro-batches in order
``0, 1, 2, ...`` exactly as a real rank iterates its data loader.

``counts`` (optional) gives, for every round in launch order, the number of micro-batches each worker contributed to it;
the adaptive policy records these in telemetry (``RoundRecord.counts``). Without it the fixed-policy quotas apply.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Optional, Sequence

import torch

GradFn = Callable[[int, int, Sequence[torch.Tensor]], Sequence[torch.Tensor]]


class ReferenceRun:
    """State of the simulated job: ``θ``, the optimizer state ``S`` and each worker's data cursor."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        grad_fn: GradFn,
        make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
        world_size: int,
        make_scheduler: Optional[Callable[[torch.optim.Optimizer], object]] = None,
        clip: float = 0.0,
    ):
        self.theta = [torch.nn.Parameter(p.detach().clone().float()) for p in params]
        self.opt = make_optimizer(self.theta)
        self.sched = make_scheduler(self.opt) if make_scheduler else None
        self.grad_fn = grad_fn
        self.N = world_size
        self.clip = clip
        self.cursor = [0] * world_size

    def gradients(self, at: Sequence[torch.Tensor], per_worker: Sequence[int]) -> tuple[list[torch.Tensor], int]:
        """Sum of the next ``per_worker[w]`` micro-batch gradients of every worker, at ``at``."""
        total = [torch.zeros_like(p) for p in self.theta]
        for w in range(self.N):
            for _ in range(per_worker[w]):
                for t, g in zip(total, self.grad_fn(w, self.cursor[w], at)):
                    t += g
                self.cursor[w] += 1
        return total, int(sum(per_worker))

    def _mean(self, grad_sum: Sequence[torch.Tensor], count: int) -> list[torch.Tensor]:
        mean = [g / count for g in grad_sum]
        if self.clip > 0:
            norm = math.sqrt(sum(float(m.double().pow(2).sum()) for m in mean))
            coef = self.clip / (norm + 1e-6)
            if coef < 1.0:
                mean = [m * coef for m in mean]
        return mean

    def step(self, grad_sum, count) -> None:
        """``θ, S ← Opt(θ, S, mean)`` and one scheduler step."""
        self.step_without_scheduler(grad_sum, count)
        if self.sched is not None:
            self.sched.step()

    def lookahead(self, grad_sum, count) -> list[torch.Tensor]:
        """What ``step`` would give, leaving ``θ`` and ``S`` as they were."""
        saved_theta = self.snapshot()
        saved_state = copy.deepcopy(self.opt.state_dict())
        self.step_without_scheduler(grad_sum, count)
        out = self.snapshot()
        with torch.no_grad():
            for p, s in zip(self.theta, saved_theta):
                p.copy_(s)
        self.opt.load_state_dict(saved_state)
        return out

    def step_without_scheduler(self, grad_sum, count) -> None:
        for p, m in zip(self.theta, self._mean(grad_sum, count)):
            p.grad = m
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.theta]


def _quotas(run: ReferenceRun, counts: Optional[Sequence[Sequence[int]]]) -> Callable[[int], list[int]]:
    """``quota(q)``: the next round's micro-batches per worker, from ``counts`` in order, else ``q`` each."""
    rounds = iter(counts) if counts is not None else None
    return lambda q: list(next(rounds)) if rounds is not None else [q] * run.N


def reference_trajectory(
    mode: str,
    run: ReferenceRun,
    steps: int,
    gradient_accumulation_steps: int,
    warmup_steps: int = 0,
    counts: Optional[Sequence[Sequence[int]]] = None,
) -> list[list[torch.Tensor]]:
    """``θ`` after each of ``steps`` optimizer steps (commits) under ``mode`` (``sync``, ``dpu`` or ``acco``);
    without ``counts`` each round takes its fixed quota (``G`` for sync/dpu rounds, ``G/2`` for acco rounds)."""
    G = gradient_accumulation_steps
    if mode in ("sync", "acco"):  # warmup steps are sync steps, then acco's rounds: one schedule
        warm = min(warmup_steps, steps) if mode == "acco" else steps
        return reference_schedule(run, ["sync"] * warm + ["acco"] * (steps - warm), G, counts)
    if mode != "dpu":
        raise ValueError(f"mode: got {mode!r}; allowed: 'sync', 'dpu', 'acco'")
    quota = _quotas(run, counts)
    out: list[list[torch.Tensor]] = []
    warm = min(warmup_steps, steps)
    for _ in range(warm):
        run.step(*run.gradients(run.theta, quota(G)))
        out.append(run.snapshot())
    left = steps - warm
    if left <= 0:
        return out
    pending = run.gradients(run.snapshot(), quota(G))
    for _ in range(left):
        at = run.snapshot()  # compute parameters while round t is in flight: θ_t
        following = run.gradients(at, quota(G))
        run.step(*pending)
        out.append(run.snapshot())
        pending = following
    return out


def reference_schedule(run: ReferenceRun, modes: Sequence[str], gradient_accumulation_steps: int,
                       counts: Optional[Sequence[Sequence[int]]] = None,
                       estimate_at: Optional[Sequence[Sequence[torch.Tensor]]] = None) -> list[list[torch.Tensor]]:
    """``θ`` after each step when step ``t`` runs in ``modes[t]`` (``sync`` or ``acco``), as ``mode: "auto"``
    switches: a run of acco steps starts like acco after warmup (its first estimate's micro-batches are
    computed at the committed ``θ``), and the step before a switch to sync commits without computing the
    next estimate's micro-batches (sync's ``G`` then start at ``θ_{t+1}``).

    ``estimate_at``: for every acco step in order, the parameters its estimate landed as, where they are not
    ``θ̃`` exactly (``acco.estimate_quantization: "int4"`` lands within a quantisation step of it): the next
    estimate's micro-batches are computed there; nothing else changes."""
    G, quota = gradient_accumulation_steps, _quotas(run, counts)
    landed = iter(estimate_at) if estimate_at is not None else None
    out: list[list[torch.Tensor]] = []
    a_sum = a_cnt = None
    for t, mode in enumerate(modes):
        if mode == "sync":
            run.step(*run.gradients(run.theta, quota(G)))
        elif mode == "acco":
            if a_sum is None:
                a_sum, a_cnt = run.gradients(run.snapshot(), quota(G // 2))
            theta_tilde = run.lookahead(a_sum, a_cnt) if landed is None else list(next(landed))
            b_sum, b_cnt = run.gradients(run.snapshot(), quota(G // 2))
            run.step([a + b for a, b in zip(a_sum, b_sum)], a_cnt + b_cnt)
            a_sum = None
            if t + 1 < len(modes) and modes[t + 1] == "acco":
                a_sum, a_cnt = run.gradients(theta_tilde, quota(G // 2))
        else:
            raise ValueError(f"modes[{t}]: got {mode!r}; allowed: 'sync', 'acco'")
        out.append(run.snapshot())
    return out
