"""Every piece of DeepSpeed below its public API that ds_acco touches, in one place, checked by name.

The ACCO engine takes over DeepSpeed's ZeRO-1 buffers instead of copying them, and the streaming engine turns a
stage-0 engine into a Streaming DiLoCo worker; both need a few attributes DeepSpeed does not document. If a DeepSpeed
release renames one, :func:`check` fails at take-over with the DeepSpeed version and every missing name instead of
training wrongly (``ds_acco.deepspeed.checks`` also pins the tested releases). The FSDP2 front end does the same for
FSDP2 in ``ds_acco/fsdp/_fsdp2.py``.

Public API used
    ``deepspeed.initialize`` (called with the engine class swapped, see below), ``DeepSpeedEngine`` methods and counters
    (``global_steps``, ``global_samples``, ``skipped_steps``, ``micro_steps``, ``save_checkpoint``, ``load_checkpoint``,
    ``gradient_clipping()``...), ``deepspeed.comm``.

Internals used (DeepSpeed 0.19)
    * ``deepspeed.DeepSpeedEngine``: the class ``deepspeed.initialize`` instantiates, replaced for the duration of one
      call (:func:`engine_class`).
    * ``DeepSpeedZeroOptimizer``: ``_grad_acc_hooks`` (removed: rounds own the gradients), ``bit16_groups_flat``,
      ``round_robin_bit16_groups``, ``round_robin_bit16_offsets``, ``single_partition_of_fp32_groups``,
      ``real_dp_process_group``, and at every swap ``parallel_partitioned_bit16_groups`` with
      ``get_data_parallel_partitions`` (kept pointing at the buffer the model reads, for DeepSpeed's checkpointing),
      ``loss_scale``, ``loss_scaler``.
    * ``DeepSpeedEngine``: ``enable_backward_allreduce`` (off), ``_global_grad_norm`` and ``_step_applied`` (what
      ``get_global_grad_norm()`` and ``was_step_applied()`` report), ``_config.load_universal_checkpoint`` (read, and
      set for one load), ``checkpoint_engine`` (its ``load`` and ``save`` wrapped for one call), and the overridden
      hooks ``_backward_epilogue`` (ACCO: every backward ends a micro-batch) and ``_take_model_step`` (streaming: every
      inner step).
    * ``deepspeed.checkpoint.ds_to_universal.main`` (re-partitioning a checkpoint for another world size),
      ``deepspeed.runtime.tensor_parallel.init_utils.load_ds_config`` (a config path or base64 string),
      ``deepspeed.comm.comm.cdb.shm_comm_op`` (whether DeepSpeed made shared-memory segments),
      ``deepspeed.comm.comm.mpi_discovery`` with ``in_aml``/``in_dlts``/``in_aws_sm`` (run where ``init_distributed``
      would run it, under a watchdog: :func:`mpi_discovery_within_acco_timeout_s`).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
from typing import Any, Iterator

import deepspeed
import torch

from ds_acco.checkpoint import safe_load
from ds_acco.checkpoint.files import replaced

CHECKPOINT_CLASSES = ("deepspeed.runtime.fp16.loss_scaler.LossScaler",
                      "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                      "deepspeed.runtime.zero.config.ZeroStageEnum", "deepspeed.utils.tensor_fragment.fragment_address")
"""The classes beyond tensors, containers and numbers that DeepSpeed's ZeRO-1 and stage-0 checkpoint files hold
(found with ``torch.serialization.get_unsafe_globals_in_checkpoint`` on stock and ds_acco checkpoints): the only
ones a ds_acco load unpickles (:mod:`ds_acco.checkpoint.safe_load`)."""

_ZERO_ATTRS = ("_grad_acc_hooks", "bit16_groups_flat", "round_robin_bit16_groups", "round_robin_bit16_offsets",
               "single_partition_of_fp32_groups", "real_dp_process_group", "parallel_partitioned_bit16_groups",
               "get_data_parallel_partitions", "loss_scale", "loss_scaler")
_ENGINE_ATTRS = ("enable_backward_allreduce", "_backward_epilogue", "_take_model_step", "_config", "checkpoint_engine",
                 "_copy_recovery_script")


def check(engine: Any, zero_optimizer: Any = None) -> None:
    """Fail at take-over, naming the DeepSpeed version and every missing attribute, if DeepSpeed lacks an
    attribute named in the module docstring."""
    missing = [f"DeepSpeedEngine.{a}" for a in _ENGINE_ATTRS if not hasattr(engine, a)]
    if zero_optimizer is not None:
        missing += [f"{type(zero_optimizer).__name__}.{a}" for a in _ZERO_ATTRS if not hasattr(zero_optimizer, a)]
    if missing:
        raise RuntimeError(f"ds_acco: deepspeed {deepspeed.__version__} lacks internals ds_acco relies on: "
                           f"{', '.join(missing)}; install a supported release (pip install 'deepspeed>=0.19,<0.20')")


def engine_class(factory: Any) -> contextlib.AbstractContextManager:
    """Within the block, ``deepspeed.initialize`` builds ``factory(...)`` instead of a ``DeepSpeedEngine``."""
    return replaced(deepspeed, "DeepSpeedEngine", factory)


def load_ds_config(config: Any) -> Any:
    """A DeepSpeed config given as a path or base64 string, read the way ``deepspeed.initialize`` does."""
    from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config as load

    return load(config)


# ------------------------------------------------------------------ ZeRO-1 take-over
def zero1_groups(opt: Any) -> Iterator[tuple[list, tuple[int, ...], torch.Tensor, torch.Tensor]]:
    """Per parameter group: ``(params, offsets, flat bit16 buffer, this rank's fp32 partition)``."""
    for i, flat in enumerate(opt.bit16_groups_flat):
        yield (list(opt.round_robin_bit16_groups[i]), tuple(int(o) for o in opt.round_robin_bit16_offsets[i]),
               flat, opt.single_partition_of_fp32_groups[i])


def remove_gradient_hooks(opt: Any) -> None:
    """Backward only accumulates: DeepSpeed's per-parameter reduction hooks go."""
    for hook in opt._grad_acc_hooks:
        hook.remove()
    opt._grad_acc_hooks = []


def dp_group(opt: Any) -> Any:
    """The data-parallel process group the ZeRO-1 partitions are split over."""
    return opt.real_dp_process_group[0]


def master_partitions(opt: Any) -> list:
    return opt.single_partition_of_fp32_groups


def point_at(opt: Any, i: int, flat: torch.Tensor) -> None:
    """Keep DeepSpeed's own references to group ``i``'s flat buffer on ``flat`` (the one the model reads)."""
    opt.bit16_groups_flat[i] = flat
    opt.parallel_partitioned_bit16_groups[i] = opt.get_data_parallel_partitions(flat, i)


def record_step(engine: Any, grad_norm: float, applied: bool) -> None:
    """What ``get_global_grad_norm()`` and ``was_step_applied()`` report after a commit."""
    engine._global_grad_norm = grad_norm
    engine._step_applied = applied


def record_grad_norm(engine: Any, grad_norm: float) -> None:
    """What ``get_global_grad_norm()`` reports."""
    engine._global_grad_norm = grad_norm


# ------------------------------------------------------------------ checkpoints
def guarded_recovery_script(engine: Any, guard: Any) -> contextlib.AbstractContextManager:
    """Within the block, the copy of ``zero_to_fp32.py`` a ZeRO save writes next to its tags goes through
    ``guard(path)`` (a full disk fails the save on every rank instead of raising on rank 0 alone)."""
    real = engine._copy_recovery_script

    def copy(save_path):
        with guard(os.path.join(save_path, "zero_to_fp32.py")):
            real(save_path)

    return replaced(engine, "_copy_recovery_script", copy)


def restricted_loads(engine: Any, weights_only: bool) -> contextlib.AbstractContextManager:
    """Within the block, ``checkpoint_engine.load`` unpickles with torch's restricted unpickler and
    :data:`CHECKPOINT_CLASSES` (:mod:`ds_acco.checkpoint.safe_load`): no file DeepSpeed loads can run code."""
    def load(path, map_location=None):
        return safe_load.load(path, map_location=map_location, allow=CHECKPOINT_CLASSES, weights_only=weights_only)

    return replaced(engine.checkpoint_engine, "load", load)


def loads_universal(engine: Any) -> bool:
    """Whether the config says ``load_checkpoint`` reads universal checkpoints (``"checkpoint": {"load_universal":
    true}``: a folder ``ds_to_universal`` wrote)."""
    return bool(engine._config.load_universal_checkpoint)


@contextlib.contextmanager
def universal_loading(engine: Any) -> Iterator[None]:
    """Within the block, ``load_checkpoint`` reads a universal checkpoint (re-partitioned fragments)."""
    saved = engine._config.load_universal_checkpoint
    engine._config.load_universal_checkpoint = True
    try:
        yield
    finally:
        engine._config.load_universal_checkpoint = saved


def convert_to_universal(input_folder: str, output_folder: str) -> None:
    """DeepSpeed's ``ds_to_universal`` on one tag, in this process (one worker: no child processes)."""
    from deepspeed.checkpoint import ds_to_universal

    ds_to_universal.main(argparse.Namespace(
        input_folder=input_folder, output_folder=output_folder, num_extract_workers=1, num_merge_workers=1,
        keep_temp_folder=False, strict=True, inject_missing_state=True))


def shm_segments_made() -> bool:
    """Whether DeepSpeed's communication backend created its CPU shared-memory all-reduce segments."""
    from deepspeed.comm import comm as ds_comm_state  # the live backend (the package re-exports a stale None)

    return getattr(getattr(ds_comm_state, "cdb", None), "shm_comm_op", None) is not None


_LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


def mpi_discovery_within_acco_timeout_s(timeout_s: float, distributed_port: int) -> None:
    """DeepSpeed's MPI discovery, where ``deepspeed.init_distributed`` would run it, ended after ``timeout_s``.

    Without a launcher's variables DeepSpeed finds the ranks through mpi4py: ``MPI_Init`` and two collectives, none with
    a time limit. Under MPICH's ``mpiexec`` a rank that exits before them leaves the others blocked in C with the
    interpreter lock held, where no Python code (a thread, a signal handler) can raise. faulthandler's watchdog is a C
    thread: it prints every thread's stack ("Timeout (h:mm:ss)!", then this function's name) and exits with status
    1, which ends the job under ``mpiexec``.
    """
    from deepspeed.comm import comm as ds_comm

    launched = all(v in os.environ for v in _LAUNCHER_ENV)
    if launched or (ds_comm.in_aml() and not ds_comm.in_dlts()) or ds_comm.in_aws_sm():
        return  # a launcher set the ranks, or DeepSpeed's cloud-specific discovery runs instead
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        ds_comm.mpi_discovery(distributed_port=distributed_port)
    finally:
        faulthandler.cancel_dump_traceback_later()
