"""What every FSDP checkpoint load shares: telling ds_acco's folders from stock ones, DCP's state dicts of the
trainer (saves use them too), checking the loaded masters, and restarting the rounds from them when the round
state cannot continue.

Both the ds_acco load (another world size, another block) and the stock-FSDP2 load end the
same way: the masters are FSDP2's sharded parameters (checked to be the very tensors the
rounds step, and finite), the compute parameters are all-gathered from them, and the rounds
bootstrap afresh at the step the checkpoint reached.

A trainer is an :class:`~ds_acco.fsdp.acco_fsdp.AccoFSDP` or a
:class:`~ds_acco.fsdp.stock_fsdp.StockFSDP`; what is used of it: ``fsdp``, ``module``,
``optimizer``, ``lr_scheduler``, ``engine`` (AccoFSDP only), ``commits``, ``micro_batches``,
``G`` and ``_restart`` (StockFSDP only).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Optional

import torch

from ds_acco.checkpoint.safe_load import UnsafeCheckpointError, restricted_pickle_load
from ds_acco.checkpoint.verify import optimizer_tensors, refuse_unless_finite
from ds_acco.config import CheckpointConfig

META_KEY = "acco"
RANK_KEY_PREFIX = "acco_rank"


METADATA_CLASSES = ("torch.distributed.checkpoint.metadata.", "torch.distributed.checkpoint.filesystem._StorageInfo",
                    "torch.Size", "torch.serialization._get_layout", "pathlib.PosixPath", "collections.OrderedDict")
"""What DCP's ``.metadata`` pickle names (torch 2.13 and 2.14; dtypes are allowed anyway): the only classes a
ds_acco load resolves in it. DCP reads it with plain ``pickle.load``, which would run any code it named."""


def safe_reader(folder: str, weights_only: bool = True):
    """A DCP ``FileSystemReader`` whose ``.metadata`` is unpickled with :data:`METADATA_CLASSES` only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = restricted_pickle_load(f, METADATA_CLASSES, str(path), weights_only)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def metadata_classes_beyond(path: str) -> list[str]:
    """The classes a ``.metadata`` file names beyond :data:`METADATA_CLASSES` (read without running them)."""
    if os.path.basename(path) != ".metadata":
        return []  # .distcp files: DCP reads their tensors with torch's weights-only unpickler
    try:
        with open(path, "rb") as f:
            restricted_pickle_load(f, METADATA_CLASSES, path)
    except UnsafeCheckpointError as exc:
        return [exc.type_name]
    except Exception:  # noqa: BLE001 - damaged: the hashes say so
        return []
    return []


def checkpoint_config(trainer: Any) -> CheckpointConfig:
    """The trainer's ``acco.checkpoint`` block (a StockFSDP has none: the defaults)."""
    engine = getattr(trainer, "engine", None)
    return engine.config.checkpoint if engine else CheckpointConfig()


def saved_keys(folder: str) -> Optional[set]:
    """The entries of a DCP checkpoint (from its ``.metadata``), or None when that cannot be read."""
    try:
        return set(safe_reader(folder).read_metadata().state_dict_metadata)
    except Exception:  # noqa: BLE001 - missing, damaged or naming a class it may not: not provably stock
        return None


def written_by_ds_acco(folder: str) -> bool:
    """False only for a readable DCP checkpoint without ds_acco's entries (a stock FSDP2 job wrote it)."""
    keys = saved_keys(folder)
    return keys is None or any(k == META_KEY or k.startswith(RANK_KEY_PREFIX) for k in keys)


@contextlib.contextmanager
def sharded(trainer: Any):
    """Within the block FSDP2's sharded parameters are registered: DCP's helpers name parameters through
    ``model.named_parameters()``."""
    trainer.fsdp.to_sharded()
    try:
        yield
    finally:
        if getattr(trainer, "engine", None):
            trainer.fsdp.to_unsharded()


def state_dicts(trainer: Any, with_optimizer: bool) -> tuple[dict, Optional[dict]]:
    """DCP's state dicts of the model and the optimizer, or of the model alone (then the optimizer's state is
    cleared: a checkpoint saved before the first commit, or without one)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if with_optimizer:
        return get_state_dict(trainer.module, trainer.optimizer)
    trainer.optimizer.state.clear()
    return get_model_state_dict(trainer.module), None


def set_state_dicts(trainer: Any, model_sd: dict, optim_sd: Optional[dict]) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if optim_sd is None:
        set_model_state_dict(trainer.module, model_sd)
    else:
        set_state_dict(trainer.module, trainer.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def loaded_tensors(trainer: Any) -> list:
    """The master shards and optimizer moments: what a save writes and a load must find finite."""
    return [(f"master {p.fqn}", p.master) for p in trainer.fsdp.params] + optimizer_tensors(trainer.optimizer)


def check_loaded(trainer: Any, folder: str, finite_when_saved: bool = False) -> None:
    """The loaded values landed in the master shards, and they and the optimizer moments are finite (not summed
    when ``finite_when_saved``: the verified manifest says the save found them finite, and DCP re-shards the
    saved values exactly, at any world size)."""
    for p in trainer.fsdp.params:
        with torch.no_grad():
            local = p.sharded.to_local()
        if local.numel() and local.data_ptr() != p.master.data_ptr():
            raise RuntimeError(f"ds_acco.fsdp: loading replaced the sharded parameter {p.fqn}; master shard lost")
    if not finite_when_saved:
        refuse_unless_finite(folder, loaded_tensors(trainer), group=trainer.fsdp.process_group)


def restart(trainer: Any, commits: int, micro_batches: int) -> None:
    """Continue from loaded masters without round state: compute parameters = masters, rounds afresh."""
    engine = getattr(trainer, "engine", None)
    if not engine:
        trainer._restart(commits, micro_batches)
        return
    with torch.no_grad():
        for i, g in enumerate(engine.groups):  # compute parameters = the loaded masters, as after a commit
            engine.work.all_gather_masters(i, g.flat)
    engine.reset_rounds(commits=commits)
    engine.micro_batches = micro_batches
