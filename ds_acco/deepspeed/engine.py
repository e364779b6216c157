"""``AccoDeepSpeedEngine``: DeepSpeed's engine with ZeRO-1 steps moved into ACCO rounds.

DeepSpeed builds everything as usual; this subclass then takes over the gradient path and leaves DeepSpeed's code
unforked: its gradient hooks are removed and its boundary all-reduce is off; each ``bit16_groups_flat[i]`` with its
``single_partition_of_fp32_groups[i]`` becomes one :class:`~ds_acco.layout.sharded_group.ShardedGroup`, stepped by
the wrapped optimizer as DeepSpeed would have; every backward ends with ``RoundEngine.after_micro_batch()`` (hooked
into ``_backward_epilogue``, which ``engine.backward(loss)`` and a direct ``loss.backward()`` both reach), so
``step()`` only keeps DeepSpeed's counters. Checkpoints add one round-state file per rank (:class:`RoundCheckpoint`).
Every DeepSpeed internal used here goes through :mod:`ds_acco.deepspeed._internals`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, ContextManager, Optional

import torch
from deepspeed import comm as ds_dist
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

from ds_acco.checkpoint import safe_load
from ds_acco.checkpoint.verify import optimizer_tensors
from ds_acco.config import AccoConfig
from ds_acco.config.names import Kind
from ds_acco.errors import AccoConfigError
from ds_acco.layout.flat_buffer import FlatLayout, rebind_params
from ds_acco.layout.sharded_group import ShardedGroup
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.rounds.committed import CommittedStateDict, committed_parameters
from ds_acco.rounds.engine import RoundEngine
from ds_acco.streaming import phase_factory
from ds_acco.telemetry.records import RoundRecord

from . import _internals as internals
from . import elastic
from .checkpoint_io import CheckpointedEngine, Checkpointer

logger = logging.getLogger("ds_acco")


class AccoDeepSpeedEngine(CheckpointedEngine):
    """A ``DeepSpeedEngine`` whose ZeRO-1 reduce/step/all-gather run as background ACCO rounds."""

    def __init__(self, *args: Any, acco_config: AccoConfig, **kwargs: Any):
        # nn.Module.__setattr__ is not ready yet, and DeepSpeedEngine.__getattr__ forwards
        # unknown names to the model: keep our attributes in __dict__ from the start.
        self.__dict__.update(acco=None, _acco_config=acco_config, acco_samples=0, acco_export=None,
                             acco_checkpoints=None)
        super().__init__(*args, **kwargs)
        self._acco_take_over()

    # ------------------------------------------------------------------ set-up
    def _acco_take_over(self) -> None:
        opt = self.optimizer
        if not isinstance(opt, DeepSpeedZeroOptimizer):
            raise AccoConfigError(
                f"DeepSpeed built {type(opt).__name__}; ACCO needs DeepSpeedZeroOptimizer (zero_optimization "
                "stage 1). With bf16, data_types.grad_accum_dtype='fp32' selects BF16_Optimizer: remove it and "
                "set acco.grad_accum_dtype to 'fp32' instead (ACCO then accumulates bf16 gradients in fp32)."
            )
        if getattr(opt, "has_moe_layers", False):
            raise AccoConfigError("model: mixture-of-experts layers are not supported with ACCO")
        internals.check(self, opt)
        dp_group = internals.dp_group(opt)
        self.__dict__["acco_checkpoints"] = Checkpointer(self, RoundCheckpoint(self, self._acco_config),
                                                         self._acco_config, dp_group)
        internals.remove_gradient_hooks(opt)
        self.enable_backward_allreduce = False

        world = ds_dist.get_world_size(group=dp_group)
        groups = []
        for i, (params, offsets, flat, master) in enumerate(internals.zero1_groups(opt)):
            numels = tuple(p.numel() for p in params)
            layout = FlatLayout(numels=numels, shapes=tuple(p.shape for p in params), offsets=offsets,
                                numel=sum(numels), padded_numel=flat.numel(), world_size=world)
            if flat.numel() % world or master.numel() != layout.shard_numel:
                raise RuntimeError(
                    f"unexpected DeepSpeed ZeRO-1 layout in group {i}: flat {flat.numel()} elements, "
                    f"fp32 partition {master.numel()}, world {world} (is deepspeed a supported release?)"
                )
            groups.append(ShardedGroup(params, layout, flat, master, rebind=self._acco_rebinder(i, params, layout)))
        G = self.gradient_accumulation_steps()
        self.acco = RoundEngine(
            groups,
            ShardOptimizer(opt.optimizer, [g.master for g in groups], self.lr_scheduler),
            config=self._acco_config,
            gradient_accumulation_steps=G,
            clip_grad_norm=self.gradient_clipping(),
            process_group=dp_group,
            # Backward leaves each micro-batch's gradient divided by G: by DeepSpeed (scale_wrt_gas=True) or by the
            # caller (HF Trainer divides the loss itself and passes scale_wrt_gas=False). Undoing that 1/G and dividing
            # by the micro-batch count the round received gives mean(X), and equals stock ZeRO-1 when counts are G.
            grad_scale=lambda: float(opt.loss_scale if self.fp16_enabled() else 1.0) / G,
            on_swap=self._acco_on_swap,
            on_stop=self.acco_checkpoints.note_stop,
            streaming_phase=phase_factory(self.module, self._acco_config),
        )
        self.acco.commits = self.global_steps
        # Exports (module.state_dict(), save_16bit_model, HF save_model) give the committed parameters.
        self.acco_export = CommittedStateDict(self.module, self.acco)
        self.acco.announce(f"DeepSpeed ZeRO-1, {len(groups)} group(s)")

    def _acco_rebinder(self, i: int, params: list, layout: FlatLayout):
        def rebind(flat: torch.Tensor) -> None:
            # Keep DeepSpeed's own references (checkpointing, zero_to_fp32 shapes, get_lr...) on
            # the buffer the model now reads.
            rebind_params(params, layout, flat)
            internals.point_at(self.optimizer, i, flat)

        return rebind

    def _acco_on_swap(self, record: RoundRecord) -> None:
        self.acco_samples += sum(record.counts) * self.train_micro_batch_size_per_gpu()
        if record.kind != Kind.COMMIT:
            return
        self.global_steps += 1
        self.global_samples += self.acco_samples
        self.acco_samples = 0
        internals.record_step(self, record.grad_norm, not record.skipped)
        if record.skipped:
            self.skipped_steps += 1
        if self.fp16_enabled() and self.dynamic_loss_scale():
            self.optimizer.loss_scaler.update_scale(record.skipped)

    # ------------------------------------------------------------ training loop
    def _backward_epilogue(self) -> None:
        super()._backward_epilogue()
        if self.acco is not None:
            self.acco.after_micro_batch()

    def step(self, lr_kwargs: Optional[dict] = None) -> None:
        """Keep DeepSpeed's micro-step counter; rounds were already driven by backward."""
        if self.acco is None:
            return super().step(lr_kwargs)
        if lr_kwargs:
            raise ValueError("step(lr_kwargs=...) is not supported with ACCO: the scheduler steps with the commits")
        self.micro_steps += 1
        self.acco_checkpoints.stop_if_due(self.acco.preempt)  # after a SIGTERM: save if configured, exit
        return None

    def is_gradient_accumulation_boundary(self) -> bool:
        if self.acco is None:
            return super().is_gradient_accumulation_boundary()
        return False  # rounds decide boundaries; DeepSpeed must never run its own reduction

    def finish(self) -> None:
        """Drain and commit everything accumulated: the module then holds the committed parameters.

        The end of training (HF Trainer does it by itself under ``ds_acco.run``). Exports
        never need it: ``module.state_dict()`` gives the committed parameters at any time.
        """
        if self.acco is not None:
            self.acco.finish()

    def committed_parameters(self):
        """``with engine.committed_parameters():`` the module computes with the committed
        parameters (evaluation); training is unchanged afterwards (see :mod:`ds_acco.rounds.committed`)."""
        if self.acco is None:
            return contextlib.nullcontext()
        return committed_parameters(self.acco)

    def destroy(self) -> None:
        if self.__dict__.get("acco_export") is not None:
            self.acco_export.remove()
            self.__dict__["acco_export"] = None
        super().destroy()


class RoundCheckpoint:
    """The round engine's part of an :class:`AccoDeepSpeedEngine`'s checkpoints
    (:class:`~ds_acco.deepspeed.checkpoint_io.StatePart`): DeepSpeed's files hold the compute parameters, the fp32
    partitions and the optimizer; the state file holds the round state and the samples not yet counted."""

    state_file = "acco_round_state_dp_rank_{rank}.pt"
    restart_note = "the rounds bootstrap afresh"

    def __init__(self, engine: AccoDeepSpeedEngine, config: AccoConfig):
        self.engine, self.weights_only = engine, config.checkpoint.weights_only

    def state_dict(self) -> dict:
        e = self.engine
        return {"rounds": e.acco.state_dict(), "samples": e.acco_samples}  # waits; nothing swapped early

    def client_entry(self) -> dict:
        acco = self.engine.acco
        return {"mode": acco.config.mode, "policy": acco.config.policy, "commits": acco.commits}

    def finite_tensors(self) -> list:
        opt = self.engine.optimizer
        return [(f"fp32 partition of group {i}", t) for i, t in enumerate(internals.master_partitions(opt))] + \
            optimizer_tensors(opt.optimizer)

    def saving(self) -> ContextManager:
        return self.engine.acco_export.suspended()  # the model file holds the compute parameters: exact resume

    def before_load(self) -> None:
        self.engine.acco.reset_rounds()

    def load_other_world(self, load_dir, tag, manifest, options) -> Optional[tuple]:
        """Another data-parallel world size: re-partition through a universal checkpoint (:mod:`.elastic`); the round
        state is per rank, so the rounds restart from the saved compute parameters (an estimate, possibly)."""
        e, weights_only = self.engine, self.weights_only
        # the manifest says how many ranks saved; only a checkpoint without one needs its model file read for it
        saved_dp = manifest["world_size"] if manifest else elastic.saved_dp_world_size(load_dir, tag, weights_only)
        if options.module_only or saved_dp == e.dp_world_size:
            return None
        out = elastic.load_resharded(e, load_dir, tag, options, saved_dp, weights_only)
        e.acco.reset_rounds(commits=e.global_steps, compute_committed=False)  # maybe an estimate
        return out

    def load_resharded_state(self, load_dir, tag, options) -> bool:
        return False  # (load_other_world did it, before DeepSpeed's files)

    def load_state_dict(self, path: str, options) -> None:
        e = self.engine
        saved = safe_load.load(path, map_location="cpu", weights_only=self.weights_only)
        e.acco_samples = saved["samples"]
        changed = e.acco.block_changes(saved["rounds"])
        if not changed:
            e.acco.load_state_dict(saved["rounds"])  # refuses, naming the fields, what cannot carry on
            return
        # Another mode, policy, quantisation or error-feedback switch, same world and layout: DeepSpeed has
        # loaded the committed masters (and moments) and made the compute parameters from them, so the
        # rounds restart from the commit; what the old block had in flight is dropped.
        if e.global_rank == 0:
            logger.warning("ds_acco: resuming %s under a changed acco block (%s): the round state was rebuilt from "
                           "the committed parameters at step %d (micro-batches accumulated after that commit, the "
                           "kept estimate and error-feedback residuals were reset)", os.path.dirname(path),
                           "; ".join(changed), e.global_steps)
        self.reset()

    def reset(self) -> None:
        self.engine.acco.reset_rounds(commits=self.engine.global_steps)

    def loaded_are_saved(self, from_state: bool, options) -> bool:
        # the masters and moments just loaded are the saved ones, which the save found finite: nothing to sum
        return options.optimizer_states and not options.module_only and self.engine.zero_load_from_fp32_weights()
