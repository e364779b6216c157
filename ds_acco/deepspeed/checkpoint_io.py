"""One save and one load for both DeepSpeed engines: DeepSpeed's files plus a ds_acco state file per rank.

Both engines (ACCO rounds on ZeRO-1, Streaming DiLoCo on stage 0) checkpoint the same way and differ only in their
state part (:class:`StatePart`), so the steps live here once, in the :class:`Checkpointer` each engine holds. A save
waits for the round in flight (nothing is swapped early: saving never changes the trajectory) and is published
atomically with its manifest; a load lets nothing DeepSpeed parsed reach the engine before every rank verified every
file (:mod:`ds_acco.checkpoint.gate`), and loads the state files on every rank or on none. A universal checkpoint
(``checkpoint.load_universal``) loads as DeepSpeed loads it, and the part starts afresh from the committed
parameters. The load runs here from start to end: the part answers, it never calls back.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional, Protocol

import torch
from deepspeed import comm as ds_dist
from deepspeed.runtime.engine import DeepSpeedEngine

from ds_acco.checkpoint import signing
from ds_acco.checkpoint.atomic import atomic_save, atomic_torch_save, latest_tag
from ds_acco.checkpoint.gate import VerificationGroup
from ds_acco.checkpoint.save_failure import raise_or_continue
from ds_acco.checkpoint.verify import FiniteCheck, finite_at_save, refuse_unless_finite
from ds_acco.config import AccoConfig
from ds_acco.errors import CheckpointSaveError

from . import _internals as internals
from . import elastic
from .verify import MODEL_FILE, OPTIM_FILE, refuse_if_written_by_ds_acco, start_verify_tag

logger = logging.getLogger("ds_acco")
UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.4}}
"""What ``ds_to_universal`` needs in a tag's client state, so it converts a tag as it is (ZeRO-1 has no
tensor-parallel patterns to add); written unless the script passes its own."""


@dataclass(frozen=True)
class LoadOptions:
    """``load_checkpoint``'s options, by name (DeepSpeed's keyword arguments of the same meaning)."""

    strict: bool = True
    optimizer_states: bool = True
    lr_scheduler_states: bool = True
    module_only: bool = False
    custom_load_fn: Optional[Callable] = None

    @property
    def args(self) -> tuple:  # DeepSpeed's load_checkpoint arguments after load_dir and tag, in its order
        return self.strict, self.optimizer_states, self.lr_scheduler_states, self.module_only, self.custom_load_fn


class StatePart(Protocol):
    """An engine's own state in its checkpoints (a ``Stateful`` part with a file of its own per rank), and what only the
    engine knows of loading it: the round engine's on ZeRO-1 (:class:`~ds_acco.deepspeed.engine. RoundCheckpoint`), the
    streaming engine's on stage 0 (:class:`~ds_acco.deepspeed.streaming_engine. StreamingCheckpoint`)."""

    state_file: str  # the per-rank state file's name, with a ``{rank}`` field
    restart_note: str  # what starts afresh when some rank has no state file, for the WARNING

    def state_dict(self) -> dict: ...  # this rank's state file, taken before the save (the round in flight waited for)
    def load_state_dict(self, path: str, options: LoadOptions) -> None: ...  # every rank found its file
    def reset(self) -> None: ...  # no state file on some rank (stock, universal, module-only): start afresh
    def client_entry(self) -> dict: ...  # the client state's ``ds_acco`` entry (a stripped tag is refused by it)
    def finite_tensors(self) -> list: ...  # ``(name, tensor)`` a save writes and a load must find finite
    def loaded_are_saved(self, from_state: bool, options: LoadOptions) -> bool: ...  # (then the manifest vouches)
    def saving(self) -> ContextManager: ...  # around DeepSpeed's save (e.g. exports suspended)
    def before_load(self) -> None: ...  # idle the engine before its buffers are overwritten

    def load_other_world(self, load_dir: str, tag: str, manifest: Optional[dict],
                         options: LoadOptions) -> Optional[tuple]:
        """Load a checkpoint of another world size instead of DeepSpeed's own load; None: not needed."""

    def load_resharded_state(self, load_dir: str, tag: str, options: LoadOptions) -> bool:
        """After DeepSpeed's load: restore state files saved by another number of ranks; False: not the case."""


class CheckpointedEngine(DeepSpeedEngine):
    """A ds_acco DeepSpeed engine: once ``acco`` runs, its checkpoints go through its :class:`Checkpointer`."""

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):
        """DeepSpeed's checkpoint plus the engine's state files, written atomically, with a manifest."""
        if self.acco is None:
            return super().save_checkpoint(save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        return self.acco_checkpoints.save(save_dir, tag, client_state, save_latest, exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """DeepSpeed's load plus the engine's state; nothing loaded is used before every rank verified every file."""
        options = LoadOptions(load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only,
                              custom_load_fn)
        if self.acco is None:
            return super().load_checkpoint(load_dir, tag, *options.args)
        return self.acco_checkpoints.load(load_dir, tag, options)

    def destroy(self) -> None:
        if self.__dict__.get("acco") is not None:
            self.acco.close(drain=False)
            self.__dict__["acco"] = None
        if self.__dict__.get("acco_checkpoints") is not None:
            self.acco_checkpoints.close()
        super().destroy()


class Checkpointer:
    """A ds_acco DeepSpeed engine's saves and loads, and its stop after a SIGTERM; ``group``: data parallelism's."""

    def __init__(self, engine: DeepSpeedEngine, part: StatePart, config: AccoConfig, group: Any):
        self.engine, self.part, self.config, self.group = engine, part, config, group
        self.key = signing.load_key(config.checkpoint.signing_key_file)  # a bad key file fails at take-over
        self.verification = VerificationGroup(group, config.timeout_s)
        self.stop_due = False

    @property
    def dp_rank(self) -> int:
        return ds_dist.get_rank(group=self.group)

    # ------------------------------------------------------------ save
    def save(self, save_dir: str, tag: Any, client_state: Optional[dict], save_latest: bool,
             exclude_frozen_parameters: bool) -> bool:
        """DeepSpeed's checkpoint plus the part's state file, written atomically, with a manifest."""
        eng, part, dp = self.engine, self.part, self.dp_rank
        own = part.state_dict()
        tag = str(tag if tag is not None else f"global_step{eng.global_steps}")
        client_state = {**UNIVERSAL_INFO, **(client_state or {}), "ds_acco": part.client_entry()}
        state_file = part.state_file.format(rank=dp)

        def write(partial: str, guard) -> bool:
            with part.saving(), internals.guarded_recovery_script(eng, guard):
                ok = DeepSpeedEngine.save_checkpoint(eng, save_dir, partial, client_state, False,
                                                     exclude_frozen_parameters)
            target = os.path.join(save_dir, partial, state_file)
            with guard(target, own):
                atomic_torch_save(own, target)
            return ok

        # summed while the files are written; the manifest records the outcome, which spares the load its sums
        finite = FiniteCheck(part.finite_tensors())
        claim = [state_file] + [OPTIM_FILE.format(rank=dp)] * bool(eng.zero_optimization()) + [MODEL_FILE] * (dp == 0)
        try:
            return atomic_save(save_dir, tag, eng.global_rank, write, save_latest, eng.checkpoint_engine,
                               self.config.checkpoint.fsync, claim=claim, finite=finite, key=self.key)
        except CheckpointSaveError as exc:
            return raise_or_continue(exc, self.config.checkpoint.on_save_error, eng.global_rank)

    # ------------------------------------------------------------ load
    def load(self, load_dir: str, tag: Any, options: LoadOptions) -> tuple:
        """DeepSpeed's load plus the part's state; nothing loaded is used before every rank verified every file."""
        self.part.before_load()
        universal = internals.loads_universal(self.engine)  # (DeepSpeed finds its tag: "latest_universal")
        tag = tag if tag is not None or universal else latest_tag(load_dir)
        if tag is None and not universal:
            return DeepSpeedEngine.load_checkpoint(self.engine, load_dir, tag, *options.args)
        with internals.restricted_loads(self.engine, self.config.checkpoint.weights_only):
            if universal:
                return self._load_universal(load_dir, tag, options)
            return self._load(load_dir, str(tag), options)

    def _load(self, load_dir: str, tag: str, options: LoadOptions) -> tuple:
        eng, part, cfg = self.engine, self.part, self.config
        pending = start_verify_tag(load_dir, tag, state_file=part.state_file, dp_rank=self.dp_rank,
                                   dp_world=ds_dist.get_world_size(group=self.group), salvage=cfg.checkpoint.salvage,
                                   timeout_s=cfg.timeout_s, group=self.verification.get(), key=self.key,
                                   weights_only=cfg.checkpoint.weights_only)
        manifest = pending.verdict().manifest if pending.up_front else pending.manifest
        resharded = part.load_other_world(load_dir, tag, manifest, options)
        if resharded is not None:
            self._check_finite(load_dir, tag, None, False, options)
            return resharded
        with pending.gating(eng.checkpoint_engine):  # files hashed while DeepSpeed parses; used after the verdict
            path, client_state = DeepSpeedEngine.load_checkpoint(eng, load_dir, tag, *options.args)
        verdict = pending.verdict()  # in already, unless DeepSpeed loaded no file
        if path is None:
            return path, client_state
        if verdict.stock:
            refuse_if_written_by_ds_acco(load_dir, tag, client_state)
        wanted = options.optimizer_states and not options.module_only and not verdict.dropped
        from_state = wanted and part.load_resharded_state(load_dir, tag, options)
        if not from_state:
            state_file = os.path.join(load_dir, tag, part.state_file.format(rank=self.dp_rank))
            found = torch.tensor([int(wanted and os.path.exists(state_file))])
            ds_dist.all_reduce(found, op=ds_dist.ReduceOp.MIN, group=self.group)
            from_state = bool(found.item())
            if from_state:
                part.load_state_dict(state_file, options)
            else:
                if eng.global_rank == 0 and not verdict.dropped:
                    logger.warning("ds_acco: %s/%s has no ds_acco state for every rank (a checkpoint no ds_acco "
                                   "run wrote, or a module-only load): its files were not verified; %s at step %d, "
                                   "so the run from here is not the trajectory an uninterrupted ds_acco run would "
                                   "take", load_dir, tag, part.restart_note, eng.global_steps)
                part.reset()
        self._check_finite(load_dir, tag, verdict.manifest, from_state, options)
        return path, client_state

    def _load_universal(self, load_dir: str, tag: Optional[str], options: LoadOptions) -> tuple:
        """A universal checkpoint (``ds_to_universal``'s folder): DeepSpeed re-partitions it for this world and sets
        the compute parameters from the fp32 masters; the part starts afresh from them."""
        path, client_state = elastic.load_universal(self.engine, load_dir, tag, options,
                                                    self.config.checkpoint.weights_only)
        if path is None:
            return path, client_state
        self.part.reset()
        folder = os.path.dirname(path)
        if self.engine.global_rank == 0:
            logger.warning("ds_acco: %s is a universal checkpoint (ds_to_universal), loaded unverified onto %d ranks: "
                           "%s from the committed parameters at step %d (micro-batches accumulated after that commit, "
                           "the kept estimate and error-feedback residuals were not kept)", folder,
                           ds_dist.get_world_size(group=self.group), self.part.restart_note, self.engine.global_steps)
        self._check_finite(*os.path.split(folder), None, False, options)
        return path, client_state

    def _check_finite(self, load_dir: str, tag: str, manifest: Optional[dict], from_state: bool,
                      options: LoadOptions) -> None:
        """Refuse non-finite loaded masters or moments on every rank, unless the manifest proves them finite."""
        if not (finite_at_save(manifest) and self.part.loaded_are_saved(from_state, options)):
            refuse_unless_finite(os.path.join(load_dir, tag), self.part.finite_tensors(), group=self.group)

    # ------------------------------------------------------------ preemption, clean-up
    def note_stop(self) -> None:  # every rank learned of a SIGTERM here: act once the optimizer step is done
        self.stop_due = True

    def stop_if_due(self, preempt: Callable[[], None]) -> None:
        """At the end of ``step()`` after a SIGTERM: save (``acco.preemption.checkpoint_dir``), then every rank
        exits with ``acco.preemption.exit_code`` (``preempt``: the engine's, which raises
        :class:`~ds_acco.errors.AccoPreempted`)."""
        if not self.stop_due:
            return
        self.stop_due = False
        folder = self.config.preemption.checkpoint_dir
        if folder:
            self.engine.save_checkpoint(folder)
            if self.engine.global_rank == 0:
                logger.warning("ds_acco: stopped after a SIGTERM at step %d; saved %s/%s; exit status %d",
                               self.engine.global_steps, folder, latest_tag(folder), self.config.preemption.exit_code)
        preempt()

    def close(self) -> None:
        self.verification.destroy()
