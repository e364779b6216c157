"""Each checkpoint file hashed, and flushed to stable storage, on a background thread as soon as it is written.

Why: verification should not lengthen a save. Hashing every file after the whole save re-reads it on the critical path;
hashing each one as soon as it is closed, on a thread (``xxhash`` releases the GIL), overlaps that with the writing of
the next file (DeepSpeed writes the model file, then each rank its optimizer file, then ds_acco the round state), where
the node has a core to spare.

A second thread flushes each file with ``fsync`` (``acco.checkpoint.fsync``, on by default, as
``torch.distributed.checkpoint`` does for its own files): the manifest is the proof that a tag is complete, and after a
power loss or a node crash that proof only holds if the files it names reached stable storage before it. DeepSpeed
itself does not flush. A flush waits on the disk, not the CPU, so the flush of file k overlaps the writing of file
k+1 on any node.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

from . import manifest as checkpoint_manifest
from .manifest import fsync_path
from .save_failure import SaveFailures


@contextlib.contextmanager
def replaced(obj: Any, name: str, replacement: Callable) -> Iterator[None]:
    """Within the block, ``obj.name`` is ``replacement`` (one instance: DeepSpeed's checkpoint engine)."""
    own = vars(obj).get(name)  # already replaced on this instance by someone else
    setattr(obj, name, replacement)
    try:
        yield
    finally:
        if own is None:
            delattr(obj, name)  # back to the class's method
        else:
            setattr(obj, name, own)


class FileFinisher:
    """Hashes (for the manifest) and flushes each file handed to :meth:`add` on two background threads.

    Args:
        folder: the checkpoint folder; names in :meth:`finish`'s result are relative to it.
        fsync: flush every file (the folders' entries are flushed with the manifest, see
            :func:`ds_acco.checkpoint.manifest.write_manifest`).
    """

    def __init__(self, folder: str, fsync: bool):
        self.folder, self.fsync = folder, fsync
        # one thread hashes (CPU), one flushes (waits on the disk): a file's flush overlaps its hash
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ds_acco_ckpt")
        self._hashes: dict[str, Future] = {}
        self._flushes: list[Future] = []
        self.waited = (0.0, 0.0)
        """Seconds :meth:`finish` waited for the flushes, then for the hashes still running after them: what
        durability and what verification added to the save."""

    def add(self, path: str) -> None:
        """``path`` is written and closed: hash it (and flush it) in the background."""
        rel = os.path.relpath(path, self.folder)
        if rel in self._hashes:
            return
        self._hashes[rel] = self._pool.submit(checkpoint_manifest.file_entry, path)
        if self.fsync:
            self._flushes.append(self._pool.submit(fsync_path, path))

    def watching(self, checkpoint_engine: Any, failures: SaveFailures) -> contextlib.AbstractContextManager:
        """Within the block, every file DeepSpeed's ``checkpoint_engine.save`` writes is :meth:`add`-ed, and a
        write the filesystem refuses is noted in ``failures`` instead of raised."""
        real = checkpoint_engine.save

        def save(state_dict, path, *args, **kwargs):
            out = None
            with failures.guard(path, state_dict):
                out = real(state_dict, path, *args, **kwargs)
            if os.path.isfile(path):  # an asynchronous engine may not have written it yet: hashed later
                self.add(path)
            return out

        return replaced(checkpoint_engine, "save", save)

    def finish(self) -> dict[str, dict]:
        """Wait for every hash and flush; ``{relative name: manifest entry}`` of the files added."""
        t0 = time.perf_counter()
        try:
            for f in self._flushes:
                f.result()
            t1 = time.perf_counter()
            entries = {rel: f.result() for rel, f in self._hashes.items()}
            self.waited = (t1 - t0, time.perf_counter() - t1)
            return entries
        finally:
            self._pool.shutdown(wait=True)
