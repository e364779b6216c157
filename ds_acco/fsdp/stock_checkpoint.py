"""Loading a stock FSDP2 checkpoint (one no ds_acco run wrote) into ds_acco's FSDP front end.

Why: a job that moves to ds_acco starts from what its stock FSDP2 job saved with
``torch.distributed.checkpoint``. Such a folder has no ds_acco manifest, metadata or
round state, so its files cannot be verified and the rounds cannot continue where they
were: it loads, with one WARNING (rank 0) saying what that means for the trajectory.
A folder whose DCP metadata holds any ds_acco entry is ds_acco's own, and a missing
manifest there stays an error (:func:`ds_acco.fsdp.restore.written_by_ds_acco`).

Stock jobs nest their state dicts differently, so where the model and the optimizer sit
is read from the DCP metadata: the entry of the first parameter gives the model's prefix
(``model.`` for ``{"model": ..., "optim": ...}``, ``app.model.`` for torch's DCP recipe
with a Stateful ``app``, nothing for a bare ``model.state_dict()``), and the state of
that parameter (``<prefix>state.<fqn>.<key>``) the optimizer's. The step to continue
from is the optimizer's own step count (0 without an optimizer).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.distributed as dist

from ds_acco.errors import AccoConfigError

from .restore import (check_loaded, checkpoint_config, restart, safe_reader, saved_keys, set_state_dicts, sharded,
                      state_dicts)

logger = logging.getLogger("ds_acco")


def _model_prefix(keys: set, fqns: list[str]) -> Optional[str]:
    """The shortest ``P`` with an entry ``P + fqn`` for every parameter, or None."""
    first = fqns[0]
    candidates = sorted((k[: len(k) - len(first)] for k in keys if k.endswith(first)), key=len)
    return next((p for p in candidates if (p == "" or p.endswith(".")) and all(p + f in keys for f in fqns)), None)


def _optim_prefix(keys: set, fqn: str) -> Optional[str]:
    """The shortest ``P`` with entries ``P + "state." + fqn + ".<key>"`` (torch's optimizer state dict), or None."""
    needle = f"state.{fqn}."
    candidates = sorted((k[: k.find(needle)] for k in keys if needle in k), key=len)
    return next((p for p in candidates if p == "" or p.endswith(".")), None)


def _nest(prefix: str, value: dict, into: dict) -> None:
    """Put ``value`` at the dotted ``prefix`` of ``into`` (DCP flattens nested dicts with dots)."""
    parts = [p for p in prefix.split(".") if p]
    if not parts:
        into.update(value)
        return
    for part in parts[:-1]:
        into = into.setdefault(part, {})
    into[parts[-1]] = value


def _steps(optimizer: torch.optim.Optimizer) -> int:
    steps = [s["step"] for s in optimizer.state.values() if "step" in s]
    return int(max(float(s) for s in steps)) if steps else 0


def _require_tensors(folder: str, keys: set, model_at: str, model_sd: dict, optim_at: Optional[str],
                     optim_sd: Optional[dict]) -> None:
    """Every parameter and optimizer-state entry of this trainer is in the checkpoint (the load is partial
    only for optimizer hyper-parameters), else an error naming the first missing ones."""
    wanted = [model_at + name for name in model_sd]
    if optim_sd is not None:
        wanted += [f"{optim_at}state.{fqn}.{key}" for fqn, st in optim_sd["state"].items() for key in st]
    missing = [k for k in wanted if k not in keys]
    if missing:
        raise AccoConfigError(f"checkpoint {folder}: a stock FSDP2 checkpoint without {len(missing)} entries this "
                              f"model and optimizer need, e.g. {missing[:4]}")


def load_stock(trainer: Any, folder: str) -> None:
    """Load the model (and the optimizer, if saved) of a stock FSDP2 checkpoint; collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    keys = saved_keys(folder) or set()
    fqns = [p.fqn for p in trainer.fsdp.params if p.trainable]
    model_at = _model_prefix(keys, fqns)
    if model_at is None:
        raise AccoConfigError(f"checkpoint {folder}: neither ds_acco's nor a stock FSDP2 checkpoint of this model: "
                              f"no entry for its parameter {fqns[0]!r} among {sorted(keys)[:8]}")
    optim_at = _optim_prefix(keys, fqns[0])
    engine = getattr(trainer, "engine", None)
    with sharded(trainer):
        model_sd, optim_sd = state_dicts(trainer, optim_at is not None)
        state: dict = {}
        _nest(model_at, model_sd, state)
        if optim_sd is not None:
            _nest(optim_at, optim_sd, state)
        _require_tensors(folder, keys, model_at, model_sd, optim_at, optim_sd)
        # param_groups entries the live optimizer has and the stock job had not (a scheduler's initial_lr) stay
        dcp.load(state, checkpoint_id=folder, planner=DefaultLoadPlanner(allow_partial_load=True),
                 storage_reader=safe_reader(folder, checkpoint_config(trainer).weights_only))
        set_state_dicts(trainer, model_sd, optim_sd)
    check_loaded(trainer, folder)
    commits = _steps(trainer.optimizer)
    G = engine.G if engine else trainer.G
    restart(trainer, commits, commits * G)
    if dist.get_rank(trainer.fsdp.process_group) == 0:
        logger.warning(
            "ds_acco.fsdp: %s is a stock FSDP2 checkpoint (no ds_acco manifest or metadata): its files were not "
            "verified; loaded the model%s from its entries '%s*'%s, and training continues at step %d%s%s, so the "
            "run from here is not the trajectory the job that saved it would have taken",
            folder, "" if optim_sd is None else " and the optimizer", model_at,
            "" if optim_sd is None else f" and '{optim_at}*'", commits,
            " (the optimizer's step count)" if optim_sd is not None else " with a fresh optimizer (no moments)",
            ("; the rounds bootstrap afresh" if engine else "")
            + ("; the learning-rate scheduler was not saved and starts from its first step"
               if trainer.lr_scheduler is not None else ""))
