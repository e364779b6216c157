"""Hostile checkpoints, for tests/test_checkpoint_trust.py (run inside checkpoint_damage_script.py).

An attacker with write access to a checkpoint folder replaces a file with a pickle whose
``__reduce__`` runs a shell command (here: ``touch`` a marker file), and may rewrite that
file's manifest entry (sizes, range digests, then the CRC seal: none of it needs a secret).
A load must refuse every such copy on every rank, naming the file, and the marker must never
appear. With a signing key the forgery is caught one step earlier: the signature covers the
manifest, so a rewritten manifest is refused before any file is parsed.
"""

from __future__ import annotations

import json
import os
import zlib

import torch
import torch.distributed as dist

from ds_acco.checkpoint.manifest import MANIFEST, file_entry
from ds_acco.errors import CheckpointError
from tests import workloads as W
from tests.checkpoint_damage import make_copies, overwrite, refusals
from tests.checkpoint_workloads import ACCO, MODEL, OPTIM, ROUND, engine_of, train


class Payload:
    """Unpickling this runs ``touch <marker>`` (what ``torch.load(weights_only=False)`` would do)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(path: str, marker: str) -> None:
    torch.save({"module": Payload(marker)}, path)


def rehash(tag_dir: str, name: str, keep_signature: bool = True) -> None:
    """Rewrite ``name``'s manifest entry and the seal, as anyone without the key can."""
    path = os.path.join(tag_dir, MANIFEST)
    data = json.load(open(path))
    signature = data.pop("signature", None)
    data.pop("seal")
    data["files"][name] = file_entry(os.path.join(tag_dir, name))
    data["seal"] = f"{zlib.crc32(json.dumps(data, sort_keys=True).encode()):08x}"
    if keep_signature and signature is not None:
        data["signature"] = signature
    json.dump(data, open(path, "w"))


def unsign(tag_dir: str) -> None:
    path = os.path.join(tag_dir, MANIFEST)
    data = json.load(open(path))
    data.pop("signature", None)
    json.dump(data, open(path, "w"))


def hostile_cases(names, markers: str) -> dict:
    """case -> (file, the file the message must name, what to do to the tag folder); one marker per case."""
    cases = {}
    for i, name in enumerate(names):
        for rewrite in (False, True):
            marker = os.path.join(markers, f"m{i}{int(rewrite)}")

            def damage(tag_dir, name=name, marker=marker, rewrite=rewrite):
                plant(os.path.join(tag_dir, name), marker)
                if rewrite:
                    rehash(tag_dir, name)

            label = f"pickle in {name}" + (" and a rewritten manifest" if rewrite else "")
            cases[label] = (None, name, damage)
    return cases


def _write_key(path: str, seed: int) -> str:
    if dist.get_rank() == 0:
        with open(path, "wb") as f:
            f.write(bytes((seed * 31 + i) % 256 for i in range(32)))
    dist.barrier()
    return path


def signed_config(key_file: str) -> dict:
    return dict(ACCO, acco=dict(ACCO["acco"], checkpoint={"signing_key_file": key_file}))


def hostile_scenarios(out: str) -> dict:
    """Hostile files in an unsigned checkpoint, then the signing cases; the markers left at the end."""
    markers = os.path.join(out, "markers")
    os.makedirs(markers, exist_ok=True)
    ckpt = os.path.join(out, "trust_plain")
    a = engine_of(ACCO)
    train(a, 0, 4, [], save=(ckpt, (6,)))
    a.destroy()
    names = [MODEL, OPTIM.format(r=1), ROUND.format(r=0)]
    cases = hostile_cases(names, markers)
    dirs = make_copies(ckpt, os.path.join(out, "trust_plain_damaged"), cases)
    b = engine_of(ACCO)
    unsigned = refusals(b, dirs, cases)
    b.destroy()

    key, other = _write_key(os.path.join(out, "key"), 1), _write_key(os.path.join(out, "other_key"), 2)
    signed = os.path.join(out, "trust_signed")
    s = engine_of(signed_config(key))
    train(s, 0, 4, [], save=(signed, (6,)))
    s.destroy()
    sig_cases = {
        f"a changed byte in {MODEL}": (MODEL, MODEL, overwrite),
        f"pickle in {OPTIM.format(r=1)} and a rewritten manifest": (
            None, "signature", lambda d: (plant(os.path.join(d, OPTIM.format(r=1)), os.path.join(markers, "s1")),
                                          rehash(d, OPTIM.format(r=1)))),
        "signature removed": (None, "not signed", unsign),
    }
    sig_dirs = make_copies(signed, os.path.join(out, "trust_signed_damaged"), sig_cases)
    c = engine_of(signed_config(key))
    signed_seen = refusals(c, sig_dirs, sig_cases)
    wrong = {"wrong key": (None, "another key", None), "unsigned checkpoint": (None, "not signed", None)}
    d = engine_of(signed_config(other))
    signed_seen.update(refusals(d, {"wrong key": signed}, wrong))
    d.destroy()
    signed_seen.update(refusals(c, {"unsigned checkpoint": ckpt}, wrong))
    try:
        c.load_checkpoint(signed)  # the intact, signed tag under the right key
        good = c.global_steps
    except CheckpointError as exc:
        good = str(exc)
    c.destroy()
    dist.barrier()
    return {"unsigned": unsigned, "signed": signed_seen, "good_signed_steps": good, "markers": sorted(os.listdir(markers))}


# ------------------------------------------------------------------ full disk
def tag_blocks(folder: str) -> int:
    """Bytes a tag occupies on disk (allocated blocks, as a tmpfs counts them)."""
    return sum(os.stat(os.path.join(r, f)).st_blocks * 512 for r, _, fs in os.walk(folder) for f in fs)


def one_save_size(rank, world, *, folder) -> tuple[int, int]:
    """Bytes of the save folder after one save (tag, DeepSpeed's zero_to_fp32.py, latest), and of the tag."""
    e = engine_of(ACCO)
    train(e, 0, 2, [])
    e.save_checkpoint(folder)
    tag = open(os.path.join(folder, "latest")).read().strip()
    e.destroy()
    return tag_blocks(folder), tag_blocks(os.path.join(folder, tag))


def full_disk_job(rank, world, *, folder) -> dict:
    """Save, train, save again on a filesystem with room for one and a half tags: the second save fails
    (raise), the first tag still loads and resumes; with on_save_error "continue" training goes on."""
    from ds_acco.checkpoint.save_failure import CheckpointSaveError

    e = engine_of(ACCO)
    train(e, 0, 2, [])
    e.save_checkpoint(folder)
    first = open(os.path.join(folder, "latest")).read().strip()
    train(e, 8, 4, [])
    try:
        e.save_checkpoint(folder)
        raised = None
    except CheckpointSaveError as exc:
        raised = str(exc)
    steps_at_failure = e.global_steps
    e.destroy()
    dist.barrier()
    listing = sorted(os.listdir(folder))
    latest = open(os.path.join(folder, "latest")).read().strip()
    r = engine_of(ACCO)
    r.load_checkpoint(folder)
    loaded_steps = r.global_steps
    resumed = train(r, 8, 4, [])
    r.destroy()
    cont = engine_of(dict(ACCO, acco=dict(ACCO["acco"], checkpoint={"on_save_error": "continue"})))
    cont.load_checkpoint(folder)
    train(cont, 8, 3, [])
    returned = cont.save_checkpoint(folder)  # fails again: logged, training goes on
    after = train(cont, 20, 4, [])
    cont.destroy()
    return {"first": first, "raised": raised, "steps_at_failure": steps_at_failure, "listing": listing,
            "latest": latest, "loaded_steps": loaded_steps, "resumed": len(resumed),
            "continue_returned": returned, "continue_trained": len(after),
            "finite": all(bool(torch.isfinite(p).all()) for step in after for p in step)}


# ------------------------------------------------------------------ resume under a changed block
SAFE_CHANGES = {
    "policy adaptive": {"policy": "adaptive", "max_micro_batches_per_round": 2},  # rounds end within the run
    "int8 reduce-scatter with error feedback": {"comm_quantization": "int8", "error_feedback": True},
    "int8 all-gathers": {"all_gather_quantization": "int8"},
    "mode sync": {"mode": "sync"},
    "mode dpu": {"mode": "dpu"},
    "mode auto": {"mode": "auto"},
}


def _fit_losses(engine, rank, micro_batches) -> list[float]:
    """Losses on one fixed batch (so a working optimizer must bring them down)."""
    x, y = W.batch(rank, 0)
    losses = []
    for _ in range(micro_batches):
        loss = W.loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def changed_block_job(rank, world, *, folder) -> dict:
    """Save under ACCO fixed fp32 with a round in flight; resume under each safe change and train on; then
    ranks started with different blocks, and a streaming state resumed with another fragment count."""
    from tests.log_capture import ds_acco_lines

    e = engine_of(ACCO)
    train(e, 0, 3, [], save=(folder, (10,)))  # micro-batch 10: an estimate round in flight
    e.destroy()
    out = {}
    with ds_acco_lines() as lines:
        for label, change in SAFE_CHANGES.items():
            del lines[:]
            r = engine_of(dict(ACCO, acco=dict(ACCO["acco"], **change)))
            r.load_checkpoint(folder)
            steps = r.global_steps
            losses = _fit_losses(r, rank, 24)
            out[label] = {"steps": steps, "losses": losses, "lines": [s for s in lines if "changed acco block" in s]}
            r.destroy()
    try:
        engine_of(dict(ACCO, acco=dict(ACCO["acco"], policy="adaptive" if rank == 1 else "fixed"))).destroy()
        out["ranks differ"] = None
    except Exception as exc:  # noqa: BLE001
        out["ranks differ"] = f"{type(exc).__name__}: {exc}"
    return out


# ------------------------------------------------------------------ full disk under FSDP2 (DCP)
def fsdp_one_save_size(rank, world, *, folder) -> int:
    """Bytes one AccoFSDP save occupies (its folder: DCP files, metadata, manifest)."""
    from tests import fsdp_workloads as F

    model, acco = F.build(world, F.RESUME["config"], F.RESUME["G"])
    F.train(rank, model, acco, 2)
    acco.save_checkpoint(os.path.join(folder, "step2"))
    acco.close()
    return tag_blocks(folder)


def fsdp_full_disk_job(rank, world, *, folder) -> dict:
    """Save, train, then save again (to a new folder and over the first) on a filesystem with room for one
    and a half saves: both fail on every rank with one message, nothing partial stays, the first save
    loads and trains on; with on_save_error "continue" the failed save returns False and training goes on."""
    from ds_acco.checkpoint.save_failure import CheckpointSaveError
    from tests import fsdp_workloads as F

    first = os.path.join(folder, "step2")
    model, acco = F.build(world, F.RESUME["config"], F.RESUME["G"])
    _, k = F.train(rank, model, acco, 2)
    acco.save_checkpoint(first, extra={"k": k})
    _, k = F.train(rank, model, acco, 4, k=k)
    raised = {}
    for name in ("step4", "step2"):  # a new folder; the same folder, overwritten
        try:
            acco.save_checkpoint(os.path.join(folder, name))
            raised[name] = None
        except CheckpointSaveError as exc:
            raised[name] = str(exc)
    acco.close()
    dist.barrier()
    listing = sorted(os.listdir(folder))
    model, acco = F.build(world, F.RESUME["config"], F.RESUME["G"])
    k = acco.load_checkpoint(first)["k"]
    loaded = acco.commits
    _, k = F.train(rank, model, acco, loaded + 2, k=k)
    resumed = acco.commits - loaded
    acco.close()
    cfg = dict(F.RESUME["config"], checkpoint={"on_save_error": "continue"})
    model, acco = F.build(world, cfg, F.RESUME["G"])
    k = acco.load_checkpoint(first)["k"]
    returned = acco.save_checkpoint(os.path.join(folder, "step4"))
    before = acco.commits
    F.train(rank, model, acco, before + 2, k=k)
    after = acco.commits - before
    finite = all(bool(torch.isfinite(p.unsharded).all()) for p in acco.params)
    acco.close()
    return {"raised": raised, "listing": listing, "loaded": loaded, "resumed": resumed, "returned": returned,
            "after": after, "finite": finite, "left": sorted(os.listdir(folder))}


def fsdp_changed_block_job(rank, world, *, folder) -> dict:
    """AccoFSDP saved under acco fixed fp32 with a round in flight, resumed under each safe change: trains on,
    and rank 0's one WARNING names the fields."""
    from tests import fsdp_workloads as F
    from tests.log_capture import ds_acco_lines

    model, acco = F.build(world, F.RESUME["config"], F.RESUME["G"])
    F.train(rank, model, acco, 3, save_at=10, ckpt=folder)  # micro-batch 10: a round in flight
    acco.close()
    out = {}
    with ds_acco_lines() as lines:
        for label, change in (("mode sync", {"mode": "sync"}),
                              ("int8", {"comm_quantization": "int8", "error_feedback": True})):
            del lines[:]
            model, acco = F.build(world, dict(F.RESUME["config"], **change), F.RESUME["G"])
            k = acco.load_checkpoint(folder)["k"]
            loaded = acco.commits
            F.train(rank, model, acco, loaded + 2, k=k)
            out[label] = {"loaded": loaded, "trained": acco.commits - loaded, "lines": list(lines),
                          "finite": all(bool(torch.isfinite(p.unsharded).all()) for p in acco.params)}
            acco.close()
    return out
