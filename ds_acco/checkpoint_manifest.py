"""Checkpoint manifests: the files a ds_acco checkpoint consists of, with their sizes and hashes.

Why: torch's zip reader does not check its CRCs on load, and neither DeepSpeed nor
``torch.distributed.checkpoint`` checks what it reads, so a file damaged on disk (bytes
overwritten, truncated, emptied, as a bad disk or a partial copy leaves it) either loads
as garbage that trains to NaN or fails with an error that names no file. Every ds_acco
save therefore ends with ``ds_acco_manifest.json`` in the checkpoint folder: each file
with its size and content hash. It is written last and atomically, so a tag is complete
exactly when its manifest is there (:mod:`ds_acco.checkpoint_verify` checks it on load).

The hash is xxHash's XXH3-64 (package ``xxhash``) over the file mapped into memory:
about 4 GB/s on one loaded core of the CI machine where ``zlib.crc32``, the fallback
when ``xxhash`` is not installed, reaches 1.1 (blake2b 0.6, sha256 1.2 GB/s), and an
in-cache ``torch.load`` of the same bytes takes 4 times as long as XXH3. Either
detects accidental damage, not tampering. Hashing is shared out: each file is hashed
once, by a rank that wrote (on save) or reads (on load) it, and the ranks exchange the
results (cost measured in BENCHMARKS.md, "Checkpoint verification").
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Optional, Sequence

import torch.distributed as dist

try:
    import xxhash
except ImportError:  # crc32 instead; manifests say which hash they use
    xxhash = None

logger = logging.getLogger("ds_acco")

MANIFEST = "ds_acco_manifest.json"
FORMAT = 1
HASH = "xxh3_64" if xxhash is not None else "crc32"
"""The hash new manifests use."""


def file_digest(path: str, algorithm: str = HASH) -> str:
    """The hash of a file's bytes, hex.

    Raises:
        ValueError: ``algorithm`` is unknown, or is ``xxh3_64`` and ``xxhash`` is not installed.
    """
    if algorithm == "xxh3_64" and xxhash is None:
        raise ValueError("this manifest was hashed with xxh3_64, which needs the xxhash package (pip install xxhash)")
    if algorithm not in ("xxh3_64", "crc32"):
        raise ValueError(f"unknown hash {algorithm!r} in the manifest; allowed: 'xxh3_64', 'crc32'")
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            data = b""
            return xxhash.xxh3_64_hexdigest(data) if algorithm == "xxh3_64" else f"{zlib.crc32(data):08x}"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # no copy through Python buffers
            return xxhash.xxh3_64_hexdigest(data) if algorithm == "xxh3_64" else f"{zlib.crc32(data):08x}"


def file_digests(paths: Sequence[str], algorithm: str = HASH) -> dict[str, str]:
    """:func:`file_digest` of each path, largest first, on up to 4 threads (``xxhash`` and ``zlib``
    release the GIL): a rank that reads a model file and its optimizer file waits for the larger, not
    both, where the node has cores to spare, and the ranks share the cores where it has none.

    Raises:
        ValueError: as :func:`file_digest`.
    """
    order = sorted(paths, key=os.path.getsize, reverse=True)
    if len(order) <= 1:
        return {path: file_digest(path, algorithm) for path in order}
    with ThreadPoolExecutor(min(4, len(order), os.cpu_count() or 1)) as pool:
        return dict(zip(order, pool.map(lambda path: file_digest(path, algorithm), order)))


def tag_files(folder: str) -> list[str]:
    """Every file under ``folder`` (relative paths, sorted), except the manifest and temporary files."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != MANIFEST and ".tmp" not in name:
                out.append(rel)
    return sorted(out)


def share_out(files: Sequence[str], claims: Sequence[Iterable[str]], rank: int) -> list[str]:
    """The files ``rank`` hashes: those it claims and no lower rank claims, plus its round-robin
    share of the files nobody claims (so every file is hashed exactly once).

    Args:
        files: every file of the tag.
        claims: per rank, the files it wrote or reads anyway (hashing them costs no extra network read).
        rank: this rank.
    """
    owner: dict[str, int] = {}
    for r, names in enumerate(claims):
        for name in names:
            owner.setdefault(name, r)
    unclaimed = [f for f in files if f not in owner]
    mine = [f for f in files if owner.get(f) == rank]
    return mine + unclaimed[rank::len(claims)]


def fsync_path(path: str) -> None:
    """Flush a file's data, or a folder's entries (names created or renamed in it), to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folders(folder: str) -> None:
    """Flush the entries of ``folder`` and of every folder under it."""
    for root, _, _ in os.walk(folder):
        fsync_path(root)


def _gather(obj, group) -> list:
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _seal(body: dict) -> str:
    return f"{zlib.crc32(json.dumps(body, sort_keys=True).encode()):08x}"


def write_manifest(folder: str, *, writer: str, tag: str, claim: Sequence[str] = (),
                   hashed: Optional[dict] = None, fsync: bool = True, group=None) -> None:
    """Hash every file of ``folder`` (shared out over the ranks) and write its manifest; collective.

    Call it when every rank has finished writing (and, with ``fsync``, flushing) its files.
    Rank 0 writes the manifest through a temporary name, so it appears whole or not at all.

    Args:
        folder: the checkpoint folder (one shared filesystem for all ranks).
        writer: which front end wrote the checkpoint (stored for the reader's messages).
        tag: the checkpoint's name.
        claim: files this rank wrote; it hashes those (others are shared out round-robin).
        hashed: ``{name: {"size", "digest"}}`` this rank already computed (see
            :class:`ds_acco.checkpoint_files.FileFinisher`); claimed, not hashed again.
        fsync: flush the folders' entries before the manifest, and the manifest's own entry after it.
        group: the process group of the ranks that wrote the checkpoint (None: the default group).
    """
    rank = dist.get_rank(group)
    hashed = hashed or {}
    listing = [tag_files(folder) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    files = listing[0]
    claims = _gather([f for f in list(hashed) + list(claim) if f in files], group)
    mine = {f: hashed[f] for f in share_out(files, claims, rank) if f in hashed}
    todo = {os.path.join(folder, f): f for f in share_out(files, claims, rank) if f not in hashed}
    for path, digest in file_digests(list(todo)).items():
        mine[todo[path]] = {"size": os.path.getsize(path), "digest": digest}
    entries: dict = {}
    for part in _gather(mine, group):
        entries.update(part)
    if rank == 0:
        body = {"format": FORMAT, "writer": writer, "tag": tag, "saved_unix": time.time(),
                "world_size": len(claims), "hash": HASH, "files": {f: entries[f] for f in files}}
        if fsync:  # the files' names are durable before the manifest that vouches for them
            fsync_folders(folder)
        tmp = os.path.join(folder, f"{MANIFEST}.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(dict(body, seal=_seal(body)), f, indent=1, sort_keys=True)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, MANIFEST))
        if fsync:
            fsync_path(folder)
    dist.barrier(group=group)


def read_manifest(folder: str) -> tuple[Optional[dict], Optional[str]]:
    """``(manifest, None)``, or ``(None, what is wrong)`` when it is missing, unreadable or edited."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None, "missing"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        seal = data.pop("seal")
        files = data["files"]
        int(seal, 16)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {exc})"
    if seal != _seal(data) or not isinstance(files, dict):
        return None, "edited after the save (its seal does not match its contents)"
    return data, None


def remove_manifest(folder: str) -> None:
    """Make ``folder`` incomplete before it is overwritten in place (a crash then leaves no stale manifest)."""
    try:
        os.remove(os.path.join(folder, MANIFEST))
    except FileNotFoundError:
        pass


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


def clean_partials(save_dir: str) -> None:
    """Report and remove what a crashed save left in ``save_dir`` (``<tag>.partial``, ``<tag>.old<pid>``)."""
    try:
        names = sorted(os.listdir(save_dir))
    except FileNotFoundError:
        return
    for name in names:
        stem, _, suffix = name.rpartition(".")
        if stem and (suffix == "partial" or (suffix.startswith("old") and suffix[3:].isdigit())):
            path = os.path.join(save_dir, name)
            logger.warning("ds_acco: removing %s, left by a save that did not finish (it was never a "
                           "complete checkpoint and was not loaded)", path)
            shutil.rmtree(path, ignore_errors=True)
