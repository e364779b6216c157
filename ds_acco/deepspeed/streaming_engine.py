"""``StreamingDeepSpeedEngine``: DeepSpeed's stage-0 engine training local replicas with Streaming DiLoCo.

Selected by ``"acco": {"mode": "streaming"}`` with ``zero_optimization.stage`` 0. DeepSpeed builds the engine as usual
(optimizer and LR scheduler, gradient accumulation, clipping, ``torch_autocast``); this subclass turns the
data-parallel all-reduce off (DeepSpeed's optimizer is the *inner* one, stepping this rank's replica), clips by this
rank's own norm (stock stage 0 averages it over the group: one blocking collective per step, which a streaming worker
must not pay), and after every inner step (``_take_model_step``) has the :class:`~ds_acco.streaming.StreamingEngine`
launch or merge fragment rounds. Checkpoints add one file per rank: that rank's replica, inner optimizer and
streaming state (:class:`StreamingCheckpoint`).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from typing import Any, ContextManager, Optional

import torch
from deepspeed import comm as ds_dist

from ds_acco.checkpoint import safe_load
from ds_acco.checkpoint.verify import optimizer_tensors
from ds_acco.config import AccoConfig
from ds_acco.errors import AccoConfigError
from ds_acco.streaming import StreamingEngine, fragments_of

from . import _internals as internals
from .checkpoint_io import CheckpointedEngine, Checkpointer, LoadOptions

logger = logging.getLogger("ds_acco")


class StreamingDeepSpeedEngine(CheckpointedEngine):
    """A stage-0 ``DeepSpeedEngine`` whose ranks train replicas and sync one fragment at a time."""

    def __init__(self, *args: Any, acco_config: AccoConfig, **kwargs: Any):
        # DeepSpeedEngine.__getattr__ forwards unknown names to the model: keep ours in __dict__.
        self.__dict__.update(acco=None, _acco_config=acco_config, acco_checkpoints=None)
        super().__init__(*args, **kwargs)
        self._streaming_take_over()

    def _streaming_take_over(self) -> None:
        if self.zero_optimization() or self.fp16_enabled() or self.bfloat16_enabled():
            raise AccoConfigError(
                "acco.mode: 'streaming' needs zero_optimization.stage 0 and fp32 parameters (torch_autocast for "
                f"lower-precision compute); DeepSpeed built {type(self.optimizer).__name__}"
            )
        if self.optimizer is None:
            raise AccoConfigError(
                'optimizer: acco.mode \'streaming\' needs an inner optimizer: add an "optimizer" block to the '
                "config or pass optimizer= to ds_acco.initialize"
            )
        if self.has_moe_layers:
            raise AccoConfigError("model: mixture-of-experts layers are not supported with acco.mode 'streaming'")
        internals.check(self)
        self.__dict__["acco_checkpoints"] = Checkpointer(self, StreamingCheckpoint(self, self._acco_config),
                                                         self._acco_config, self.data_parallel_group)
        self.enable_backward_allreduce = False
        self.acco = StreamingEngine(self.module, self.optimizer, fragments_of(self.module, self._acco_config),
                                    config=self._acco_config, process_group=self.data_parallel_group,
                                    on_stop=self.acco_checkpoints.note_stop)
        self.acco.inner_steps = self.global_steps
        sizes = "/".join(str(f.layout.numel) for f in self.acco.fragments)
        self.acco.announce(f"DeepSpeed stage 0, fragments of {sizes} params")

    # ------------------------------------------------------------ training loop
    def clip_fp32_gradients(self) -> None:
        """Clip by this replica's own gradient norm (no collective: inner steps are local)."""
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm=self.gradient_clipping())
        internals.record_grad_norm(self, float(norm))

    def _take_model_step(self, lr_kwargs: Optional[dict]) -> None:
        super()._take_model_step(lr_kwargs)
        if self.acco is not None:
            self.acco.after_inner_step()
            self.acco_checkpoints.stop_if_due(self.acco.preempt)  # after a SIGTERM: save if configured, exit

    def finish(self) -> None:
        """Merge the fragment round in flight now (e.g. before evaluation or export)."""
        if self.acco is not None:
            self.acco.finish()

    def consolidate(self) -> None:
        """Every rank's module becomes the global parameters ``θ_g`` (collective; before export)."""
        if self.acco is not None:
            self.acco.consolidate()


class StreamingCheckpoint:
    """The streaming engine's part of a :class:`StreamingDeepSpeedEngine`'s checkpoints
    (:class:`~ds_acco.deepspeed.checkpoint_io.StatePart`): each rank's replica, inner optimizer and streaming state
    (DeepSpeed's model file holds rank 0's replica only)."""

    state_file = "acco_streaming_state_dp_rank_{rank}.pt"
    restart_note = "replicas take rank 0's weights and the global fragments restart"

    def __init__(self, engine: StreamingDeepSpeedEngine, config: AccoConfig):
        self.engine, self.weights_only = engine, config.checkpoint.weights_only

    def state_dict(self) -> dict:
        """A fragment round in flight is waited for but not merged early: saving does not change the trajectory."""
        e = self.engine
        return {"streaming": e.acco.state_dict(), "module": e.module.state_dict(),
                "optimizer": e.optimizer.state_dict()}

    def client_entry(self) -> dict:
        acco = self.engine.acco
        return {"mode": "streaming", "inner_steps": acco.inner_steps, "world_size": acco.world_size}

    def finite_tensors(self) -> list:  # what this rank's streaming state file holds
        return list(self.engine.module.named_parameters()) + optimizer_tensors(self.engine.optimizer)

    def saving(self) -> ContextManager:
        return contextlib.nullcontext()

    def before_load(self) -> None:
        self.engine.acco.finish()  # nothing may be in flight while the buffers are overwritten

    def load_other_world(self, load_dir, tag, manifest, options) -> Optional[tuple]:
        return None  # stage 0's files load onto any world size; the state files follow (load_resharded_state)

    def load_resharded_state(self, load_dir: str, tag: str, options: LoadOptions) -> bool:
        """Resume a checkpoint of another number of ranks: rank r takes saved rank ``r mod N_saved``'s
        replica and inner optimizer; the global fragments and outer momentum are re-sharded exactly."""
        e = self.engine
        saved_world = len(glob.glob(os.path.join(load_dir, tag, self.state_file.format(rank="*"))))
        if not saved_world or saved_world == e.acco.world_size:
            return False
        files = [os.path.join(load_dir, tag, self.state_file.format(rank=r)) for r in range(saved_world)]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise AccoConfigError(f"{load_dir}/{tag}: streaming state files missing: {missing}")
        saved = [safe_load.load(f, map_location="cpu", weights_only=self.weights_only, mmap=True) for f in files]
        mine = saved[ds_dist.get_rank(group=e.data_parallel_group) % saved_world]
        e.module.load_state_dict(mine["module"], strict=options.strict)
        e.optimizer.load_state_dict(mine["optimizer"])
        e.acco.load_resharded([s["streaming"] for s in saved])
        if e.global_rank == 0:
            logger.info("ds_acco: %s/%s was saved by %d ranks; streaming state re-sharded for %d (int8 residuals "
                        "restart at zero, a pending merge was applied at load)", load_dir, tag, saved_world,
                        e.acco.world_size)
        return True

    def load_state_dict(self, path: str, options: LoadOptions) -> None:
        e = self.engine
        saved = safe_load.load(path, map_location=e.device, weights_only=self.weights_only)
        e.module.load_state_dict(saved["module"], strict=options.strict)  # copies into the fragment views
        e.optimizer.load_state_dict(saved["optimizer"])
        e.acco.load_state_dict(saved["streaming"])
        if e.acco.inner_steps != e.global_steps:
            raise RuntimeError(f"{path}: streaming state at inner step {e.acco.inner_steps}, "
                               f"DeepSpeed's at global step {e.global_steps}; the checkpoint is inconsistent")

    def reset(self) -> None:
        self.engine.acco.reset(inner_steps=self.engine.global_steps)

    def loaded_are_saved(self, from_state: bool, options: LoadOptions) -> bool:
        return from_state  # else: not the saved values (and then the manifest's verdict says nothing of them)
