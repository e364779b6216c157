"""Checkpoints of :class:`ds_acco.fsdp.AccoFSDP` (and :class:`~ds_acco.fsdp.StockFSDP`) through
``torch.distributed.checkpoint`` (DCP).

The DCP state dict has these entries:

* ``"model"`` / ``"optim"``: what ``torch.distributed.checkpoint.state_dict.get_state_dict``
  returns for the model and the optimizer: FSDP2's sharded parameters (the fp32
  master shards) and the optimizer state, DTensors keyed by parameter name, the
  same entries a stock FSDP2 job saves. ``"optim"`` is absent before the first
  commit (DCP would otherwise initialise the live optimizer with a zero step).
* ``"acco"``: replicated metadata (world size, config fingerprint, commits,
  scheduler state, compute dtypes, layout) as one opaque blob.
* ``"acco_rank<r>"`` (ACCO only): rank ``r``'s round state
  (:meth:`RoundEngine.state_dict`: the kept estimate, what an int4 estimate lost,
  the int8 error-feedback residuals, a finished round's landed shard) and its
  shard of the compute parameters, as one opaque blob per rank in rank ``r``'s
  own DCP file, hashed (and signed) by the manifest like the rest. The compute
  parameters are what the replicas train on: they differ from the masters after
  an estimate, and with ``all_gather_quantization: "int8"`` after every round by
  the delta's rounding; a load all-gathers them exactly, so the replicas resume
  on the very values they held.
* ``"extra"``: the caller's replicated values, if any.

On load with the same world size and ``"acco"`` block the run continues exactly
where it stopped (bit-identically under the fixed policy). With another world
size, or from a stock-FSDP2 checkpoint, DCP reshards ``"model"`` and ``"optim"``
onto this mesh; the per-rank round state does not apply, so the compute
parameters are all-gathered from the loaded masters and rounds bootstrap afresh
(:meth:`RoundEngine.reset_rounds`). :class:`StockFSDP` saves and loads the same
entries without round state, so checkpoints move both ways between ACCO and
stock FSDP2 (``"enabled": false``).

Every save writes into ``<folder>.partial`` and ends with ds_acco's manifest (sizes and
hashes of the DCP files, written last; see :mod:`ds_acco.checkpoint.manifest`); only then
does the partial folder replace ``folder``, so a save that a full disk fails (one message on
every rank, :mod:`ds_acco.checkpoint.save_failure`) or a crash interrupts leaves the earlier
save at that path loadable. Every load first verifies the files
on every rank (:mod:`ds_acco.checkpoint.verify`): a damaged, partial or manifest-less
ds_acco folder fails every rank, naming the file, before DCP reads anything. A folder
that a stock FSDP2 job saved with DCP (no manifest, no ds_acco entry in its metadata)
loads unverified with one WARNING (:mod:`ds_acco.fsdp.stock_checkpoint`).

Blobs are ``torch.save`` payloads in an ``io.BytesIO``: DCP flattens nested
dicts and lists into one entry per leaf, and a load would then need a template
of the exact same structure (which depends on whether a round was in flight);
an opaque value is stored and returned whole.
"""

from __future__ import annotations

import io
import logging
import os
from typing import Any, Optional

import torch
import torch.distributed as dist

from ds_acco.checkpoint import safe_load
from ds_acco.checkpoint.atomic import publish
from ds_acco.checkpoint.manifest import MANIFEST, clean_partials, newest_complete_tag, write_manifest
from ds_acco.checkpoint.save_failure import SaveFailures, nbytes, raise_or_continue, write_failures
from ds_acco.checkpoint.verify import FiniteCheck, finite_at_save, verify_for_load
from ds_acco.config.compare import differences
from ds_acco.errors import AccoConfigError

from .restore import (META_KEY, RANK_KEY_PREFIX, check_loaded, checkpoint_config, loaded_tensors,
                      metadata_classes_beyond, restart, safe_reader, set_state_dicts, sharded, state_dicts,
                      written_by_ds_acco)
from .stock_checkpoint import load_stock

logger = logging.getLogger("ds_acco")

FORMAT = 1
EXTRA_KEY = "extra"
Trainer = Any
"""An :class:`~ds_acco.fsdp.acco_fsdp.AccoFSDP` or :class:`~ds_acco.fsdp.stock_fsdp.StockFSDP` (see
:mod:`ds_acco.fsdp.restore` for what is used of it)."""


def rank_key(rank: int) -> str:
    return f"{RANK_KEY_PREFIX}{rank}"


def _blob(obj: Any) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _unblob(value: Any, weights_only: bool, device: Optional[torch.device] = None) -> Any:
    if isinstance(value, io.BytesIO):
        value.seek(0)
        return safe_load.load(value, map_location=device, weights_only=weights_only)
    return value


def _layout(trainer: Trainer) -> dict:
    engine = getattr(trainer, "engine", None)
    return {
        "fqns": [p.fqn for p in trainer.fsdp.params if p.trainable],
        "padded_numels": [g.layout.padded_numel for g in engine.groups] if engine else None,
        "compute_dtypes": [str(g.flat.dtype) for g in engine.groups] if engine else None,
    }


def _folder(checkpoint_id: Any) -> str:
    try:
        return os.fspath(checkpoint_id)
    except TypeError:
        raise AccoConfigError(f"checkpoint_id: got {type(checkpoint_id).__name__}; ds_acco.fsdp checkpoints are "
                              "folders (a str or os.PathLike), which it verifies file by file") from None


def _dcp_files_of(rank: int) -> list[str]:
    """The DCP files a rank writes and mostly reads (``__<rank>_<i>.distcp``; rank 0 also the metadata)."""
    return [".metadata"] * (rank == 0) + [f"__{rank}_{i}.distcp" for i in range(8)]


def save(trainer: Trainer, checkpoint_id: Any, extra: Optional[dict] = None) -> bool:
    """Write the full training state to ``checkpoint_id`` (a folder), manifest last; collective over all ranks
    (what a failed write does: :meth:`AccoFSDP.save_checkpoint`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    trainer._check_checkpointable()
    final, group = os.path.normpath(_folder(checkpoint_id)), trainer.fsdp.process_group
    partial, rank = final + ".partial", dist.get_rank(group)
    if rank == 0:
        clean_partials(*os.path.split(final))  # what a crashed save of this folder left beside it
    dist.barrier(group=group)
    engine, settings = getattr(trainer, "engine", None), checkpoint_config(trainer)
    fsync = settings.fsync
    rounds = engine.state_dict() if engine else None  # waits for the round in flight (no swap): all at rest
    pending_commit = bool(rounds and rounds["pending"] and rounds["pending"]["kind"] == "commit")
    has_optim = bool(trainer.optimizer.state)
    meta = dict(
        _layout(trainer),
        format=FORMAT,
        world_size=len(trainer.fsdp.ranks),
        fingerprint=engine.config.fingerprint() if engine else None,
        block=engine.config.compared_fields() if engine else None,
        mode=engine.config.mode if engine else "stock",
        policy=engine.config.policy if engine else None,
        commits=trainer.commits,
        # a commit that finished but is not swapped in yet is already in the masters and the optimizer
        applied_commits=trainer.commits + int(pending_commit),
        micro_batches=trainer.micro_batches,
        optimizer=has_optim,
        lr_scheduler=trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None,
        extra=extra is not None,
    )
    failures, failed = SaveFailures(partial), None
    with sharded(trainer):
        try:
            model_sd, optim_sd = state_dicts(trainer, has_optim)
            state = {"model": model_sd, META_KEY: _blob(meta)}
            if engine:
                compute = [g.compute_shard(g.flat, engine.rank) for g in engine.groups]
                state[rank_key(engine.rank)] = _blob({"rounds": rounds, "compute": compute})
            if optim_sd is not None:
                state["optim"] = optim_sd
            if extra is not None:
                state[EXTRA_KEY] = _blob(extra)
            failures.needed = nbytes(state)  # DTensors count whole: about what the folder needs
            finite = FiniteCheck(loaded_tensors(trainer))  # recorded in the manifest; spares the load its sums
            # DCP flushes its files itself (sync_files), before the manifest that vouches for them; a rank's failed
            # write reaches every rank as one CheckpointException (a BaseException), after all ranks wrote
            dcp.save(state, checkpoint_id=partial, storage_writer=dcp.FileSystemWriter(partial, sync_files=fsync))
        except CheckpointException as exc:
            failed = write_failures(exc, partial)
            if failed is None:
                raise
    if not failed:
        write_manifest(partial, writer="ds_acco fsdp", tag=os.path.basename(final), key=trainer.signing_key,
                       claim=_dcp_files_of(rank), fsync=fsync, group=group, non_finite=finite.local_result(),
                       guard=failures.guard)
        failed = failures.agree(group)
    if failed:
        parent, name = os.path.split(final)
        complete = os.path.isfile(os.path.join(final, MANIFEST))
        kept = (f"{final} still holds the last complete save there" if complete
                else f"no earlier complete save at {final}")
        last = name if complete else newest_complete_tag(parent, name)  # its size: what a save needs
        error = failures.abandon(failed, parent, name, last, kept=kept, group=group)
        return raise_or_continue(error, settings.on_save_error, rank)
    if rank == 0:
        publish(partial, final, fsync)
    dist.barrier(group=group)
    return True


def load(trainer: Trainer, checkpoint_id: Any) -> Optional[dict]:
    """Restore what :func:`save` wrote; collective. Returns the saved ``extra`` (or None)."""
    import torch.distributed.checkpoint as dcp

    trainer._check_checkpointable()
    engine = getattr(trainer, "engine", None)
    if engine:
        engine.reset_rounds()  # waits for and drops the round in flight; the comm thread is idle from here
    folder, group, settings = _folder(checkpoint_id), trainer.fsdp.process_group, checkpoint_config(trainer)
    weights_only = settings.weights_only
    # A folder with ds_acco's entries (or unreadable DCP metadata) must have its manifest; one without is stock.
    verdict = verify_for_load(folder, reads=_dcp_files_of(dist.get_rank(group)), ours=written_by_ds_acco(folder),
                              group=group, salvage=settings.salvage,
                              key=trainer.signing_key, scan=metadata_classes_beyond if weights_only else None)
    if verdict.stock:
        load_stock(trainer, folder)
        return None
    reader = lambda: safe_reader(folder, weights_only)  # noqa: E731 - one per dcp.load, as DCP expects
    probe: dict = {META_KEY: None}
    try:
        dcp.load(probe, checkpoint_id=checkpoint_id, storage_reader=reader())
    except Exception as exc:  # noqa: BLE001 - re-raised with what to do
        raise AccoConfigError(f"checkpoint {checkpoint_id}: no ds_acco FSDP metadata ('{META_KEY}'): {exc}") from exc
    meta = _unblob(probe[META_KEY], weights_only)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AccoConfigError(f"checkpoint {checkpoint_id}: unknown ds_acco FSDP format {meta!r:.200}")
    mine = _layout(trainer)
    if meta["fqns"] != mine["fqns"]:
        raise AccoConfigError(
            f"checkpoint {checkpoint_id}: saved parameters {meta['fqns'][:5]}... differ from this model's "
            f"{mine['fqns'][:5]}..."
        )
    exact = bool(engine) and meta["fingerprint"] == engine.config.fingerprint() and all(
        meta[k] == v for k, v in dict(mine, world_size=engine.world_size).items())

    with sharded(trainer):
        model_sd, optim_sd = state_dicts(trainer, meta["optimizer"])
        state: dict = {"model": model_sd}
        if optim_sd is not None:
            state["optim"] = optim_sd
        if exact:
            state[rank_key(engine.rank)] = None
        if meta["extra"]:
            state[EXTRA_KEY] = None
        dcp.load(state, checkpoint_id=checkpoint_id, storage_reader=reader())
        set_state_dicts(trainer, model_sd, optim_sd)
    check_loaded(trainer, folder, finite_at_save(verdict.manifest))
    if trainer.lr_scheduler is not None and meta["lr_scheduler"] is not None:
        trainer.lr_scheduler.load_state_dict(meta["lr_scheduler"])

    if exact:
        saved = _unblob(state[rank_key(engine.rank)], weights_only, engine.device)
        with torch.no_grad():
            for i, (g, shard) in enumerate(zip(engine.groups, saved["compute"])):
                engine.work.all_gather_compute(i, g.flat, shard.to(g.flat.dtype))
        engine.load_state_dict(saved["rounds"])
    else:
        restart(trainer, meta["applied_commits"], meta["micro_batches"])
        if engine and engine.rank == 0:
            changed = differences(meta["block"], engine.config.compared_fields()) if meta.get("block") else []
            logger.warning(
                "ds_acco.fsdp: %s was saved by %d ranks (mode %s, policy %s%s); model, optimizer and scheduler "
                "loaded onto %d ranks (%s): the round state was rebuilt from the committed parameters at step %d "
                "(micro-batches accumulated after that commit, the kept estimate and error-feedback residuals "
                "were reset)", checkpoint_id, meta["world_size"], meta["mode"], meta["policy"],
                f"; changed acco block: {'; '.join(changed)}" if changed else "", engine.world_size,
                engine.config.mode, engine.commits)
    return _unblob(state.get(EXTRA_KEY), weights_only)
