"""``ds_acco.initialize``: ``deepspeed.initialize`` that honours an ``"acco"`` config block.

It reads the config the way DeepSpeed does (``config`` / ``config_params`` / ``args.deepspeed_config``, dict or JSON
path), validates the ``"acco"`` block and the combination with the rest of the file before any process-group work, then
calls DeepSpeed's own ``initialize`` with the engine class pointed at
:class:`~ds_acco.deepspeed.engine.AccoDeepSpeedEngine` for the duration of the call
(:class:`~ds_acco.deepspeed.streaming_engine.StreamingDeepSpeedEngine` for ``mode: "streaming"``). Everything else (mesh
set-up, config resolution, the returned 4-tuple) is DeepSpeed's code, unforked.

:func:`patch_deepspeed` installs it as ``deepspeed.initialize``, so an unmodified script (or HF Accelerate /
Transformers' Trainer, which look the function up at call time) gets ACCO from its config file alone.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any, Mapping

import deepspeed
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from ds_acco.comm.engine_lifecycle import EXIT_ORDER
from ds_acco.config.schema import AccoConfig, parse_acco_config
from ds_acco.errors import AccoTimeoutError

from . import _internals as internals
from .checks import check_deepspeed_version, check_ds_config, check_model, resolve_scheduler_warmup
from .hf_trainer import install_trainer_hook
from .shm import release_shm_names

_STOCK_INITIALIZE = deepspeed.initialize


def _raw_config(args: Any, config: Any, config_params: Any) -> Any:
    """The config the way ``deepspeed.initialize`` resolves it (dict, or path / base64 string)."""
    config = config if config is not None else config_params
    if config is None:
        config = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if config is None or isinstance(config, Mapping):
        return config
    return internals.load_ds_config(config)


def acco_config_of(args: Any = None, config: Any = None, config_params: Any = None) -> AccoConfig:
    """Parse and validate the ``"acco"`` block of a DeepSpeed config (disabled when absent)."""
    raw = _raw_config(args, config, config_params)
    block = raw.get("acco") if isinstance(raw, Mapping) else None
    acco = parse_acco_config(resolve_scheduler_warmup(raw, block))
    if acco.enabled:
        check_ds_config(raw, acco)
    return acco


def _rendezvous(acco: AccoConfig, distributed_port: int, dist_init_required: Any) -> None:
    """Create the default process group the way ``deepspeed.initialize`` would, with ``acco.timeout_s``.

    DeepSpeed's own call waits 10 minutes (``DEEPSPEED_TIMEOUT``) for every rank to arrive, so a
    rank that died before it (on another node, whose launcher this one's does not hear from) left
    its peers waiting that long before any ds_acco code ran. The same limit also bounds DeepSpeed's
    own collectives on the group, as ``acco.timeout_s`` bounds the rounds'. A ``DEEPSPEED_TIMEOUT``
    the user set wins. Under ``mpiexec`` DeepSpeed's MPI discovery comes first, with no time limit of
    its own: it runs here under ``acco.timeout_s`` too, and a rank that waits longer exits (status 1).
    """
    if dist.is_initialized() or dist_init_required is False or "DEEPSPEED_TIMEOUT" in os.environ:
        return
    internals.mpi_discovery_within_acco_timeout_s(acco.timeout_s, distributed_port)
    try:
        deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name(),
                                   distributed_port=distributed_port, dist_init_required=dist_init_required,
                                   timeout=timedelta(seconds=acco.timeout_s))
    except dist.DistError as exc:
        if "timed out" not in str(exc).lower():  # e.g. the port taken: torch's own message says it
            raise
        # a peer that never came: the master's store timed out waiting for it, or a client for the master
        raise AccoTimeoutError(
            f"ds_acco start-up: not every rank joined the process group within acco.timeout_s={acco.timeout_s:g}s "
            f"(a rank died or never started; torch: {str(exc).strip().splitlines()[0]})") from exc


def initialize(
    args=None,
    model=None,
    optimizer=None,
    model_parameters=None,
    training_data=None,
    lr_scheduler=None,
    distributed_port=29500,
    mpu=None,
    dist_init_required=None,
    collate_fn=None,
    config=None,
    mesh_param=None,
    config_params=None,
):
    """Same arguments and return value as ``deepspeed.initialize``; ACCO when the config has an enabled ``"acco"``
    block."""
    kwargs = dict(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                  training_data=training_data, lr_scheduler=lr_scheduler, distributed_port=distributed_port,
                  mpu=mpu, dist_init_required=dist_init_required, collate_fn=collate_fn, config=config,
                  mesh_param=mesh_param, config_params=config_params)
    acco = acco_config_of(args, config, config_params)
    if not acco.enabled:
        created = not dist.is_initialized()
        out = _STOCK_INITIALIZE(**kwargs)
        _own_exit(created)  # a stock job's gloo group can abort a finished job at finalization too
        release_shm_names()  # stock DeepSpeed otherwise leaves them in /dev/shm too
        return out
    check_deepspeed_version(deepspeed.__version__)
    check_model(model)
    if acco.mode == "streaming":
        from .streaming_engine import StreamingDeepSpeedEngine as engine_class
    else:
        from .engine import AccoDeepSpeedEngine as engine_class

    install_trainer_hook()
    created = not dist.is_initialized()
    _rendezvous(acco, distributed_port, dist_init_required)
    with internals.engine_class(functools.partial(engine_class, acco_config=acco)):
        out = _STOCK_INITIALIZE(**kwargs)
    _own_exit(created)
    release_shm_names()  # DeepSpeed's CPU shared-memory segments would outlive the job
    return out


def _own_exit(created: bool) -> None:
    """Tear down before finalization (engine_lifecycle's [Note: the order at exit]), the default group too when
    DeepSpeed made it inside this call: stock or ACCO, the script did not create it, so it rarely destroys it."""
    EXIT_ORDER.arm()
    if created and dist.is_initialized():
        EXIT_ORDER.owns_default_group = True


def patch_deepspeed() -> None:
    """Make ``deepspeed.initialize`` honour ``"acco"`` blocks (idempotent)."""
    deepspeed.initialize = initialize


def unpatch_deepspeed() -> None:
    deepspeed.initialize = _STOCK_INITIALIZE
