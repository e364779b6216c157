"""``AccoFSDP``: an FSDP2 model whose gradient rounds run in the background.

The take-over: FSDP2 is kept unsharded and silent (:mod:`ds_acco.fsdp._fsdp2`), every
trainable parameter's compute data moves into a round-engine buffer (one packed group per
bucket of ``fully_shard`` units, :mod:`ds_acco.fsdp.buckets`), and FSDP2's sharded DTensor
parameters become the master shards the optimizer steps (:mod:`ds_acco.fsdp.shard_optimizer`).
``close()`` hands the model back to stock FSDP2.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from ds_acco.checkpoint import signing
from ds_acco.config import AccoConfig
from ds_acco.errors import AccoConfigError
from ds_acco.rounds.committed import committed_parameters
from ds_acco.rounds.engine import RoundEngine
from ds_acco.telemetry.records import Telemetry

from . import checkpoint
from ._fsdp2 import FSDP2Model
from .buckets import DEFAULT_BUCKET_CAP_MB, unit_groups
from .shard_optimizer import DTensorShardOptimizer


class AccoFSDP:
    """An FSDP2 model whose gradient rounds run in the background (see the module docstring).

    ``engine`` is the :class:`RoundEngine` (one group per bucket of ``fully_shard`` units), ``optimizer`` the
    torch optimizer over FSDP2's sharded parameters, ``lr_scheduler`` stepped once per commit (or None).
    """

    def __init__(self, module: nn.Module, fsdp: FSDP2Model, optimizer: torch.optim.Optimizer, lr_scheduler: Any,
                 config: AccoConfig, gradient_accumulation_steps: int, clip_grad_norm: Optional[float],
                 grad_scale: Union[float, Callable[[], float]], *, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB):
        self.module, self.fsdp, self.optimizer, self.lr_scheduler = module, fsdp, optimizer, lr_scheduler
        self.closed = False
        self.signing_key = signing.load_key(config.checkpoint.signing_key_file)  # a bad key file fails here
        self.params = [p for p in fsdp.params if p.trainable]
        if not self.params:
            raise AccoConfigError("model: no trainable parameter under fully_shard; nothing for ACCO to train")
        fsdp.hold_unsharded()
        try:
            groups, units = unit_groups(fsdp, len(fsdp.ranks), bucket_cap_mb)
            self.params = [p for unit in units for p in unit]  # the order of the rounds' packed shards
            shard_opt = DTensorShardOptimizer(optimizer, self.params, [g.packing for g in groups], lr_scheduler)
            self.engine = RoundEngine(
                groups, shard_opt, config=config, gradient_accumulation_steps=gradient_accumulation_steps,
                clip_grad_norm=clip_grad_norm, process_group=fsdp.process_group, grad_scale=grad_scale,
                on_stop=self._preempt,
            )
            if self.engine.rank != fsdp.shard_rank:  # master shard r must be the round's shard r
                self.engine.close(drain=False)
                raise RuntimeError(f"ds_acco.fsdp: round rank {self.engine.rank} != FSDP2 shard rank {fsdp.shard_rank}")
        except BaseException:
            fsdp.release()
            raise
        # model.state_dict() reads FSDP2's sharded parameters, which are the master shards a round in
        # flight may be stepping: wait for it first (not swapped in, so training is unchanged). They
        # are then the committed parameters.
        self._quiesce_hook = module.register_state_dict_pre_hook(self._quiesce_for_state_dict)
        self.engine.announce(f"FSDP2, {len(self.params)} parameters of {len(fsdp.groups)} fully_shard units in "
                             f"{len(groups)} packed buckets")

    # ------------------------------------------------------------ training loop
    @property
    def config(self) -> AccoConfig:
        return self.engine.config

    @property
    def telemetry(self) -> Telemetry:
        return self.engine.telemetry

    @property
    def commits(self) -> int:
        """Optimizer steps (commits) applied so far."""
        return self.engine.commits

    @property
    def micro_batches(self) -> int:
        return self.engine.micro_batches

    def after_micro_batch(self) -> bool:
        """Call after every backward; True when the compute parameters changed (see RoundEngine)."""
        return self.engine.after_micro_batch()

    def finish(self) -> None:
        """Drain and commit everything accumulated: the compute parameters equal the committed ones."""
        self.engine.finish()

    def committed_parameters(self):
        """``with acco.committed_parameters():`` forward passes use the committed parameters (evaluation)."""
        return committed_parameters(self.engine)

    def _quiesce_for_state_dict(self, *_: Any) -> None:
        if not self.closed:
            self.engine.quiesce()

    def close(self, drain: bool = True) -> None:
        """Stop the rounds and hand the model back to stock FSDP2 (sharded; its next forward all-gathers).

        ``drain``: finish the round in flight first (its update is applied). Telemetry stays readable.
        """
        if self.closed:
            return
        self.closed = True
        self._quiesce_hook.remove()
        try:
            self.engine.close(drain=drain)
        finally:
            self.fsdp.release()

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint_id: Any, extra: Optional[dict] = None) -> bool:
        """Save model, optimizer, scheduler and round state with ``torch.distributed.checkpoint`` (collective).

        ``extra``: replicated values of your own (e.g. every rank's data cursor, gathered). Returns False
        when a write failed and ``acco.checkpoint.on_save_error`` is ``"continue"`` (else that raises
        :class:`~ds_acco.checkpoint.save_failure.CheckpointSaveError` on every rank).
        """
        return checkpoint.save(self, checkpoint_id, extra)

    def load_checkpoint(self, checkpoint_id: Any) -> Optional[dict]:
        """Load what :meth:`save_checkpoint` wrote (collective); returns its ``extra``.

        Same world size and acco block: resumes exactly. Another world size, a :class:`StockFSDP`
        or a stock FSDP2 checkpoint: see :mod:`ds_acco.fsdp.checkpoint`.
        """
        return checkpoint.load(self, checkpoint_id)

    def _preempt(self) -> None:
        """Every rank learned of a SIGTERM: save into ``acco.preemption.checkpoint_dir`` if set, then exit."""
        folder = self.config.preemption.checkpoint_dir
        if folder:
            self.save_checkpoint(folder)
        self.engine.preempt()

    def _check_checkpointable(self) -> None:
        if self.closed:
            raise AccoConfigError("checkpoint: this AccoFSDP is closed; save or load before close()")
