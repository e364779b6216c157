"""Loading checkpoint files without running code from them.

Why: ``torch.load(weights_only=False)`` unpickles whatever the file names, and a pickle can name ``os.system``. Whoever
can write to a checkpoint folder (a shared filesystem, a downloaded checkpoint, a compromised job) could then run
commands in every rank that loads it; the manifest's hashes do not stop that, since nothing in them needs a secret. So
every file ds_acco reads, and every file DeepSpeed reads for a ds_acco engine, is unpickled with torch's restricted
unpickler (``weights_only=True``): tensors, containers and numbers, plus the few classes a front end allow-lists by name
(DeepSpeed's ZeRO-1 files hold a loss scaler, a stage enum and fragment addresses). A file that needs any other class
fails, naming the file, the class and the switch that restores the old behaviour
(``acco.checkpoint.weights_only: false``) for files from a source you trust.

``torch.distributed.checkpoint`` reads its ``.metadata`` with plain ``pickle.load``; :class:`RestrictedUnpickler` reads
it with an allow-list of DCP's metadata classes instead (the ``find_class`` recipe of the ``pickle`` documentation).
"""

from __future__ import annotations

import contextlib
import importlib
import pickle
import re
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch

from ds_acco.errors import UnsafeCheckpointError  # (raised here; every exception lives in ds_acco.errors)

SWITCH = "acco.checkpoint.weights_only"
_TORCH_LOAD = torch.load  # the real one, also while torch_load_restricted() stands in for it
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _resolve(names: Iterable[str]) -> list:
    """The allow-listed classes that exist in this process (a name whose module is not loaded is skipped:
    a file cannot hold an object of a class its writer did not have, and importing it here would pull in
    a framework the layer must not depend on)."""
    out = []
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            out.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return out


def refusal(path: str, exc: BaseException) -> UnsafeCheckpointError:
    """The error for a file the restricted unpickler refused: its path, the class, and the switch."""
    found = _GLOBAL.search(str(exc))
    return UnsafeCheckpointError(path, found.group(1) if found else None, str(exc))


def load(path: Any, *, map_location: Any = None, allow: Sequence[str] = (), weights_only: bool = True,
         **kwargs: Any) -> Any:
    """``torch.load`` that never runs code from the file (unless ``weights_only``, the switch, is False).

    ``allow``: qualified names of the classes the file may hold beyond tensors, containers and numbers;
    a file that names any other class raises :class:`UnsafeCheckpointError` (never after running it).
    """
    if not weights_only:
        return _TORCH_LOAD(path, map_location=map_location, weights_only=False, **kwargs)
    try:
        with torch.serialization.safe_globals(_resolve(allow)):
            return _TORCH_LOAD(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        raise refusal(getattr(path, "name", path), exc) from None


def classes_beyond(path: str, allow: Sequence[str] = ()) -> list[str]:
    """The classes a torch checkpoint file would unpickle beyond torch's weights-only set and ``allow``,
    read off its pickle without unpickling it (empty for a file that is not a torch zip: its load says
    what it is, and still unpickles nothing outside the allow-list)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - not a torch zip file
        return []
    return [name for name in found if name not in allow]


@contextlib.contextmanager
def torch_load_restricted(allow: Sequence[str] = (), weights_only: bool = True) -> Iterator[None]:
    """Within the block, every ``torch.load`` in this process is :func:`load` with ``allow``.

    For third-party code that calls ``torch.load(..., weights_only=False)`` itself (DeepSpeed's
    universal-checkpoint conversion): the only way to restrict it without forking it. Use it around
    code that runs on the calling thread alone, for as short as it takes.
    """
    if not weights_only:
        yield
        return
    def restricted(f, map_location=None, pickle_module=None, *, weights_only=None, **kwargs):
        return load(f, map_location=map_location, allow=allow, **kwargs)

    torch.load = restricted
    try:
        yield
    finally:
        torch.load = _TORCH_LOAD


class RestrictedUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that resolves only torch dtypes and the globals of ``allow`` (refusing every other):
    qualified names (``module.Class``) or module prefixes ending in ``.``. ``weights_only`` False: plain
    ``pickle.load`` (trusted files)."""

    def __init__(self, file, allow: Sequence[str], path: str, weights_only: bool = True):
        super().__init__(file)
        self.allow, self.path, self.weights_only = tuple(allow), path, weights_only

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if not self.weights_only or dtype or qualified in self.allow or any(
                p.endswith(".") and qualified.startswith(p) for p in self.allow):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(self.path, qualified)


def restricted_pickle_load(file, allow: Sequence[str], path: Optional[str] = None, weights_only: bool = True) -> Any:
    """``pickle.load`` of an open binary ``file`` through :class:`RestrictedUnpickler`."""
    return RestrictedUnpickler(file, allow, path or getattr(file, "name", "<file>"), weights_only).load()
