"""Checkpoint manifests: the files a ds_acco checkpoint consists of, with their sizes and hashes.

Why: torch's zip reader does not check its CRCs on load, and neither DeepSpeed nor ``torch.distributed.checkpoint``
checks what it reads, so a file damaged on disk (bytes overwritten, truncated, emptied, as a bad disk or a partial copy
leaves it) either loads as garbage that trains to NaN or fails with an error that names no file. Every ds_acco save
therefore ends with ``ds_acco_manifest.json`` in the checkpoint folder: each file with its size and content hash. It is
written last and atomically, so a tag is complete exactly when its manifest is there (:mod:`ds_acco.checkpoint.verify`
checks it on load).

The hash is xxHash's XXH3-64 (package ``xxhash``) over the file mapped into memory: about 4 GB/s on one core where
``zlib.crc32``, the fallback without ``xxhash``, reaches 1.1 (BENCHMARKS.md, "Checkpoint verification"). Either detects
accidental damage, not tampering. Each file is hashed in ranges (:data:`RANGE_BYTES`), each range once, by a rank that
wrote (on save) or reads (on load) its file, and the ranks exchange the results. The manifest also records whether the
masters and moments were finite at the save (``finite_at_save``), which spares a load whose files match their hashes
from summing them again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import shutil
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, ContextManager, Iterable, NamedTuple, Optional, Sequence

import torch.distributed as dist

from . import signing

try:
    import xxhash
except ImportError:  # crc32 instead; manifests say which hash they use
    xxhash = None

logger = logging.getLogger("ds_acco")

MANIFEST = "ds_acco_manifest.json"
FORMAT = 2
"""1: one whole-file ``digest`` per file; 2: a ``digest`` per range (``digests``, ``range_bytes``)
and ``finite_at_save``. Both load."""
HASH = "xxh3_64" if xxhash is not None else "crc32"
"""The hash new manifests use."""


RANGE_BYTES = 32 << 20
"""Files are hashed in ranges of this many bytes, each with its own digest in the manifest, so a file
that several ranks read (the model file) is hashed by all of them, a share each, and the ranks' shares
even out to within one range (at 2 ranks of a 50 M-parameter model: 579 MiB each instead of 673 and 485).
A range of 32 MiB hashes in about 3 ms; a 100 GB checkpoint's manifest holds ~3,000 digests."""


def _check_algorithm(algorithm: str) -> None:
    if algorithm == "xxh3_64" and xxhash is None:
        raise ValueError("this manifest was hashed with xxh3_64, which needs the xxhash package (pip install xxhash)")
    if algorithm not in ("xxh3_64", "crc32"):
        raise ValueError(f"unknown hash {algorithm!r} in the manifest; allowed: 'xxh3_64', 'crc32'")


def range_count(size: int, range_bytes: int) -> int:
    """How many ranges a file of ``size`` bytes has (an empty file has one, of no bytes)."""
    return max(1, -(-size // range_bytes))


def range_digests(path: str, indices: Optional[Iterable[int]] = None, algorithm: str = HASH,
                  range_bytes: int = RANGE_BYTES) -> list[str]:
    """The hashes (hex) of ranges ``indices`` (default: all) of a file: range i is bytes
    ``[i * range_bytes, (i + 1) * range_bytes)``. Every hash of a checkpoint goes through here."""
    _check_algorithm(algorithm)
    digest = xxhash.xxh3_64_hexdigest if algorithm == "xxh3_64" else (lambda b: f"{zlib.crc32(b):08x}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        indices = range(range_count(size, range_bytes)) if indices is None else list(indices)
        if size == 0:
            return [digest(b"") for _ in indices]
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # no copy through Python buffers
            view = memoryview(data)
            try:
                return [digest(view[i * range_bytes:(i + 1) * range_bytes]) for i in indices]
            finally:
                view.release()


def file_digest(path: str, algorithm: str = HASH) -> str:
    """The hash of a whole file's bytes, hex (what manifests of format 1 hold)."""
    return range_digests(path, [0], algorithm, range_bytes=max(1, os.path.getsize(path)))[0]


def file_entry(path: str) -> dict:
    """A new manifest's entry for a file: its size and the digest of each of its ranges."""
    return {"size": os.path.getsize(path), "range_bytes": RANGE_BYTES, "digests": range_digests(path)}


def entry_ranges(entry: dict) -> tuple[int, list[str]]:
    """``(range_bytes, digests)`` of a manifest entry; a format-1 entry is one range over the whole file."""
    if "digests" in entry:
        return int(entry["range_bytes"]), list(entry["digests"])
    return max(1, int(entry["size"])), [entry["digest"]]


class Unit(NamedTuple):
    """What one rank hashes at a time: one range of one file."""

    name: str
    index: int
    nbytes: int

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.index


def units_of(name: str, size: int, range_bytes: int) -> list[Unit]:
    return [Unit(name, i, max(0, min(range_bytes, size - i * range_bytes)))
            for i in range(range_count(size, range_bytes))]


def unit_digests(folder: str, units: Sequence[Unit], ranges_of: dict[str, int],
                 algorithm: str = HASH) -> dict[tuple[str, int], str]:
    """``{(name, index): digest}`` of ``units``: each file's ranges in order on one thread, the files on up to
    4 threads, largest share first (``xxhash`` and ``zlib`` release the GIL). One thread per file, not per range: a file
    read from the disk then streams in order through the kernel's read-ahead (a cold load waited 0.18-0.20 s so,
    0.26-0.36 s with ranges spread over threads). ``ranges_of``: each file's range size (from its manifest entry).
    """
    by_file: dict[str, list[Unit]] = {}
    for unit in units:
        by_file.setdefault(unit.name, []).append(unit)
    order = sorted(by_file.values(), key=lambda us: -sum(u.nbytes for u in us))
    if not order:
        return {}

    def one(file_units: list[Unit]) -> dict[tuple[str, int], str]:
        name, indices = file_units[0].name, sorted(u.index for u in file_units)
        found = range_digests(os.path.join(folder, name), indices, algorithm, ranges_of[name])
        return {(name, i): d for i, d in zip(indices, found)}

    workers = min(4, len(order), os.cpu_count() or 1)
    if workers <= 1:
        return {k: d for us in order for k, d in one(us).items()}
    with ThreadPoolExecutor(workers) as pool:
        return {k: d for part in pool.map(one, order) for k, d in part.items()}


def tag_files(folder: str) -> list[str]:
    """Every file under ``folder`` (relative paths, sorted), except the manifest and temporary files."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != MANIFEST and ".tmp" not in name:
                out.append(rel)
    return sorted(out)


def share_out(units: Sequence[Unit], claims: Sequence[Iterable[str]], rank: int) -> list[Unit]:
    """The units ``rank`` hashes, so that every unit is hashed exactly once and the ranks' bytes even out.

    A file only one rank claims is hashed by that rank; a range of a file several ranks claim goes to the one of them
    with the fewest bytes so far, and a range of a file nobody claims to the rank with the fewest bytes (largest ranges
    first). Deterministic: every rank computes the same assignment from the same arguments.

    ``claims``: per rank, the files it wrote or reads anyway (hashing them costs no extra network read).
    """
    claimants: dict[str, list[int]] = {}
    for r, names in enumerate(claims):
        for name in dict.fromkeys(names):
            claimants.setdefault(name, []).append(r)
    load = [0] * len(claims)
    owner: dict[tuple[str, int], int] = {}
    for unit in units:
        if len(claimants.get(unit.name, ())) == 1:
            owner[unit.key] = claimants[unit.name][0]
            load[owner[unit.key]] += unit.nbytes
    for unit in sorted((u for u in units if u.key not in owner), key=lambda u: (-u.nbytes, u.name, u.index)):
        eligible = claimants.get(unit.name) or range(len(claims))
        owner[unit.key] = min(eligible, key=lambda r: (load[r], r))
        load[owner[unit.key]] += unit.nbytes
    return [u for u in units if owner[u.key] == rank]


def fsync_path(path: str) -> None:
    """Flush a file's data, or a folder's entries (names created or renamed in it), to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folders(folder: str) -> None:
    for root, _, _ in os.walk(folder):
        fsync_path(root)


def gather_objects(obj, group) -> list:
    """Every rank's ``obj`` (pickled through ``all_gather_object``: small lists of names and digests only)."""
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _seal(body: dict) -> str:
    return f"{zlib.crc32(json.dumps(body, sort_keys=True).encode()):08x}"


def write_manifest(folder: str, *, writer: str, tag: str, claim: Sequence[str] = (),
                   hashed: Optional[dict] = None, fsync: bool = True, group=None,
                   non_finite: Optional[Sequence[str]] = None, key: Optional[bytes] = None,
                   guard: Callable[[str], ContextManager] = lambda path: contextlib.nullcontext()) -> list[str]:
    """Hash every file of ``folder`` (shared out over the ranks) and write its manifest; collective.

    Call it when every rank has finished writing (and, with ``fsync``, flushing) its files.
    Rank 0 writes the manifest through a temporary name, so it appears whole or not at all.

    Args:
        writer: which front end wrote the checkpoint (stored for the reader's messages).
        claim: files this rank wrote; it hashes those (the ranges of others are shared out).
        hashed: ``{name: entry}`` (:func:`file_entry`) this rank already computed; not hashed again.
        fsync: flush the folders' entries before the manifest, and the manifest's own entry after it.
        group: the process group of the ranks that wrote the checkpoint (None: the default group).
        non_finite: this rank's master parameters and optimizer moments that held inf/NaN at the save
            (empty: all finite), or None when the front end did not check. The manifest records
            ``finite_at_save`` true only when every rank checked and found none: a load whose files
            match their hashes then holds the saved values, so it need not sum them again.
        key: sign the manifest with this key; None: unsigned.
        guard: wraps rank 0's write of the manifest (a full disk is noted there, and the ranks still meet).

    Returns:
        On every rank, the tensors any rank found non-finite (``"rank r's name"``; empty when none).
    """
    rank = dist.get_rank(group)
    hashed = hashed or {}
    listing = [tag_files(folder) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    files = listing[0]
    known = gather_objects(([f for f in hashed if f in files], [f for f in claim if f in files]), group)
    owner: dict[str, int] = {}
    for r, (names, _) in enumerate(known):
        for name in names:
            owner.setdefault(name, r)
    mine: dict = {f: hashed[f] for f, r in owner.items() if r == rank}
    rest = [f for f in files if f not in owner]
    sizes = {f: os.path.getsize(os.path.join(folder, f)) for f in rest}
    units = [u for f in rest for u in units_of(f, sizes[f], RANGE_BYTES)]
    todo = share_out(units, [c for _, c in known], rank)
    ranges = unit_digests(folder, todo, {f: RANGE_BYTES for f in rest})
    parts = gather_objects((mine, ranges, None if non_finite is None else list(non_finite)[:5]), group)
    bad = sorted({f"rank {r}'s {n}" for r, (_, _, names) in enumerate(parts) for n in names or ()})
    if rank == 0:
        entries = {f: e for whole, _, _ in parts for f, e in whole.items()}
        digests = {k: d for _, some, _ in parts for k, d in some.items()}
        for f in rest:
            entries[f] = {"size": sizes[f], "range_bytes": RANGE_BYTES,
                          "digests": [digests[(f, i)] for i in range(range_count(sizes[f], RANGE_BYTES))]}
        if bad:
            logger.warning("ds_acco: checkpoint %s holds non-finite values (%s); it is written for inspection, "
                           "but a load will refuse it", folder, ", ".join(bad))
        body = {"format": FORMAT, "writer": writer, "tag": tag, "saved_unix": time.time(),
                "world_size": len(known), "hash": HASH, "files": {f: entries[f] for f in files},
                "finite_at_save": all(names == [] for _, _, names in parts)}
        if fsync:  # the files' names are durable before the manifest that vouches for them
            fsync_folders(folder)
        tmp = os.path.join(folder, f"{MANIFEST}.tmp{os.getpid()}")
        with guard(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                signature = {} if key is None else {"signature": signing.sign(body, key)}
                json.dump(dict(body, seal=_seal(body), **signature), f, indent=1, sort_keys=True)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, os.path.join(folder, MANIFEST))
            if fsync:
                fsync_path(folder)
    dist.barrier(group=group)
    return bad


def read_manifest(folder: str) -> tuple[Optional[dict], Optional[str]]:
    """``(manifest, None)``, or ``(None, what is wrong)`` when it is missing, unreadable or edited.

    A signed manifest keeps its ``signature`` entry (not covered by the seal, and checked by
    :func:`ds_acco.checkpoint.signing.problem` against the rest)."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None, "missing"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        seal = data.pop("seal")
        signature = data.pop("signature", None)
        files = data["files"]
        int(seal, 16)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {exc})"
    if seal != _seal(data) or not isinstance(files, dict):
        return None, "edited after the save (its seal does not match its contents)"
    if signature is not None:
        data["signature"] = signature
    return data, None


def newest_complete_tag(parent: str, other_than: str) -> Optional[str]:
    """The newest sibling of ``other_than`` in ``parent`` whose manifest is intact (by save time), or None."""
    best: tuple[float, str] | None = None
    try:
        names = os.listdir(parent)
    except OSError:
        return None
    for name in names:
        if name == other_than or not os.path.isdir(os.path.join(parent, name)):
            continue
        data, _ = read_manifest(os.path.join(parent, name))
        if data is not None and (best is None or data["saved_unix"] > best[0]):
            best = (data["saved_unix"], name)
    return best[1] if best else None


def clean_partials(save_dir: str, tag: Optional[str] = None) -> None:
    """Report and remove what a crashed save left in ``save_dir`` (``<tag>.partial``, ``<tag>.old<pid>``; of
    every tag, or of ``tag`` only where the folder is not ds_acco's alone)."""
    try:
        names = sorted(os.listdir(save_dir or "."))
    except FileNotFoundError:
        return
    for name in names:
        stem, _, suffix = name.rpartition(".")
        debris = suffix == "partial" or (suffix.startswith("old") and suffix[3:].isdigit())
        if stem and debris and (tag is None or stem == tag):
            path = os.path.join(save_dir, name)
            logger.warning("ds_acco: removing %s, left by a save that did not finish (it was never a "
                           "complete checkpoint and was not loaded)", path)
            shutil.rmtree(path, ignore_errors=True)
