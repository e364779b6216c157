"""Where a sweep folder's results live: ``results.json`` while it runs, ``results.json.gz`` once published.

Why packed: the long runs' raw files run to megabytes each (a sleep-bed folder's, 7 MB), 118 MiB in all, plain.
A published folder is read, never edited by hand. Gzip keeps each file whole in about a seventh of the space, and
the bytes stay reproducible: no time stamp in the header. The checkout then stays small enough to copy to a lent
GPU machine (the device tool takes at most 64 MiB).

A sweep writes plain ``results.json``; ``python -m benchmarks pack FOLDER...`` packs a folder before it is
committed. A sweep resumed in a packed folder writes it packed again, and a folder only ever holds one of the two
(:func:`save` removes the other). Readers take whichever is there (:func:`load`).
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Optional

PLAIN = "results.json"
PACKED = "results.json.gz"


def path_of(folder: str) -> Optional[str]:
    """The folder's results file, packed or plain; None where it has neither (nothing ran there yet)."""
    for name in (PACKED, PLAIN):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def exists(folder: str) -> bool:
    return path_of(folder) is not None


def load_file(path: str) -> dict:
    """A results file by its name: ``.gz`` is read through gzip."""
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load(folder: str) -> dict:
    path = path_of(folder)
    if path is None:
        raise FileNotFoundError(f"{folder}: no {PLAIN} or {PACKED}")
    return load_file(path)


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    if path.endswith(".gz"):
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            f.write(text.encode("utf-8"))
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    os.replace(tmp, path)


def save(folder: str, result: dict, **dump_kwargs) -> str:
    """Write ``result`` into ``folder`` (packed where it already was), atomically; returns the path written."""
    os.makedirs(folder, exist_ok=True)
    packed = os.path.isfile(os.path.join(folder, PACKED))
    path, other = (os.path.join(folder, n) for n in ((PACKED, PLAIN) if packed else (PLAIN, PACKED)))
    _write(path, json.dumps(result, **dump_kwargs))
    if os.path.isfile(other):
        os.remove(other)
    return path


def pack(folder: str) -> str:
    """Pack the folder's plain results file, byte for byte (the plain file is removed); returns the packed path."""
    plain, packed = os.path.join(folder, PLAIN), os.path.join(folder, PACKED)
    if not os.path.isfile(plain):
        if os.path.isfile(packed):
            return packed
        raise FileNotFoundError(f"{folder}: no {PLAIN} to pack")
    with open(plain, encoding="utf-8") as f:
        text = f.read()
    _write(packed, text)
    os.remove(plain)
    return packed
