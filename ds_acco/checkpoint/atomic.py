"""Atomic DeepSpeed checkpoints: a save interrupted at any point leaves the last good one.

Both DeepSpeed front ends write their tag through :func:`atomic_save`: every rank writes into ``<tag>.partial``, the
ranks hash every file into its manifest (:mod:`ds_acco.checkpoint.manifest`, :mod:`ds_acco.checkpoint.files`), and only
then does rank 0 rename it to ``<tag>`` and replace ``latest``, so ``<tag>`` only ever appears complete and verifiable
(with ``acco.checkpoint.fsync``, also after a node crash or a power loss). Stock DeepSpeed writes into ``<tag>``
directly and updates ``latest`` as it goes, so a job killed mid-save can resume from a half-written tag. What a crashed
save left behind (``*.partial``) is reported and removed by the next save. Assumes ``save_dir`` is one shared
filesystem, as DeepSpeed's own ``latest`` does; the ranks meet at barriers of the default group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from .files import FileFinisher
from .manifest import clean_partials, fsync_path, write_manifest
from .save_failure import SaveFailures
from .verify import FiniteCheck

logger = logging.getLogger("ds_acco")


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save`` through a temporary name, so a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(obj, tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    os.replace(tmp, path)


def atomic_save(save_dir: str, tag: str, global_rank: int, write: Callable[[str, Callable], Any], save_latest: bool,
                checkpoint_engine: Any, fsync: bool, claim: Sequence[str] = (), finite: Optional[FiniteCheck] = None,
                key: Optional[bytes] = None) -> Any:
    """Run ``write(partial_tag)`` on every rank, then publish ``tag`` (and ``latest``) at once.

    Args:
        write: ``write(partial_tag, guard)`` saves this rank's files under ``save_dir/<partial_tag>``, each of
            its own writes inside ``with guard(path, obj):``; its return value is returned.
        save_latest: replace ``latest`` with ``tag`` once the tag is complete, unless the save found
            non-finite masters or moments (a load would refuse the tag; ``latest`` keeps the last good one).
        checkpoint_engine: DeepSpeed's; each file it writes is hashed (and flushed) while the next is written.
        fsync: ``acco.checkpoint.fsync``; claim, key: as for :func:`~ds_acco.checkpoint.manifest.write_manifest`.
        finite: the finite check of this rank's masters and moments, started before the save
            (it sums while the files are written); its outcome goes into the manifest.

    A write that failed on any rank raises :class:`CheckpointSaveError` on every rank (:mod:`.save_failure`).
    """
    partial = f"{tag}.partial"
    if global_rank == 0:
        clean_partials(save_dir)  # debris of crashed saves: reported, never loaded
    dist.barrier()
    folder = os.path.join(save_dir, partial)
    finisher, failures = FileFinisher(folder, fsync), SaveFailures(folder)
    try:
        with finisher.watching(checkpoint_engine, failures):
            result = write(partial, failures.guard)
        for name in claim:  # the rest of this rank's files (ds_acco's state file is written last)
            if os.path.isfile(os.path.join(folder, name)):
                finisher.add(os.path.join(folder, name))
    finally:
        try:
            hashed = finisher.finish()
        except OSError as exc:  # a flush the disk refused
            failures.failed.append(f"{exc.filename or folder}: {exc.strerror}")
            hashed = {}
    _fail_if_any(failures, save_dir, tag)
    non_finite = write_manifest(folder, writer="ds_acco deepspeed", tag=tag, claim=claim, hashed=hashed, fsync=fsync,
                                non_finite=finite.local_result() if finite is not None else None, key=key,
                                guard=failures.guard)
    _fail_if_any(failures, save_dir, tag)
    if global_rank == 0:
        final = os.path.join(save_dir, tag)
        publish(folder, final, fsync)
        if save_latest and non_finite:  # a load would refuse it: a restart from latest keeps the last good tag
            logger.warning("ds_acco: %s holds non-finite values, so %s still names %s; load the tag explicitly to "
                           "inspect it", final, os.path.join(save_dir, "latest"), latest_tag(save_dir))
        elif save_latest:
            _point_latest_at(save_dir, tag, fsync)
    dist.barrier()
    return result


def _point_latest_at(save_dir: str, tag: str, fsync: bool) -> None:
    latest_tmp = os.path.join(save_dir, f"latest.tmp{os.getpid()}")
    with open(latest_tmp, "w", encoding="utf-8") as f:
        f.write(tag)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(save_dir, "latest"))
    if fsync:
        fsync_path(save_dir)


def publish(partial: str, final: str, fsync: bool) -> None:
    """One rank: the complete ``partial`` folder becomes ``final`` at once; an earlier ``final`` is removed
    only after (with ``fsync``, once the rename is durable), so a crash in between leaves one of the two."""
    old = f"{final}.old{os.getpid()}"
    if os.path.exists(final):
        os.replace(final, old)
    os.replace(partial, final)
    if fsync:
        fsync_path(os.path.dirname(final) or ".")
    shutil.rmtree(old, ignore_errors=True)


def _fail_if_any(failures: SaveFailures, save_dir: str, tag: str) -> None:
    """When a write failed on any rank: remove the partial tag, then raise the same error on every rank."""
    failed = failures.agree()
    if failed:
        raise failures.abandon(failed, save_dir, tag, latest_tag(save_dir))


def latest_tag(load_dir: str) -> str | None:
    """The tag named by ``load_dir/latest``, or None when there is none."""
    path = os.path.join(load_dir, "latest")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().strip()
