"""Damaging copies of a checkpoint and loading each: what every front end's refusal tests share.

Rank 0 copies an intact checkpoint once per case and damages the copy the way a bad disk, a crash or a hand
edit leaves one; every rank then calls the front end's real ``load_checkpoint`` on each copy in turn and records
what it raised and whether the engine's state moved (a refused load must lose nothing).
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist

from ds_acco.checkpoint.manifest import MANIFEST
from ds_acco.errors import CheckpointError


def overwrite(path):
    """XOR 4 KiB (at most half the file) in its middle: size unchanged, as a bad disk leaves it."""
    size = os.path.getsize(path)
    n, at = min(4096, size // 2), size // 3
    with open(path, "r+b") as f:
        f.seek(at)
        data = bytearray(f.read(n))
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


def scramble_head(path):
    """XOR the first 4 KiB: a zip's first header and the pickle behind it, so the loader itself raises."""
    n = min(4096, os.path.getsize(path))
    with open(path, "r+b") as f:
        data = bytearray(f.read(n))
        f.seek(0)
        f.write(bytes(b ^ 0xFF for b in data))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def empty(path):
    open(path, "wb").close()


def edit_manifest(path):
    data = json.load(open(path))
    first = sorted(data["files"])[0]
    data["files"][first]["digests"][0] = "00000000"
    json.dump(data, open(path, "w"))


def latest_names_partial(tag_dir):
    """A crashed save's debris named by ``latest`` (as a hand edit or another tool could leave it)."""
    root, tag = os.path.split(tag_dir)
    shutil.copytree(tag_dir, os.path.join(root, tag + "x.partial"))
    os.remove(os.path.join(root, tag + "x.partial", MANIFEST))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(tag + "x.partial")


def damage_cases(names, latest=True):
    """case -> (file it damages, the file the message must name, what to do to it); ``latest``: the
    folder has a ``latest`` file (DeepSpeed layout)."""
    cases = {}
    for name in names:
        cases[f"overwrite {name}"] = (name, name, overwrite)
    for name in names[:2]:  # the loader raises on these (same size, so the hashes are still running)
        cases[f"scramble the head of {name}"] = (name, name, scramble_head)
    cases[f"truncate {names[-1]}"] = (names[-1], names[-1], truncate)
    cases[f"empty {names[1]}"] = (names[1], names[1], empty)
    cases[f"delete {names[-1]}"] = (names[-1], names[-1], os.remove)
    cases["delete manifest"] = (MANIFEST, MANIFEST, os.remove)
    cases["edit manifest"] = (MANIFEST, MANIFEST, edit_manifest)
    if latest:
        cases["latest names a partial tag"] = (None, "x.partial", latest_names_partial)
    return cases


def make_copies(ckpt, root, cases, tag=None):
    """On rank 0: one copy of ``ckpt`` per case under ``root``, with ``tag`` (default: latest) damaged."""
    tag = tag or open(os.path.join(ckpt, "latest")).read().strip()
    dirs = {}
    for i, (case, (target, _, damage)) in enumerate(cases.items()):
        dest = os.path.join(root, f"case{i}")
        if dist.get_rank() == 0:
            shutil.copytree(ckpt, dest)
            damage(os.path.join(dest, tag, target) if target else os.path.join(dest, tag))
        dirs[case] = dest
    dist.barrier()
    return dirs


def refusals(engine, dirs, cases):
    """Load every damaged copy; return case -> (raised CheckpointError naming the file, message head, the
    loader's own error it was chained to, whether the engine's steps, module and optimizer state are unchanged)."""
    seen = {}
    for case, path in dirs.items():
        steps_before, state_before = _steps(engine), _state(engine)
        try:
            engine.load_checkpoint(path)
            seen[case] = {"refused": False, "message": "loaded"}
        except CheckpointError as exc:
            msg = str(exc)
            seen[case] = {"refused": True, "names_file": cases[case][1] in msg, "message": msg[:600],
                          "names_earlier": "resume from" in msg, "steps_unchanged": _steps(engine) == steps_before,
                          "state_unchanged": states_equal([_state(engine)], [state_before]),
                          "cause": type(exc.__cause__).__name__ if exc.__cause__ is not None else None}
    return seen


def _steps(engine) -> int:
    return engine.global_steps if hasattr(engine, "global_steps") else engine.commits


def _state(engine) -> list:
    """Copies of the module's parameters, the fp32 masters (DeepSpeed ZeRO) and every optimizer state tensor."""
    from ds_acco.checkpoint.verify import optimizer_tensors

    opt = engine.optimizer
    tensors = list(engine.module.parameters()) + list(getattr(opt, "single_partition_of_fp32_groups", []))
    tensors += [t for _, t in optimizer_tensors(getattr(opt, "optimizer", opt))]  # ZeRO wraps the torch one
    tensors.append(torch.tensor(float(len(tensors))))  # moments that appear change the count
    return [(t.to_local() if hasattr(t, "to_local") else t).detach().clone() for t in tensors]


def states_equal(a, b) -> bool:
    return len(a) == len(b) > 0 and all(torch.equal(x, y) for s, t in zip(a, b) for x, y in zip(s, t))


def overwrite_at(path, at, n=16):
    """XOR ``n`` bytes at offset ``at`` (size unchanged)."""
    with open(path, "r+b") as f:
        f.seek(at)
        data = bytearray(f.read(n))
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))
