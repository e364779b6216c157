"""A save that cannot write (full disk, quota, I/O error) fails on every rank with one message.

Why: torch reports a full disk as ``basic_ios::clear: iostream error`` or ``unexpected pos 895744 vs 895632``, naming
neither the file nor the space needed, and it raises on the rank that hit it while the others wait for it in DeepSpeed's
next barrier. So each write of a save goes through :meth:`SaveFailures.guard`: a failed write is noted and its
half-written file removed, and the save goes on to its next barrier with the other ranks. After the writes the ranks
:meth:`~SaveFailures.agree`; when any rank failed, the partial tag is removed (``latest`` never moved), and every rank
gets the same :class:`CheckpointSaveError` (:meth:`SaveFailures.abandon`). ``acco.checkpoint.on_save_error`` says what
then (:func:`raise_or_continue`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

from ds_acco.errors import CheckpointSaveError  # (raised here; every exception lives in ds_acco.errors)

from .manifest import MANIFEST, gather_objects

logger = logging.getLogger("ds_acco")


def nbytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (nested containers): what writing it needs at least."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def tag_bytes(folder: Optional[str]) -> Optional[int]:
    """The size of a complete tag (from its manifest), or None."""
    if not folder or not os.path.isfile(os.path.join(folder, MANIFEST)):
        return None
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files)


def _mb(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


class SaveFailures:
    """This rank's failed writes during one save, and the agreement that fails it everywhere."""

    def __init__(self, folder: str):
        self.folder = folder
        self.failed: list[str] = []
        self.needed = 0

    @contextlib.contextmanager
    def guard(self, path: str, obj: Any = None) -> Iterator[None]:
        """Run one write; a filesystem error is noted (and the file removed) instead of raised."""
        try:
            yield
        except (OSError, RuntimeError) as exc:  # torch's writer turns ENOSPC into RuntimeError text
            if isinstance(exc, RuntimeError) and not _looks_like_io(exc):
                raise
            self.needed += nbytes(obj)
            reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc).split("\n")[0]
            self.failed.append(f"{path}: {reason}")
            with contextlib.suppress(OSError):
                os.remove(path)

    def agree(self, group=None) -> list[str]:
        """Every rank's failures (collective; empty on every rank when the save wrote everything)."""
        out = gather_objects((self.failed, self.needed), group)
        self.needed = sum(n for _, n in out)
        return [line for lines, _ in out for line in lines]

    def abandon(self, failures: list[str], save_dir: str, tag: str, last: Optional[str], kept: Optional[str] = None,
                group=None) -> CheckpointSaveError:
        """Every rank, once :meth:`agree` found ``failures``: remove the partial folder (its space is what the next
        save needs) and return the error every rank raises, with rank 0's message (``kept``: what still holds the
        last complete save, where there is no ``latest`` to name it)."""
        message = [None]
        if dist.get_rank(group) == 0:
            size = tag_bytes(os.path.join(save_dir, last) if last else None)
            if size is not None:
                need = f"a complete save needs about {_mb(size)} (the size of {last}); "
            elif self.needed:
                need = f"the tensors it was writing hold {_mb(self.needed)}; "
            else:
                need = ""
            try:
                free = _mb(shutil.disk_usage(save_dir).free)
            except OSError:
                free = "unknown"
            keep = kept or (f"'latest' still names {last}" if last else "no earlier tag exists")
            lines = "\n  ".join(failures[:6]) + (f"\n  ... and {len(failures) - 6} more" if len(failures) > 6 else "")
            message[0] = (
                f"ds_acco: checkpoint save of tag {tag!r} in {save_dir} could not be written, so every rank abandoned "
                f"it (the partial tag was removed; {keep}):\n  {lines}\n{need}{free} free there now. Free space or "
                "point the save elsewhere; acco.checkpoint.on_save_error: \"continue\" keeps training and retries at "
                "the next save")
            shutil.rmtree(self.folder, ignore_errors=True)
        src = dist.get_global_rank(group, 0) if group is not None else 0  # a global rank
        dist.broadcast_object_list(message, src=src, group=group)  # rank 0 sends once the folder is gone
        return CheckpointSaveError(message[0])


def raise_or_continue(error: CheckpointSaveError, on_save_error: str, rank: int) -> bool:
    """``acco.checkpoint.on_save_error``: raise ``error``, or ("continue") log it on rank 0 and return False."""
    if on_save_error != "continue":
        raise error
    if rank == 0:
        logger.error("%s\nacco.checkpoint.on_save_error is \"continue\": training goes on; the next save tries again",
                     error)
    return False


def write_failures(exc: BaseException, folder: str) -> Optional[list[str]]:
    """The failed writes ``torch.distributed.checkpoint`` reports in its ``CheckpointException`` (raised
    alike on every rank, with each failed rank's exception), one line per rank; None when any of them is
    not a filesystem error (a bug, which the caller re-raises as it is)."""
    failures = getattr(exc, "failures", None)
    if not failures:
        return None
    lines = []
    for rank, (err, _) in sorted(failures.items()):
        if isinstance(err, OSError):
            lines.append(f"rank {rank}: {err.filename or folder}: {os.strerror(err.errno) if err.errno else err}")
        elif isinstance(err, RuntimeError) and _looks_like_io(err):
            lines.append(f"rank {rank}: {folder}: {str(err).splitlines()[0]}")
        else:
            return None
    return lines


def _looks_like_io(exc: RuntimeError) -> bool:
    """torch's stream writer reports a failed ``write`` as a RuntimeError; anything else is a real bug."""
    text = str(exc)
    return any(s in text for s in ("iostream", "unexpected pos", "PytorchStreamWriter", "No space", "file write failed",
                                   "Disk quota"))
