"""One save and one load for both DeepSpeed engines: DeepSpeed's files plus a ds_acco state file per rank.

Both engines (ACCO rounds on ZeRO-1, Streaming DiLoCo on stage 0) checkpoint the same way and
differ only in what their per-rank state file holds, which tensors must be finite, and how
another world size is handled. So the steps live here once, and each engine answers the
hooks of :class:`VerifiedCheckpoints`:

save
    wait for the round in flight (nothing is swapped early, so saving never changes the
    trajectory), add a ``ds_acco`` entry to the client state, let DeepSpeed write its files into
    ``<tag>.partial`` and the engine its state file, sum the masters and moments in the
    background meanwhile, then publish the tag atomically with its manifest
    (:func:`ds_acco.checkpoint.atomic.atomic_save`).
load
    resolve the tag, verify every file on every rank (in the background while DeepSpeed parses,
    or up front when the load cannot start without the verdict: :mod:`ds_acco.checkpoint.gate`),
    let the engine re-partition another world size, load DeepSpeed's files with nothing reaching
    the engine before the ranks agree, refuse a tag that says ds_acco wrote it but lost ds_acco's
    files, load the state file on every rank or on none, and refuse non-finite masters or
    moments (unless the verified manifest proves them finite at the save).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Optional

import torch
from deepspeed import comm as ds_dist

from ds_acco.checkpoint import safe_load, signing
from ds_acco.checkpoint.atomic import atomic_save, atomic_torch_save, latest_tag
from ds_acco.checkpoint.save_failure import CheckpointSaveError, raise_or_continue
from ds_acco.checkpoint.files import replaced
from ds_acco.checkpoint.gate import destroy_verification_group, verification_group
from ds_acco.checkpoint.verify import FiniteCheck, refuse_unless_finite

from . import _internals as internals
from .verify import refuse_if_written_by_ds_acco, start_verify_tag

logger = logging.getLogger("ds_acco")


class VerifiedCheckpoints:
    """``save_checkpoint`` / ``load_checkpoint`` of a ds_acco DeepSpeed engine (mixed in before DeepSpeedEngine),
    which implements the hooks below; also what both engines share at a SIGTERM and in ``destroy()``."""

    def _acco_read_key(self) -> None:
        """The signing key (:mod:`ds_acco.checkpoint.signing`), read at take-over (a bad key file fails there)."""
        self.__dict__["_acco_signing_key"] = signing.load_key(self._acco_config.checkpoint.signing_key_file)

    STATE_FILE = ""
    """The per-rank state file's name, with a ``{rank}`` field."""
    FINITE_AFTER_OWN_STATE = False
    """True when the tensors to check come from the state file (check after loading it); False when
    DeepSpeed's files hold them (checked before the state file is applied)."""
    RESTART_NOTE = ""
    """What starts afresh when some rank has no state file, for the WARNING."""

    # ------------------------------------------------------------ hooks
    def _acco_dp(self) -> tuple[int, int, Any]:
        """``(rank, world size, process group)`` of data parallelism."""
        raise NotImplementedError

    def _acco_own_state(self) -> dict:
        """This rank's state file contents, taken before the save (waits for the round in flight)."""
        raise NotImplementedError

    def _acco_client_entry(self) -> dict:
        """The ``ds_acco`` entry of DeepSpeed's client state (read back to refuse a stripped tag)."""
        raise NotImplementedError

    def _acco_claim(self) -> list[str]:
        """The files of the tag this rank writes (it hashes them for the manifest)."""
        raise NotImplementedError

    def _acco_finite_tensors(self) -> list:
        """``(name, tensor)`` of what a save writes and a load must find finite."""
        raise NotImplementedError

    def _acco_saving(self):
        """A context manager around DeepSpeed's save (e.g. exports suspended)."""
        return contextlib.nullcontext()

    def _acco_before_load(self) -> None:
        """Make the engine idle before its buffers are overwritten."""
        raise NotImplementedError

    def _acco_load_other_world(self, load_dir: str, tag: str, manifest: Optional[dict], pending: Any,
                               args: tuple) -> Optional[tuple]:
        """Load a checkpoint saved with another world size instead of DeepSpeed's own load; None: not needed
        (or done later, in :meth:`_acco_load_resharded_state`)."""
        return None

    def _acco_load_resharded_state(self, load_dir: str, tag: str, strict: bool) -> bool:
        """After DeepSpeed's load: restore state files saved by another number of ranks; False: not the case."""
        return False

    def _acco_load_own_state(self, load_dir: str, tag: str, path: str, strict: bool) -> None:
        """Restore the state file at ``path`` (every rank found one)."""
        raise NotImplementedError

    def _acco_reset_own_state(self) -> None:
        """No state file on some rank (a stock checkpoint, a module-only load): start the rounds afresh."""
        raise NotImplementedError

    def _acco_proven_finite(self, manifest: Optional[dict], from_state: bool, load_optimizer_states: bool,
                            load_module_only: bool) -> bool:
        """True when the loaded tensors are the saved ones the verified manifest says were finite."""
        raise NotImplementedError

    # ------------------------------------------------------------ save
    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):
        """DeepSpeed's checkpoint plus this engine's state file, written atomically, with a manifest."""
        if self.acco is None:
            return super().save_checkpoint(save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        own = self._acco_own_state()
        tag = str(tag if tag is not None else f"global_step{self.global_steps}")
        client_state = dict(client_state or {}, ds_acco=self._acco_client_entry())
        parent = super().save_checkpoint
        state_file = self.STATE_FILE.format(rank=self._acco_dp()[0])

        def write(partial: str, guard) -> bool:
            with self._acco_saving(), internals.guarded_recovery_script(self, guard):
                ok = parent(save_dir, partial, client_state, False, exclude_frozen_parameters)
            target = os.path.join(save_dir, partial, state_file)
            with guard(target, own):
                atomic_torch_save(own, target)
            return ok

        # summed while the files are written; the manifest records the outcome, which spares the load its sums
        finite = FiniteCheck(self._acco_finite_tensors())
        try:
            return atomic_save(save_dir, tag, self.global_rank, write, save_latest, self.checkpoint_engine,
                               self._acco_config.checkpoint.fsync, claim=self._acco_claim(), finite=finite,
                               key=self._acco_signing_key)
        except CheckpointSaveError as exc:
            return raise_or_continue(exc, self._acco_config.checkpoint.on_save_error, self.global_rank)

    # ------------------------------------------------------------ load
    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """DeepSpeed's load plus this engine's state; nothing loaded is used before every rank verified every file."""
        args = (load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only, custom_load_fn)
        parent: Callable = super().load_checkpoint
        if self.acco is None:
            return parent(load_dir, tag, *args)
        self._acco_before_load()
        tag = tag if tag is not None else latest_tag(load_dir)
        if tag is None:
            return parent(load_dir, tag, *args)
        with self._acco_safe_loads():
            return self._acco_load(load_dir, str(tag), args)

    def _acco_safe_loads(self):
        """Within the block, DeepSpeed's checkpoint engine unpickles with torch's restricted unpickler and the
        classes DeepSpeed's files hold (:mod:`ds_acco.checkpoint.safe_load`): no file can run code on load."""
        weights_only = self._acco_config.checkpoint.weights_only

        def load(path, map_location=None):
            return safe_load.load(path, map_location=map_location, allow=internals.CHECKPOINT_CLASSES,
                                  weights_only=weights_only)

        return replaced(self.checkpoint_engine, "load", load)

    def _acco_load(self, load_dir: str, tag: str, args: tuple) -> tuple:
        load_module_strict, load_optimizer_states, _, load_module_only, _ = args
        parent: Callable = super().load_checkpoint
        dp_rank, dp_world, group = self._acco_dp()
        timeout_s = self._acco_config.timeout_s
        pending = start_verify_tag(load_dir, tag, state_file=self.STATE_FILE, dp_rank=dp_rank, dp_world=dp_world,
                                   salvage=self._acco_config.checkpoint.salvage, timeout_s=timeout_s,
                                   group=verification_group(self.__dict__, group, timeout_s),
                                   key=self._acco_signing_key, weights_only=self._acco_config.checkpoint.weights_only)
        manifest = pending.verdict().manifest if pending.up_front else pending.manifest
        resharded = self._acco_load_other_world(load_dir, tag, manifest, pending, args)
        if resharded is not None:
            return resharded
        with pending.gating(self.checkpoint_engine):  # files hashed while DeepSpeed parses; used after the verdict
            path, client_state = parent(load_dir, tag, *args)
        verdict = pending.verdict()  # in already, unless DeepSpeed loaded no file
        if path is None:
            return path, client_state
        if verdict.stock:
            refuse_if_written_by_ds_acco(load_dir, tag, client_state)
        wanted = load_optimizer_states and not load_module_only and not verdict.dropped
        if wanted and self._acco_load_resharded_state(load_dir, tag, load_module_strict):
            from_state = True
        else:
            state_file = os.path.join(load_dir, tag, self.STATE_FILE.format(rank=dp_rank))
            found = torch.tensor([int(wanted and os.path.exists(state_file))])
            ds_dist.all_reduce(found, op=ds_dist.ReduceOp.MIN, group=group)
            from_state = bool(found.item())
            if not self.FINITE_AFTER_OWN_STATE:
                self._acco_check_finite(load_dir, tag, verdict.manifest, from_state, args)
            if from_state:
                self._acco_load_own_state(load_dir, tag, state_file, load_module_strict)
            else:
                if self.global_rank == 0 and not verdict.dropped:
                    logger.warning("ds_acco: %s/%s has no ds_acco state for every rank (a checkpoint no ds_acco "
                                   "run wrote, or a module-only load): its files were not verified; %s at step %d, "
                                   "so the run from here is not the trajectory an uninterrupted ds_acco run would "
                                   "take", load_dir, tag, self.RESTART_NOTE, self.global_steps)
                self._acco_reset_own_state()
        if self.FINITE_AFTER_OWN_STATE:
            self._acco_check_finite(load_dir, tag, verdict.manifest, from_state, args)
        return path, client_state

    def _acco_check_finite(self, load_dir: str, tag: str, manifest: Optional[dict], from_state: bool,
                           args: tuple) -> None:
        """Refuse non-finite loaded masters or moments on every rank, unless the manifest proves them finite."""
        if not self._acco_proven_finite(manifest, from_state, args[1], args[3]):
            refuse_unless_finite(os.path.join(load_dir, tag), self._acco_finite_tensors(), group=self._acco_dp()[2])

    # ------------------------------------------------------------ preemption, clean-up
    def _acco_note_stop(self) -> None:
        """Every rank learned of a SIGTERM at this boundary: act on it once the optimizer step is done."""
        self.__dict__["_acco_stop_due"] = True

    def _acco_stop_if_due(self) -> None:
        """At the end of ``step()`` after a SIGTERM: save (``acco.preemption.checkpoint_dir``), then every rank
        exits with ``acco.preemption.exit_code`` (:class:`~ds_acco.comm.stop_signal.AccoPreempted`)."""
        if not self.__dict__.pop("_acco_stop_due", False):
            return
        folder = self._acco_config.preemption.checkpoint_dir
        if folder:
            self.save_checkpoint(folder)
            if self.global_rank == 0:
                logger.warning("ds_acco: stopped after a SIGTERM at step %d; saved %s/%s; exit status %d",
                               self.global_steps, folder, latest_tag(folder), self._acco_config.preemption.exit_code)
        self.acco.preempt()

    def destroy(self) -> None:
        if self.__dict__.get("acco") is not None:
            self.acco.close(drain=False)
            self.__dict__["acco"] = None
        destroy_verification_group(self.__dict__)
        super().destroy()
