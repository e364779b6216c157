"""Loads that refuse a damaged ds_acco checkpoint, on every rank, before any tensor is used.

Each rank checks that every file of the manifest (:mod:`ds_acco.checkpoint.manifest`) is there with its size, and hashes
its share of the ranges of the files it is about to read; the ranks then exchange what they found, so a bad file seen by
one rank fails every rank with the same message (:func:`describe`).

What is *not* a ds_acco checkpoint (no manifest and none of ds_acco's own files: a stock ZeRO-1 or stock DeepSpeed tag)
loads unverified with one WARNING from the front end; a ds_acco checkpoint without its manifest is an error, since the
manifest is written last: its absence means the save did not finish, or the folder was damaged.

``acco.checkpoint.salvage: true`` turns refusals into WARNINGs when everything that failed can be dropped (a front end
says which files can: per-rank round or streaming state) or when the manifest itself is bad (the files are then loaded
unverified).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from ds_acco.errors import CheckpointError

from . import signing
from .safe_load import SWITCH
from ds_acco.numerics.finite import all_finite

from .manifest import (MANIFEST, entry_ranges, gather_objects, newest_complete_tag, read_manifest, share_out,
                       unit_digests, units_of)

logger = logging.getLogger("ds_acco")


@dataclass
class Verdict:
    """What a load may do after verification (identical on every rank)."""

    stock: bool = False
    """No manifest and no ds_acco file: a checkpoint no ds_acco run wrote; loaded unverified."""
    dropped: set = field(default_factory=set)
    """Files that failed and are dropped (salvage only); the front end loads without them."""
    manifest: Optional[dict] = None


def size_problems(folder: str, manifest: dict) -> dict[str, str]:
    """Files of the manifest that are missing or of another size: ``{name: what was expected and found}``."""
    problems = {}
    for name, want in manifest["files"].items():
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            problems[name] = f"expected {want['size']} bytes, found no file"
            continue
        size = os.path.getsize(path)
        if size != want["size"]:
            problems[name] = f"expected {want['size']} bytes, found {size} bytes"
    return problems


def _check_files(folder: str, manifest: dict, claims: Sequence[Iterable[str]], rank: int) -> dict[str, str]:
    problems = size_problems(folder, manifest)
    algorithm = manifest.get("hash")
    ranges = {name: entry_ranges(entry) for name, entry in manifest["files"].items() if name not in problems}
    units = [u for name, entry in manifest["files"].items() if name in ranges
             for u in units_of(name, entry["size"], ranges[name][0])]
    mine = share_out(units, claims, rank)
    try:
        found = unit_digests(folder, mine, {name: rb for name, (rb, _) in ranges.items()}, algorithm)
    except ValueError as exc:
        return dict(problems, **{name: f"cannot verify: {exc}" for name in dict.fromkeys(u.name for u in mine)})
    for name, index, nbytes in mine:
        range_bytes, want = ranges[name]
        digest, size = found[(name, index)], manifest["files"][name]["size"]
        if digest != want[index] and name not in problems:
            where = "" if len(want) == 1 else f" over bytes {index * range_bytes}-{index * range_bytes + nbytes}"
            problems[name] = f"expected {algorithm} {want[index]}{where} ({size} bytes), found {algorithm} {digest}"
    return problems


def describe(folder: str, problems: dict[str, str], what: str, salvage_note: str = "") -> str:
    """The refusal message: the tag, each bad file, and the newest earlier complete tag."""
    parent, tag = os.path.split(os.path.normpath(folder))
    fallback = newest_complete_tag(parent, tag)
    lines = "\n  ".join(f"{name}: {why}" for name, why in sorted(problems.items()))
    instead = (f"resume from {os.path.join(parent, fallback)} instead (the newest other complete tag)"
               if fallback else "no other complete tag was found next to it")
    return (f"ds_acco: checkpoint {folder} (tag {tag!r}) {what}, refused on every rank before training:\n  "
            f"{lines}\n{instead}{salvage_note}")


def in_background(fn: Callable, *args: Any, name: str = "ds_acco_verify") -> Future:
    """Run ``fn(*args)`` on a thread of its own; its result (or exception) comes from the future."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its one task


def verify_for_load(folder: str, *, reads: Sequence[str], ours: bool, salvage: bool,
                    droppable: Callable[[str], bool] = lambda name: False, group=None,
                    manifest_read: Optional[tuple[Optional[dict], Optional[str]]] = None,
                    key: Optional[bytes] = None, scan: Optional[Callable[[str], list]] = None) -> Verdict:
    """Verify ``folder`` before it is loaded (collective over ``group``: every rank raises any rank's problems).

    Args:
        reads: files this rank is about to read; it hashes them (files nobody reads are shared out).
        ours: the folder holds ds_acco's own files, so it must have a manifest.
        droppable: which files the front end can load without (salvage only); manifest_read: what
            :func:`read_manifest` returned, when the caller already read it.
        key: the signing key (:mod:`.signing`) the manifest must be signed with, checked first (salvage cannot drop it).
        scan: the classes a file would unpickle beyond those allowed (:func:`.safe_load.classes_beyond`); a file that
            names any is refused (None: ``acco.checkpoint.weights_only`` off).
    """
    rank = dist.get_rank(group)
    manifest, bad = manifest_read if manifest_read is not None else read_manifest(folder)
    unsigned = None if key is None else signing.problem(
        manifest and {k: v for k, v in manifest.items() if k != "signature"}, (manifest or {}).get("signature"), key)
    if unsigned is not None:
        problems = {MANIFEST: f"expected signed with this job's key (acco.checkpoint.signing_key_file or "
                              f"${signing.KEY_ENV}), found it {unsigned}"}
    elif manifest is None:
        problems = {MANIFEST: f"expected present, found it {bad}"} if ours or bad != "missing" else {}
    else:
        problems = _check_files(folder, manifest, gather_objects([f for f in reads if f in manifest["files"]], group),
                                rank)
    if scan is not None and unsigned is None:
        problems.update(_unsafe(folder, [name for name in reads if name not in problems], scan))
    merged = {name: why for part in gather_objects(problems, group) for name, why in part.items()}
    if key is not None and MANIFEST in merged:
        raise CheckpointError(describe(folder, merged, "is not signed with this job's key"))
    if not merged:
        return Verdict(stock=manifest is None, manifest=manifest)
    if salvage and MANIFEST in merged:
        if rank == 0:
            logger.warning("%s", describe(folder, merged, "has no usable manifest",
                                          "\nacco.checkpoint.salvage is on: loading its files UNVERIFIED"))
        return Verdict(manifest=None)
    drops = [droppable(name) for name in merged]
    if salvage and all(drops):
        if rank == 0:
            logger.warning("%s", describe(folder, merged, "is damaged", f"\nacco.checkpoint.salvage is on: dropped "
                                          f"{sorted(merged)}; the rest loads and the rounds bootstrap afresh (the "
                                          "trajectory is not the uninterrupted one)"))
        return Verdict(dropped=set(merged), manifest=manifest)
    note = "\n(acco.checkpoint.salvage can only drop per-rank round state, not model or optimizer files)" \
        if any(drops) and not all(drops) else "\nor set acco.checkpoint.salvage: true to load it anyway without " \
        "the failed parts" if all(drops) or MANIFEST in merged else ""
    raise CheckpointError(describe(folder, merged, "failed verification", note))


def _unsafe(folder: str, names: Sequence[str], scan: Callable[[str], list]) -> dict[str, str]:
    """The files of ``names`` that would unpickle classes beyond those allowed, with why."""
    found = {name: classes for name in names if os.path.isfile(os.path.join(folder, name))
             and (classes := scan(os.path.join(folder, name)))}
    return {name: f"holds {', '.join(classes)}, which a checkpoint load does not unpickle (it would run code the "
                  f"file names); refused before any file was parsed. If the checkpoint comes from a source you "
                  f"trust, set {SWITCH}: false" for name, classes in found.items()}


def _non_finite(named: Sequence[tuple[str, torch.Tensor]]) -> list[str]:
    local = ((name, t.to_local() if hasattr(t, "to_local") else t) for name, t in named)  # DTensors: own shard
    return [name for name, t in local if t.is_floating_point() and not all_finite(t)]


class FiniteCheck:
    """The finite check of loaded masters and moments; the sums run on a background thread when the tensors are on the
    CPU, and :meth:`settle` joins them and makes the ranks agree.

    Why: summing the 75 M floats of a 50 M-parameter model's masters and Adam moments takes ~20 ms of CPU; torch's
    reductions release the GIL, so a front end can start the check as soon as the optimizer state is in place and load
    what remains (ds_acco's round state) meanwhile. Tensors on an accelerator are summed where they are, synchronously:
    that takes well under a millisecond, and a second thread would only add a stream to reason about.

    Args:
        named: ``(name, tensor)`` of every loaded master parameter and optimizer moment.
        background: allow the background thread (False: sum now).
    """

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]], background: bool = True):
        named = list(named)
        on_cpu = all(t.device.type == "cpu" for _, t in named)
        self._bad: Any = in_background(_non_finite, named, name="ds_acco_finite") if background and on_cpu \
            else _non_finite(named)
        self.waited = 0.0
        """Seconds :meth:`settle` spent on the main thread: the join and the ranks' agreement."""

    def local_result(self) -> list[str]:
        """Join the sums: the names of this rank's tensors that hold inf/NaN (no agreement)."""
        return self._bad.result() if isinstance(self._bad, Future) else self._bad

    def settle(self, folder: str, group=None) -> None:
        """Join the sums and agree (collective): raise on every rank when any rank's tensors hold inf/NaN."""
        t0 = time.perf_counter()
        try:
            bad = self.local_result()
            merged = {f"rank {r}'s {n}": "expected finite values, found inf/NaN"
                      for r, names in enumerate(gather_objects(bad[:5], group)) for n in names}
        finally:
            self.waited += time.perf_counter() - t0
        if merged:
            raise CheckpointError(describe(folder, merged, "holds non-finite master parameters or optimizer moments"))


def finite_at_save(manifest: Optional[dict]) -> bool:
    """The verified manifest says every rank's masters and moments were finite when they were saved.

    Why it spares the load's sums: the files matched their hashes, so the values loaded from them are the values saved.
    A front end relies on it only where the loaded masters and moments come from those saved tensors alone (not
    re-partitioned, not rebuilt from the module's weights).
    """
    return manifest is not None and manifest.get("finite_at_save") is True


def refuse_unless_finite(folder: str, named: Iterable[tuple[str, torch.Tensor]], group=None) -> None:
    """Raise on every rank when any loaded master parameter or optimizer moment holds inf/NaN."""
    FiniteCheck(named, background=False).settle(folder, group)


def optimizer_tensors(optimizer: torch.optim.Optimizer, prefix: str = "optimizer") -> list[tuple[str, Any]]:
    """``(name, tensor)`` for every tensor in a torch optimizer's state (the moments)."""
    return [(f"{prefix} state {i} {key}", v) for i, state in enumerate(optimizer.state.values())
            for key, v in state.items() if torch.is_tensor(v)]
