"""Verification while the loader parses: the agreed hash verdict gates the first use of a file's contents.

Why: hashing every file a rank reads and agreeing with the other ranks took 8-9% of a page-cache load of a
50 M-parameter model (BENCHMARKS.md, "Checkpoint verification") while it ran before DeepSpeed read a byte, with nothing
to overlap it. But parsing bytes is not using them: DeepSpeed's ``torch.load`` of a file may run while the file is
hashed, as long as the state dict it returns reaches no module, optimizer or scheduler before every rank has verified
every file. So:

* the hashes of this rank's files, and the ranks' agreement, run on a background thread, over a process group of their
  own (:class:`VerificationGroup`): the main thread is inside DeepSpeed's loader meanwhile and may run collectives on
  the default group, which must never interleave with ours;
* DeepSpeed's ``checkpoint_engine.load`` is wrapped (:meth:`PendingVerdict.gating`): the file is parsed, but its state
  dict is not returned before the agreed verdict is in, so a refused load raises on every rank, with the same message,
  and leaves the engine as it was.

Parsing an unverified file can only raise (the refusal then wins) or yield a state dict that is thrown away. A pickle
crafted to run code on load was never in the manifest's scope (it detects damage, not tampering:
:mod:`ds_acco.checkpoint.manifest`).

Loads whose first step needs the verdict (a world-size change re-partitions through a universal checkpoint; no usable
manifest; ``acco.checkpoint.salvage``; a file missing or of the wrong size) simply wait for it up front.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import torch.distributed as dist

from ds_acco.errors import CheckpointError

from .files import replaced
from .verify import Verdict, in_background


class VerificationGroup:
    """The process group background agreements use, created on first use and destroyed with its owner (a front
    end's checkpointer holds one).

    Created by a collective over ``group`` (None: the default group) the first time: every rank must call
    :meth:`get` at the same point (the front ends call it at the start of ``load_checkpoint``). Its time-out is
    ``acco.timeout_s``, so an agreement with a dead or stopped peer fails in that time.
    """

    def __init__(self, group, timeout_s: float):
        self.parent, self.timeout_s, self.group = group, timeout_s, None

    def get(self):
        if self.group is None:
            ranks = dist.get_process_group_ranks(self.parent if self.parent is not None else dist.group.WORLD)
            self.group = dist.new_group(ranks=ranks, backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        return self.group

    def destroy(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(RuntimeError, ValueError):
                dist.destroy_process_group(group)


class PendingVerdict:
    """A :class:`~ds_acco.checkpoint.verify.Verdict` being reached on a background thread.

    Args:
        agree: runs the verification (hashes and agreement, collective over the group of
            :class:`VerificationGroup`); returns the Verdict or raises the agreed CheckpointError.
        folder, timeout_s: for the message when the agreement fails.
        manifest: the manifest as the caller read it (None: none usable).
        up_front: the load must wait for the verdict before it starts (see the module's docstring).
    """

    def __init__(self, agree: Callable[[], Verdict], folder: str, timeout_s: float, *,
                 manifest: Optional[dict] = None, up_front: bool = True):
        self.folder, self.timeout_s = folder, timeout_s
        self.manifest, self.up_front = manifest, up_front
        self._future = in_background(self._run, agree)
        self.waited = 0.0
        """Seconds the main thread spent waiting in :meth:`verdict`: what verification added to the load."""

    def _run(self, agree: Callable[[], Verdict]) -> Verdict:
        try:
            return agree()
        except (CheckpointError, OSError):  # a refusal, or a file this rank could not read: as it is
            raise
        except Exception as exc:  # noqa: BLE001 - the exchange failed: a peer died, stopped, or never joined
            raise CheckpointError(
                f"ds_acco: the ranks could not agree on the verification of checkpoint {self.folder} within "
                f"acco.timeout_s={self.timeout_s:g}s ({type(exc).__name__}: {exc}); a peer died, is stopped, or "
                "did not call load_checkpoint; nothing was loaded") from exc

    def verdict(self) -> Verdict:
        """Wait for the agreed verdict (idempotent); raises the agreed refusal, or a failed agreement's error."""
        t0 = time.perf_counter()
        try:
            return self._future.result()
        finally:
            self.waited += time.perf_counter() - t0

    def refusal_instead_of(self, exc: BaseException) -> None:
        """The load failed with ``exc`` before the verdict was used: raise the refusal, if any, from it."""
        try:
            self.verdict()
        except CheckpointError as refused:
            raise refused from exc

    @contextlib.contextmanager
    def gating(self, checkpoint_engine: Any) -> Iterator[None]:
        """Within the block, DeepSpeed's ``checkpoint_engine.load`` parses files while they are verified
        but returns nothing before the verdict; any error in the block (DeepSpeed may trip over a missing
        file before it loads one) yields to a refusal."""
        real = checkpoint_engine.load

        def load(path, *args, **kwargs):
            try:
                out = real(path, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the verdict's refusal names the file, else this does
                self.refusal_instead_of(exc)
                verdict = self.verdict()
                how = "matches its manifest on every rank" if verdict.manifest else "was loaded unverified"
                raise CheckpointError(f"ds_acco: {path} {how} but could not be loaded: "
                                      f"{type(exc).__name__}: {exc}") from exc
            self.verdict()
            return out

        with replaced(checkpoint_engine, "load", load):
            try:
                yield
            except CheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001
                self.refusal_instead_of(exc)
                raise

