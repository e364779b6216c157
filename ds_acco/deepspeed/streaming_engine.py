"""``StreamingDeepSpeedEngine``: DeepSpeed's stage-0 engine training local replicas with Streaming DiLoCo.

Selected by ``"acco": {"mode": "streaming", ...}`` with ``zero_optimization.stage``
0. DeepSpeed builds the engine as usual (optimizer and LR scheduler from the
config, gradient accumulation, clipping, ``torch_autocast``); this subclass then
makes it a Streaming DiLoCo worker and leaves DeepSpeed's code unforked:

* the data-parallel gradient all-reduce is off (``enable_backward_allreduce =
  False``): DeepSpeed's optimizer is the *inner* optimizer, stepping this rank's
  replica on its own gradients;
* gradient clipping uses this rank's norm (stock stage 0 averages the norm over
  the data-parallel group: one blocking collective per step, which a streaming
  worker must not pay);
* after every inner step (DeepSpeed's ``_take_model_step``) the
  :class:`~ds_acco.streaming.StreamingEngine` launches or merges fragment rounds
  on its background thread; ``global_steps`` counts inner steps and drives the
  fragment schedule;
* checkpoints keep DeepSpeed's layout (its model file holds rank 0's replica) plus
  one file per rank, ``acco_streaming_state_dp_rank_<r>.pt``: that rank's replica,
  inner optimizer and streaming state (global fragment shard, outer momentum,
  int8 residuals, a round waiting to be merged), written atomically.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any, Optional

import torch
from deepspeed import comm as ds_dist
from deepspeed.runtime.engine import DeepSpeedEngine

from ds_acco.config.schema import AccoConfig, AccoConfigError
from ds_acco.checkpoint.atomic import atomic_save, atomic_torch_save, latest_tag
from ds_acco.checkpoint.verify import FiniteCheck, finite_at_save, optimizer_tensors
from ds_acco.checkpoint.gate import destroy_verification_group, verification_group
from .verify import MODEL_FILE, refuse_if_written_by_ds_acco, refuse_non_finite, start_verify_tag
from ds_acco.telemetry.startup_line import announce, streaming_fields
from ds_acco.streaming.engine import StreamingEngine, fragments_of

logger = logging.getLogger("ds_acco")

STREAMING_STATE_FILE = "acco_streaming_state_dp_rank_{rank}.pt"


class StreamingDeepSpeedEngine(DeepSpeedEngine):
    """A stage-0 ``DeepSpeedEngine`` whose ranks train replicas and sync one fragment at a time."""

    def __init__(self, *args: Any, acco_config: AccoConfig, **kwargs: Any):
        # DeepSpeedEngine.__getattr__ forwards unknown names to the model: keep ours in __dict__.
        self.__dict__["acco"] = None
        self.__dict__["_acco_config"] = acco_config
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
        self.enable_backward_allreduce = False
        try:
            fragments = fragments_of(self.module, self._acco_config)
        except ValueError as exc:
            raise AccoConfigError(str(exc)) from None
        self.acco = StreamingEngine(self.module, self.optimizer, fragments, config=self._acco_config,
                                    process_group=self.data_parallel_group)
        self.acco.inner_steps = self.global_steps
        sizes = "/".join(str(f.layout.numel) for f in self.acco.fragments)
        announce(f"DeepSpeed stage 0, fragments of {sizes} params", self.global_rank, streaming_fields(self.acco))

    # ------------------------------------------------------------ training loop
    def clip_fp32_gradients(self) -> None:
        """Clip by this replica's own gradient norm (no collective: inner steps are local)."""
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm=self.gradient_clipping())
        self._global_grad_norm = float(norm)

    def _take_model_step(self, lr_kwargs: Optional[dict]) -> None:
        super()._take_model_step(lr_kwargs)
        if self.acco is not None:
            self.acco.after_inner_step()

    def finish(self) -> None:
        """Merge the fragment round in flight now (e.g. before evaluation or export)."""
        if self.acco is not None:
            self.acco.finish()

    def consolidate(self) -> None:
        """Every rank's module becomes the global parameters ``θ_g`` (collective; before export)."""
        if self.acco is not None:
            self.acco.consolidate()

    def destroy(self) -> None:
        if self.__dict__.get("acco") is not None:
            self.acco.close(drain=False)
            self.__dict__["acco"] = None
        destroy_verification_group(self.__dict__)
        super().destroy()

    # ------------------------------------------------------------ checkpoints
    def _dp_rank(self) -> int:
        return ds_dist.get_rank(group=self.data_parallel_group)

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):
        """DeepSpeed's checkpoint plus every rank's replica and streaming state, written atomically.

        A fragment round in flight is waited for but not merged early, so saving does not
        change the trajectory.
        """
        if self.acco is None:
            return super().save_checkpoint(save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        streaming = self.acco.state_dict()
        tag = str(tag if tag is not None else f"global_step{self.global_steps}")
        client_state = dict(client_state or {})
        client_state["ds_acco"] = {"mode": "streaming", "inner_steps": self.acco.inner_steps,
                                   "world_size": self.acco.world_size}
        per_rank = {"streaming": streaming, "module": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict()}

        def write(partial: str) -> bool:
            ok = super(StreamingDeepSpeedEngine, self).save_checkpoint(save_dir, partial, client_state, False,
                                                                       exclude_frozen_parameters)
            atomic_torch_save(per_rank, os.path.join(save_dir, partial, STREAMING_STATE_FILE.format(rank=self._dp_rank())))
            return ok

        claim = [STREAMING_STATE_FILE.format(rank=self._dp_rank())] + [MODEL_FILE] * (self._dp_rank() == 0)
        finite = FiniteCheck(self._replica_tensors())  # recorded in the manifest; spares the load its sums
        return atomic_save(save_dir, tag, self.global_rank, write, save_latest, self.checkpoint_engine,
                           self._acco_config.checkpoint.fsync, claim=claim, finite=finite)

    def _replica_tensors(self) -> list:
        """This rank's replica and inner optimizer state: what its streaming state file holds."""
        return list(self.module.named_parameters()) + optimizer_tensors(self.optimizer)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """Load DeepSpeed's checkpoint, then this rank's replica and streaming state.

        Without per-rank streaming state (a stock stage-0 checkpoint, ``load_module_only``,
        ``load_optimizer_states=False``) every replica takes rank 0's weights and the
        global fragments start afresh from them.

        With another number of ranks than at the save, rank ``r`` continues saved rank
        ``r mod N_saved``'s replica and inner optimizer, and the global fragments and outer
        momentum are re-sharded exactly (see :meth:`StreamingEngine.load_resharded`).
        """
        stock = (load_dir, tag, load_module_strict, load_optimizer_states, load_lr_scheduler_states,
                 load_module_only, custom_load_fn)
        if self.acco is None:
            return super().load_checkpoint(*stock)
        tag = tag if tag is not None else latest_tag(load_dir)
        if tag is None:
            return super().load_checkpoint(*stock)
        tag = str(tag)
        self.acco.finish()  # nothing may be in flight while the buffers are overwritten
        timeout_s = self._acco_config.timeout_s
        pending = start_verify_tag(load_dir, tag, state_file=STREAMING_STATE_FILE, dp_rank=self._dp_rank(),
                                   dp_world=self.acco.world_size, salvage=self._acco_config.checkpoint.salvage,
                                   timeout_s=timeout_s,
                                   group=verification_group(self.__dict__, self.data_parallel_group, timeout_s))
        if pending.up_front:  # another world size, salvage, no usable manifest, a file missing or resized
            pending.verdict()
        saved_world = len(glob.glob(os.path.join(load_dir, tag, STREAMING_STATE_FILE.format(rank="*"))))
        with pending.gating(self.checkpoint_engine):  # files hashed while DeepSpeed parses; used after the verdict
            path, client_state = super().load_checkpoint(load_dir, tag, *stock[2:])
        verdict = pending.verdict()
        wanted = load_optimizer_states and not load_module_only and not verdict.dropped
        if path is None:
            return path, client_state
        if verdict.stock:
            refuse_if_written_by_ds_acco(load_dir, tag, client_state)
        from_state = self._load_streaming_state(load_dir, tag, wanted, saved_world, load_module_strict, verdict)
        if not (from_state and finite_at_save(verdict.manifest)):  # else: the saved values, found finite at the save
            refuse_non_finite(load_dir, tag, self._replica_tensors(), group=self.data_parallel_group)
        return path, client_state

    def _load_streaming_state(self, load_dir, tag, wanted, saved_world, load_module_strict, verdict) -> bool:
        """True when every replica and inner optimizer now holds values from the streaming state files."""
        if wanted and saved_world and saved_world != self.acco.world_size:
            self._load_resharded(load_dir, tag, saved_world, load_module_strict)
            return True
        state_file = os.path.join(load_dir, tag, STREAMING_STATE_FILE.format(rank=self._dp_rank()))
        found = torch.tensor([int(wanted and os.path.exists(state_file))])
        ds_dist.all_reduce(found, op=ds_dist.ReduceOp.MIN, group=self.data_parallel_group)
        if bool(found.item()):
            saved = torch.load(state_file, map_location=self.device, weights_only=False)
            self.module.load_state_dict(saved["module"], strict=load_module_strict)  # copies into the fragment views
            self.optimizer.load_state_dict(saved["optimizer"])
            self.acco.load_state_dict(saved["streaming"])
            if self.acco.inner_steps != self.global_steps:
                raise RuntimeError(f"{state_file}: streaming state at inner step {self.acco.inner_steps}, "
                                   f"DeepSpeed's at global step {self.global_steps}; the checkpoint is inconsistent")
            return True
        else:
            if self.global_rank == 0 and not verdict.dropped:
                logger.warning("ds_acco: %s/%s has no streaming state for every rank (a checkpoint no ds_acco run "
                               "wrote, or a module-only load): its files were not verified; replicas take rank 0's "
                               "weights and global fragments restart at step %d, so the run from here is not the "
                               "trajectory an uninterrupted ds_acco run would take", load_dir, tag, self.global_steps)
            self.acco.reset(inner_steps=self.global_steps)
        return False

    def _load_resharded(self, load_dir: str, tag: str, saved_world: int, strict: bool) -> None:
        """Resume a checkpoint of ``saved_world`` ranks: rank r takes saved rank ``r mod saved_world``'s
        replica and inner optimizer; the global fragments and outer momentum are re-sharded exactly."""
        files = [os.path.join(load_dir, tag, STREAMING_STATE_FILE.format(rank=r)) for r in range(saved_world)]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise AccoConfigError(f"{load_dir}/{tag}: streaming state files missing: {missing}")
        saved = [torch.load(f, map_location="cpu", weights_only=False, mmap=True) for f in files]
        mine = saved[self._dp_rank() % saved_world]
        self.module.load_state_dict(mine["module"], strict=strict)
        self.optimizer.load_state_dict(mine["optimizer"])
        self.acco.load_resharded([s["streaming"] for s in saved])
        if self.global_rank == 0:
            logger.info("ds_acco: %s/%s was saved by %d ranks; streaming state re-sharded for %d (int8 residuals "
                        "restart at zero, a pending merge was applied at load)", load_dir, tag, saved_world,
                        self.acco.world_size)
