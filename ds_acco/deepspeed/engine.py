"""``AccoDeepSpeedEngine``: DeepSpeed's engine with ZeRO-1 steps moved into ACCO rounds.

DeepSpeed builds everything as usual (flat bit16 groups, fp32 partitions, the
optimizer and LR scheduler from the config, the loss scaler); this subclass
then takes over the gradient path and leaves DeepSpeed's code unforked:

* DeepSpeed's gradient hooks are removed and its boundary all-reduce is off
  (``enable_backward_allreduce = False``), so backward only accumulates into
  the round engine's buffers;
* each ``bit16_groups_flat[i]`` with its ``single_partition_of_fp32_groups[i]``
  becomes one :class:`~ds_acco.layout.flat_buffer.ShardedGroup`, and the wrapped torch
  optimizer steps the same fp32 partitions DeepSpeed would have stepped;
* every backward ends with ``RoundEngine.after_micro_batch()`` (hooked into
  ``_backward_epilogue``, which both ``engine.backward(loss)`` and a direct
  ``loss.backward()`` reach), so ``step()`` only keeps DeepSpeed's counters;
* checkpoints keep DeepSpeed's layout, plus one small file per rank,
  ``acco_round_state_dp_rank_<r>.pt``, holding the round state.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Optional

import torch
from deepspeed import comm as ds_dist
from deepspeed.runtime.engine import DeepSpeedEngine
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

from . import elastic
from ds_acco.rounds.committed import CommittedStateDict, committed_parameters
from ds_acco.checkpoint.atomic import atomic_save, atomic_torch_save, latest_tag
from ds_acco.config.schema import AccoConfig, AccoConfigError
from ds_acco.checkpoint.gate import destroy_verification_group, verification_group
from ds_acco.checkpoint.verify import FiniteCheck, finite_at_save, optimizer_tensors
from .verify import (MODEL_FILE, OPTIM_FILE, refuse_if_written_by_ds_acco, refuse_non_finite,
                               start_verify_tag)
from ds_acco.layout.flat_buffer import FlatLayout, ShardedGroup, rebind_params
from ds_acco.rounds.engine import COMMIT, RoundEngine
from ds_acco.optim.shard_optimizer import ShardOptimizer
from ds_acco.telemetry.startup_line import announce, round_fields
from ds_acco.telemetry.records import RoundRecord

logger = logging.getLogger("ds_acco")

ROUND_STATE_FILE = "acco_round_state_dp_rank_{rank}.pt"


class AccoDeepSpeedEngine(DeepSpeedEngine):
    """A ``DeepSpeedEngine`` whose ZeRO-1 reduce/step/all-gather run as background ACCO rounds."""

    def __init__(self, *args: Any, acco_config: AccoConfig, **kwargs: Any):
        # nn.Module.__setattr__ is not ready yet, and DeepSpeedEngine.__getattr__ forwards
        # unknown names to the model: keep our attributes in __dict__ from the start.
        self.__dict__["acco"] = None
        self.__dict__["_acco_config"] = acco_config
        self.__dict__["_acco_samples"] = 0
        self.__dict__["_acco_export"] = None
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
        for hook in opt._grad_acc_hooks:
            hook.remove()
        opt._grad_acc_hooks = []
        self.enable_backward_allreduce = False

        dp_group = opt.real_dp_process_group[0]
        world = ds_dist.get_world_size(group=dp_group)
        groups = []
        for i, flat in enumerate(opt.bit16_groups_flat):
            params = list(opt.round_robin_bit16_groups[i])
            numels = tuple(p.numel() for p in params)
            layout = FlatLayout(
                numels=numels,
                shapes=tuple(p.shape for p in params),
                offsets=tuple(int(o) for o in opt.round_robin_bit16_offsets[i]),
                numel=sum(numels),
                padded_numel=flat.numel(),
                world_size=world,
            )
            master = opt.single_partition_of_fp32_groups[i]
            if flat.numel() % world or master.numel() != layout.shard_numel:
                raise RuntimeError(
                    f"unexpected DeepSpeed ZeRO-1 layout in group {i}: flat {flat.numel()} elements, "
                    f"fp32 partition {master.numel()}, world {world} (is deepspeed a supported release?)"
                )
            groups.append(ShardedGroup(params, layout, flat, master, rebind=self._acco_rebinder(i, layout)))
        shard_opt = ShardOptimizer(opt.optimizer, [g.master for g in groups], self.lr_scheduler)
        G = self.gradient_accumulation_steps()
        self.acco = RoundEngine(
            groups,
            shard_opt,
            config=self._acco_config,
            gradient_accumulation_steps=G,
            clip_grad_norm=self.gradient_clipping(),
            process_group=dp_group,
            # Backward leaves each micro-batch's gradient divided by G: by DeepSpeed
            # (scale_wrt_gas=True) or by the caller (HF Trainer divides the loss itself and
            # passes scale_wrt_gas=False). Undoing that 1/G and dividing by the micro-batch
            # count the round received gives mean(X), and equals stock ZeRO-1 when counts are G.
            grad_scale=lambda: float(opt.loss_scale if self.fp16_enabled() else 1.0) / G,
            on_swap=self._acco_on_swap,
        )
        self.acco.commits = self.global_steps
        # Exports (module.state_dict(), save_16bit_model, HF save_model) give the committed parameters.
        self._acco_export = CommittedStateDict(self.module, self.acco)
        announce(f"DeepSpeed ZeRO-1, {len(groups)} group(s)", self.global_rank, round_fields(self.acco))

    def _acco_rebinder(self, i: int, layout: FlatLayout):
        opt = self.optimizer

        def rebind(flat: torch.Tensor) -> None:
            # Keep DeepSpeed's own references (checkpointing, zero_to_fp32 shapes, get_lr...) on
            # the buffer the model now reads.
            rebind_params(opt.round_robin_bit16_groups[i], layout, flat)
            opt.bit16_groups_flat[i] = flat
            opt.parallel_partitioned_bit16_groups[i] = opt.get_data_parallel_partitions(flat, i)

        return rebind

    def _acco_on_swap(self, record: RoundRecord) -> None:
        self._acco_samples += sum(record.counts) * self.train_micro_batch_size_per_gpu()
        if record.kind != COMMIT:
            return
        self.global_steps += 1
        self.global_samples += self._acco_samples
        self._acco_samples = 0
        self._global_grad_norm = record.grad_norm
        self._step_applied = not record.skipped
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
        if self.__dict__.get("_acco_export") is not None:
            self._acco_export.remove()
            self.__dict__["_acco_export"] = None
        if self.__dict__.get("acco") is not None:
            self.acco.close(drain=False)
            self.__dict__["acco"] = None
        destroy_verification_group(self.__dict__)
        super().destroy()

    # ------------------------------------------------------------ checkpoints
    def _acco_dp_rank(self) -> int:
        return ds_dist.get_rank(group=self.optimizer.real_dp_process_group[0])

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):
        """DeepSpeed's checkpoint plus the round state, written atomically (see :mod:`ds_acco.checkpoint.atomic`)."""
        if self.acco is None:
            return super().save_checkpoint(save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        rounds = self.acco.state_dict()  # waits for the round in flight; nothing is swapped early
        tag = str(tag if tag is not None else f"global_step{self.global_steps}")
        client_state = dict(client_state or {})
        client_state["ds_acco"] = {"mode": self.acco.config.mode, "policy": self.acco.config.policy,
                                   "commits": self.acco.commits}

        def write(partial: str) -> bool:
            with self._acco_export.suspended():  # the model file holds the compute parameters: exact resume
                ok = super(AccoDeepSpeedEngine, self).save_checkpoint(save_dir, partial, client_state, False,
                                                                      exclude_frozen_parameters)
            atomic_torch_save({"rounds": rounds, "samples": self._acco_samples},
                              os.path.join(save_dir, partial, ROUND_STATE_FILE.format(rank=self._acco_dp_rank())))
            return ok

        dp = self._acco_dp_rank()
        claim = [ROUND_STATE_FILE.format(rank=dp), OPTIM_FILE.format(rank=dp)] + [MODEL_FILE] * (dp == 0)
        # summed while the files are written; the manifest records the outcome, which spares the load its sums
        finite = FiniteCheck(self._acco_master_tensors())
        return atomic_save(save_dir, tag, self.global_rank, write, save_latest, self.checkpoint_engine,
                           self._acco_config.checkpoint.fsync, claim=claim, finite=finite)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """DeepSpeed's load plus the round state; nothing loaded is used before every rank verified every file.

        The files are hashed while DeepSpeed parses them, and no state dict reaches the engine
        before the ranks agreed (:mod:`ds_acco.checkpoint.gate`). The loaded masters and
        moments are checked finite: by the save's record in the verified manifest when they
        are the saved tensors, else by sums that run while the round state loads.
        """
        if self.acco is None:
            return super().load_checkpoint(load_dir, tag, load_module_strict, load_optimizer_states,
                                           load_lr_scheduler_states, load_module_only, custom_load_fn)
        self.acco.reset_rounds()
        if tag is None:
            tag = latest_tag(load_dir)
            if tag is None:
                return super().load_checkpoint(load_dir, tag, load_module_strict, load_optimizer_states,
                                               load_lr_scheduler_states, load_module_only, custom_load_fn)
        tag = str(tag)
        timeout_s = self._acco_config.timeout_s
        dp = ds_dist.get_world_size(group=self.optimizer.real_dp_process_group[0])
        pending = start_verify_tag(load_dir, tag, state_file=ROUND_STATE_FILE, dp_rank=self._acco_dp_rank(),
                                   dp_world=dp, salvage=self._acco_config.checkpoint.salvage, timeout_s=timeout_s,
                                   group=verification_group(self.__dict__, None, timeout_s))
        manifest = pending.verdict().manifest if pending.up_front else pending.manifest
        # the manifest says how many ranks saved; only a checkpoint without one needs its model file read for it
        saved_dp = manifest["world_size"] if manifest else elastic.saved_dp_world_size(load_dir, tag)
        if not load_module_only and saved_dp != dp:
            out = self._acco_load_resharded(load_dir, tag, load_module_strict, load_optimizer_states,
                                            load_lr_scheduler_states)
            refuse_non_finite(load_dir, tag, self._acco_master_tensors())
            return out
        with pending.gating(self.checkpoint_engine):
            path, client_state = super().load_checkpoint(load_dir, tag, load_module_strict, load_optimizer_states,
                                                         load_lr_scheduler_states, load_module_only, custom_load_fn)
        verdict = pending.verdict()  # in already, unless DeepSpeed loaded no file
        if path is None:
            return path, client_state
        if verdict.stock:
            refuse_if_written_by_ds_acco(load_dir, tag, client_state)
        # the masters and moments just loaded are the saved ones, which the save found finite: nothing to sum
        proven = (finite_at_save(verdict.manifest) and load_optimizer_states and not load_module_only
                  and self.zero_load_from_fp32_weights())
        finite = None if proven else FiniteCheck(self._acco_master_tensors())  # sums while the round state loads
        state_file = os.path.join(load_dir, tag, ROUND_STATE_FILE.format(rank=self._acco_dp_rank()))
        resumable = (load_optimizer_states and not load_module_only and os.path.exists(state_file)
                     and not verdict.dropped)
        found = torch.tensor([int(resumable)])
        ds_dist.all_reduce(found, op=ds_dist.ReduceOp.MIN)
        saved = torch.load(state_file, map_location="cpu", weights_only=False) if bool(found.item()) else None
        if finite is not None:
            finite.settle(os.path.join(load_dir, tag))
        if saved is not None:
            self.acco.load_state_dict(saved["rounds"])
            self._acco_samples = saved["samples"]
        else:
            if self.global_rank == 0 and not verdict.dropped:
                logger.warning("ds_acco: %s/%s has no ACCO round state for every rank (a checkpoint no ds_acco run "
                               "wrote, or a module-only load): its files were not verified, and rounds bootstrap "
                               "afresh at step %d, so the run from here is not the trajectory an uninterrupted "
                               "ds_acco run would take", load_dir, tag, self.global_steps)
            self.acco.reset_rounds(commits=self.global_steps)
        return path, client_state

    def _acco_master_tensors(self) -> list:
        """The fp32 master partitions and their optimizer moments: what a save writes and a load must find finite."""
        masters = self.optimizer.single_partition_of_fp32_groups
        named = [(f"fp32 partition of group {i}", t) for i, t in enumerate(masters)]
        return named + optimizer_tensors(self.optimizer.optimizer)

    def _acco_load_resharded(self, load_dir, tag, strict, load_optimizer_states, load_lr_scheduler_states):
        """Load a checkpoint saved with another DP world size (see ds_acco.deepspeed.elastic)."""
        dp = ds_dist.get_world_size(group=self.optimizer.real_dp_process_group[0])
        if self.global_rank == 0:
            logger.info("ds_acco: %s/%s was saved with dp=%d; re-partitioning through a universal checkpoint",
                        load_dir, tag, elastic.saved_dp_world_size(load_dir, tag))
            elastic.convert_to_universal(load_dir, tag)
        ds_dist.barrier()
        try:
            with elastic.universal_loading(self):
                path, client_state = super().load_checkpoint(
                    elastic.universal_dir(load_dir, tag), tag, strict, load_optimizer_states, load_lr_scheduler_states)
        except IndexError as exc:
            raise RuntimeError(
                f"DeepSpeed's universal-checkpoint loader could not re-partition {load_dir}/{tag} for dp={dp}: "
                "a parameter group is so small that some rank would own only padding. Load with the saved "
                "world size, or merge small parameter groups."
            ) from exc
        # The universal loader sets the compute parameters from the fp32 masters; restore the
        # weights the model actually had when it was saved (an ACCO estimate, possibly).
        self.module.load_state_dict(elastic.saved_module_state(load_dir, tag), strict=strict)
        self.acco.reset_rounds(commits=self.global_steps, compute_committed=False)  # maybe an estimate
        return path, client_state
