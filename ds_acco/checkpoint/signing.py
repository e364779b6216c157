"""Signed checkpoints (opt-in): an HMAC-SHA256 of the manifest, checked before any file is parsed.

Why: the manifest holds every file's size and range hashes, so it detects damage, but nothing in it needs a secret:
whoever can write the folder can replace a file and rewrite its entry. With a key, the save signs the manifest, and a
load checks the signature first (the signature covers the hashes, the hashes cover every byte), then every file's
hashes, and only then lets anything parse a file. A tag that is unsigned, signed with another key, or edited after the
save is refused on every rank, naming the tag.

The key is the bytes of a file (at least :data:`MIN_KEY_BYTES`), named by ``acco.checkpoint.signing_key_file`` or, when
that is unset, the environment variable :data:`KEY_ENV` (so a key never has to sit in a config file that is copied
around). Without either, saves are unsigned and loads check nothing more than before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Optional

from ds_acco.errors import AccoConfigError

KEY_ENV = "DS_ACCO_CHECKPOINT_KEY_FILE"
MIN_KEY_BYTES = 32
ALGORITHM = "hmac-sha256"


def load_key(key_file: Optional[str]) -> Optional[bytes]:
    """The signing key from ``acco.checkpoint.signing_key_file``, else from ``$DS_ACCO_CHECKPOINT_KEY_FILE``."""
    where = "acco.checkpoint.signing_key_file" if key_file else f"${KEY_ENV}"
    path = key_file or os.environ.get(KEY_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read()
    except OSError as exc:
        raise AccoConfigError(f"{where}: got {path!r}, which cannot be read ({exc.strerror}); allowed: a readable "
                              f"file of at least {MIN_KEY_BYTES} random bytes") from None
    if len(key) < MIN_KEY_BYTES:
        raise AccoConfigError(f"{where}: {path!r} holds {len(key)} bytes; allowed: at least {MIN_KEY_BYTES} random "
                              f"bytes (e.g. head -c 32 /dev/urandom > {path})")
    return key


def key_id(key: bytes) -> str:
    """Names a key without revealing it (so a refusal can say *which* key signed a tag)."""
    return hashlib.sha256(b"ds_acco key id\0" + key).hexdigest()[:16]


def _mac(body: dict, key: bytes) -> str:
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def sign(body: dict, key: bytes) -> dict:
    """The ``signature`` entry of a manifest whose contents (without seal and signature) are ``body``."""
    return {"algorithm": ALGORITHM, "key_id": key_id(key), "mac": _mac(body, key)}


def problem(body: Optional[dict], signature: Optional[dict], key: bytes) -> Optional[str]:
    """What is wrong with a manifest's signature under ``key`` (None: it is signed by it, unchanged)."""
    if body is None:
        return "has no manifest, so it is not signed"
    if not isinstance(signature, dict) or "mac" not in signature:
        return "is not signed"
    if signature.get("key_id") != key_id(key):
        return f"is signed with another key (key id {signature.get('key_id')}; this job's key has id {key_id(key)})"
    if signature.get("algorithm") != ALGORITHM or not hmac.compare_digest(str(signature["mac"]), _mac(body, key)):
        return "has a signature that does not match its manifest (edited after the save)"
    return None
