"""The plain-PyTorch front end: ACCO for an ``nn.Module`` with no framework around it.

The core's own layout: each torch param group becomes one flat buffer, this rank's fp32 master shard is cut from it, and
the optimizer is built over the master shards with the group's hyper-parameters. The training loop is::

    engine = ds_acco.plain.build(model.parameters(), torch.optim.AdamW, {"lr": 1e-3},
                                 config={"mode": "acco"}, gradient_accumulation_steps=8)
    for batch in loader:
        loss_fn(model(batch)).backward()
        engine.after_micro_batch()
    engine.finish(); engine.close()
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.distributed as dist

from ds_acco.comm.clock import ClockLike
from ds_acco.config import AccoConfig, no_preemption_dir, parse_acco_config
from ds_acco.layout.sharded_group import build_sharded_groups
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.rounds.engine import RoundEngine
from ds_acco.streaming import phase_factory

logger = logging.getLogger("ds_acco")


def _as_groups(params: Iterable[Any]) -> list[dict]:
    items = list(params)
    if not items:
        raise ValueError("no parameters given")
    if isinstance(items[0], dict):
        return [dict(g, params=list(g["params"])) for g in items]
    return [{"params": items}]


def build(
    params: Iterable[Any],
    optimizer_cls: type = torch.optim.AdamW,
    optimizer_kwargs: Optional[dict] = None,
    *,
    config: Union[AccoConfig, dict],
    gradient_accumulation_steps: int,
    clip_grad_norm: Optional[float] = None,
    lr_scheduler: Optional[Callable[[torch.optim.Optimizer], Any]] = None,
    process_group: Optional[dist.ProcessGroup] = None,
    alignment: int = 1,
    grad_scale: float = 1.0,
    on_stage: Optional[Callable[[int, str], None]] = None,
    on_stop: Optional[Callable[[], None]] = None,
    model: Optional[torch.nn.Module] = None,
    clock: ClockLike = None,
) -> RoundEngine:
    """Flatten ``params`` (tensors or torch-style param-group dicts) and start a round engine.

    Args:
        params: what you would pass to a torch optimizer.
        optimizer_cls / optimizer_kwargs: the shard optimizer (any ``torch.optim``).
        lr_scheduler: a factory called with the optimizer; stepped once per commit.
        alignment: shard sizes are multiples of this.
        on_stop: called where every rank stops after a SIGTERM (save there with :func:`state_dict`); default:
            exit with ``acco.preemption.exit_code``.
        model: the module ``params`` belong to; with ``acco.auto.streaming`` its layers are cut into the
            fragments auto may switch to streaming with (before training: a model that cannot be cut fails here).
        clock: what rounds, swaps and ``mode: "auto"``'s figures are timed with (default ``time.perf_counter``;
            :mod:`ds_acco.comm.clock`): a simulator's clock makes auto's choices functions of its times.
    """
    config = no_preemption_dir(parse_acco_config(config), "ds_acco.plain.build")
    groups_spec = _as_groups(params)
    pg = process_group if process_group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    groups = build_sharded_groups([g["params"] for g in groups_spec], world, rank, alignment)
    opt_groups = [dict(spec, params=[g.master]) for spec, g in zip(groups_spec, groups)]
    optimizer = optimizer_cls(opt_groups, **(optimizer_kwargs or {}))
    scheduler = lr_scheduler(optimizer) if lr_scheduler is not None else None
    shard_opt = ShardOptimizer(optimizer, [g.master for g in groups], scheduler)
    engine = RoundEngine(groups, shard_opt, config=config, gradient_accumulation_steps=gradient_accumulation_steps,
                         clip_grad_norm=clip_grad_norm, process_group=process_group, grad_scale=grad_scale,
                         on_stage=on_stage, on_stop=on_stop, streaming_phase=phase_factory(model, config), clock=clock)
    engine.announce(f"plain PyTorch, {len(groups)} group(s)")
    return engine


def state_dict(engine: RoundEngine) -> dict:
    """Everything this rank needs to resume: compute parameters, master shards,
    optimizer and scheduler state, and the engine's round state."""
    rounds = engine.state_dict()  # quiesces first, so masters are at rest
    sched = engine.shard_optimizer.lr_scheduler
    return {
        "compute": [g.flat.clone() for g in engine.groups],
        "masters": [g.master.detach().clone() for g in engine.groups],
        "optimizer": engine.shard_optimizer.optimizer.state_dict(),
        "lr_scheduler": sched.state_dict() if sched is not None else None,
        "rounds": rounds,
    }


def load_state_dict(engine: RoundEngine, state: dict) -> None:
    """Inverse of :func:`state_dict`; call on every rank of a job built the same way.

    Under a changed ``acco`` block (another mode, policy, quantisation or error-feedback switch; same world
    size and layout) the job carries on from the committed parameters, with one WARNING naming the fields;
    what cannot carry on is refused naming the fields (:class:`~ds_acco.errors.AccoConfigError`).
    """
    changed = engine.block_changes(state["rounds"])
    with torch.no_grad():
        for g, compute, master in zip(engine.groups, state["compute"], state["masters"]):
            g.flat.copy_(compute)
            g.master.copy_(master)
    engine.shard_optimizer.optimizer.load_state_dict(state["optimizer"])
    sched = engine.shard_optimizer.lr_scheduler
    if sched is not None and state["lr_scheduler"] is not None:
        sched.load_state_dict(state["lr_scheduler"])
    if not changed:
        engine.load_state_dict(state["rounds"])  # refuses, naming the fields, what cannot carry on
        return
    rounds = state["rounds"]
    # a commit that finished but was not swapped in is already in the masters and the optimizer
    pending = rounds.get("pending")
    commits = rounds["commits"] + int(bool(pending) and pending["kind"] == "commit")
    with torch.no_grad():
        for i, g in enumerate(engine.groups):  # compute parameters = the committed masters
            engine.work.all_gather_masters(i, g.flat)
    engine.reset_rounds(commits=commits)
    engine.micro_batches = rounds["micro_batches"]
    if engine.rank == 0:
        logger.warning("ds_acco: resuming under a changed acco block (%s): the round state was rebuilt from the "
                       "committed parameters at step %d (micro-batches accumulated after that commit, the kept "
                       "estimate and error-feedback residuals were reset)", "; ".join(changed), commits)
