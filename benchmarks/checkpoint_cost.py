"""What checkpoint verification costs: save and load of a >= 50 M-parameter model, with and without it.

Run on 2 ranks through the ``deepspeed`` launcher (figures in BENCHMARKS.md,
"Checkpoint verification")::

    flock /tmp/ds_acco_bench.lock deepspeed --num_gpus 2 --module benchmarks.checkpoint_cost --dir /tmp/ckpt_cost
    flock /tmp/ds_acco_bench.lock deepspeed --num_gpus 2 --module benchmarks.checkpoint_cost --dir /tmp/ckpt_cost --signing

A GPT-2 of 16 layers x 512 (50.6 M parameters, fp32, ZeRO-1 ACCO engine) trains one
optimizer step so the optimizer holds its moments. Then each repeat saves and loads in
every setting, A/B within the repeat, so each cost is a difference of neighbouring calls:

* ``page cache``: ``acco.checkpoint.fsync: false``; the save returns once the files are
  in the page cache, the load reads them from it;
* ``durable``: ``fsync: true`` (the default); the load reads from the page cache;
* ``cold``: after the durable save, the checkpoint's pages are dropped from the page
  cache (``posix_fadvise(DONTNEED)``), so the load reads the disk;

each with verification (the hashes for the manifest, on a background thread per file as
it is written; on load, every file hashed by a rank that reads it on background threads
while DeepSpeed parses the files, then the finite check while the round state loads)
and without (the same code with the hash replaced by a constant and the finite check
skipped). The first save and load of the run warm up and are reported apart.
Also printed: the time each save's main thread spent in the manifest step and waiting for
the background hashes still running after the flushes, each load's main-thread wait for
verification (for the agreed verdict once DeepSpeed has parsed a file, then for the finite
check's join and agreement), and each call's CPU seconds (all threads): on a node with no
core to spare, the CPU that verification adds is what it costs in time, whatever the
threads hide. Runs on any number of ranks (``--num_gpus 1``: a core to spare per rank here).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import statistics
import threading
import time

import torch
import torch.distributed as dist


def _timed(module, name: str, spent: dict, key: str = "", clock=time.perf_counter) -> None:
    """Wrap ``module.name`` so the seconds it takes add up in ``spent[key or name]``; ``clock=time.thread_time``
    counts the CPU seconds of whichever thread runs it (the background hashes and sums)."""
    real = getattr(module, name)
    key = key or name
    lock = threading.Lock()

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        t0 = clock()
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                spent[key] = spent.get(key, 0.0) + clock() - t0

    setattr(module, name, wrapper)


@contextlib.contextmanager
def _unverified():
    """Saves and loads as before, minus the work of verification: no hashing, no finite check."""
    from ds_acco.checkpoint import manifest as checkpoint_manifest
    from ds_acco.checkpoint import verify as checkpoint_verify

    saved = (checkpoint_manifest.range_digests, checkpoint_verify._non_finite)

    def no_hash(path, indices=None, algorithm=None, range_bytes=checkpoint_manifest.RANGE_BYTES):
        n = checkpoint_manifest.range_count(os.path.getsize(path), range_bytes)
        return ["0"] * len(range(n) if indices is None else list(indices))

    checkpoint_manifest.range_digests = no_hash  # every hash goes through it
    checkpoint_verify._non_finite = lambda named: []  # every finite check goes through it
    try:
        yield
    finally:
        checkpoint_manifest.range_digests, checkpoint_verify._non_finite = saved


def _cpu() -> float:
    """CPU seconds of this process, all threads (the background hashes included), user and system."""
    t = os.times()
    return t.user + t.system


def _evict(folder: str) -> None:
    """Drop the checkpoint's (clean, flushed) pages from the page cache, so the next load reads the disk."""
    for root, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--signing", action="store_true",
                   help="A/B signed (acco.checkpoint.signing_key_file) vs unsigned saves and loads instead")
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()

    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel

    import ds_acco
    from ds_acco.checkpoint import atomic as deepspeed_atomic
    from ds_acco.checkpoint import files as checkpoint_files
    from ds_acco.checkpoint import gate as checkpoint_gate
    from ds_acco.checkpoint import manifest as checkpoint_manifest
    from ds_acco.checkpoint import verify as checkpoint_verify
    from ds_acco.checkpoint.manifest import HASH
    from ds_acco.deepspeed import engine as deepspeed_engine

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=8, n_positions=64,
                                       vocab_size=257))
    n_params = sum(p.numel() for p in model.parameters())
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 1}, "steps_per_print": 10**6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "acco": {"mode": "acco", "policy": "fixed"}}
    engine = ds_acco.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
    x = torch.randint(0, 257, (1, 16))
    while engine.global_steps < 1:
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()

    if args.signing:
        signing_ab(engine, args)
        engine.destroy()
        return
    spent: dict = {}
    _timed(deepspeed_atomic, "write_manifest", spent)
    # folder flushes: inside write_manifest (durability, not verification), and after the rename
    _timed(checkpoint_manifest, "fsync_folders", spent, "manifest_flush")
    _timed(checkpoint_manifest, "fsync_path", spent, "manifest_flush")
    _timed(deepspeed_atomic, "fsync_path", spent, "publish_flush")
    # on load, the main thread waits for the agreed verdict (the hashes and the agreement run on background
    # threads while DeepSpeed parses), then joins the finite check and agrees on it
    _timed(checkpoint_gate.PendingVerdict, "verdict", spent)
    _timed(checkpoint_verify.FiniteCheck, "settle", spent)
    _timed(deepspeed_engine, "verification_group", spent)  # created at the first (warm-up) load, then cached
    # the CPU that verification's own work takes, on whichever thread: what it costs where no core is spare
    _timed(checkpoint_manifest, "range_digests", spent, "verify_cpu", clock=time.thread_time)
    _timed(checkpoint_verify, "_non_finite", spent, "verify_cpu", clock=time.thread_time)
    real_finish = checkpoint_files.FileFinisher.finish

    def finish(self):
        try:
            return real_finish(self)
        finally:
            spent["flush_wait"], spent["hash_wait"] = self.waited

    checkpoint_files.FileFinisher.finish = finish
    rank = dist.get_rank()
    group_s = [0.0]  # the first load's verification_group call: creating the gloo group, once per engine
    # (setting, verified) -> list of (save_s, save_verify_s, save_flush_s, load_s, load_verify_s, save_cpu,
    # load_cpu, load's wait for the verdict, load's wait for the finite check, load's verification CPU,
    # save's verification CPU)
    rows: dict = {}

    def one(setting: str, verified: bool, record: bool = True) -> None:
        engine._acco_config.checkpoint.fsync = setting != "page cache"
        if rank == 0:
            shutil.rmtree(args.dir, ignore_errors=True)
        dist.barrier()
        with contextlib.nullcontext() if verified else _unverified():
            spent.clear()
            t0, c0 = time.perf_counter(), _cpu()
            engine.save_checkpoint(args.dir)
            save_s, save_cpu = time.perf_counter() - t0, _cpu() - c0
            save_own = spent.get("verify_cpu", 0.0)  # hashes and the finite check's sums, any thread
            # the main thread's time in the manifest step (less its folder flushes) and waiting for hashes
            save_in = spent.get("write_manifest", 0.0) - spent.get("manifest_flush", 0.0) + spent.get("hash_wait", 0)
            save_flush = sum(spent.get(k, 0.0) for k in ("flush_wait", "manifest_flush", "publish_flush"))
            if setting == "cold":
                if rank == 0:
                    _evict(args.dir)
                dist.barrier()
            spent.clear()
            t0, c0 = time.perf_counter(), _cpu()
            engine.load_checkpoint(args.dir)
            load_s, load_cpu = time.perf_counter() - t0, _cpu() - c0
            load_in = spent.get("verdict", 0.0) + spent.get("settle", 0.0)
            load_parts = (spent.get("verdict", 0.0), spent.get("settle", 0.0), spent.get("verify_cpu", 0.0))
            if not record:
                group_s[0] = spent.get("verification_group", 0.0)
        rows.setdefault((setting if record else "first", verified), []).append(
            (save_s, save_in, save_flush, load_s, load_in, save_cpu, load_cpu, *load_parts, save_own))

    one("page cache", True, record=False)
    settings = ("page cache", "durable", "cold")
    for i in range(args.repeats):
        for setting in settings:
            for verified in ((True, False) if i % 2 == 0 else (False, True)):
                one(setting, verified)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        tag = open(os.path.join(args.dir, "latest")).read().strip()
        folder = os.path.join(args.dir, tag)
        mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20
        print(f"[checkpoint_cost] {n_params / 1e6:.1f} M parameters, {dist.get_world_size()} ranks, "
              f"checkpoint {mb:.0f} MiB, hash {HASH}, load average {os.getloadavg()[0]:.2f}")
        print(f"[checkpoint_cost] verification group created at the first load in {group_s[0]:.3f} s (rank 0; "
              "once per engine, not in the figures below)")
        for key in [("first", True)] + [(s, v) for s in settings for v in (True, False)]:
            for r, got in enumerate(gathered):
                calls = "; ".join(f"save {a:.3f} (verify {b:.3f}, flush {c:.3f}, cpu {f:.3f}) "
                                  f"load {d:.3f} (verify {e:.3f} = verdict {h:.3f} + finite {i:.3f}, cpu {g:.3f}, "
                                  f"of which verification {k:.3f}; save's verification cpu {m:.3f})"
                                  for a, b, c, d, e, f, g, h, i, k, m in got[key])
                print(f"[checkpoint_cost] {key[0]:10s} {'verified  ' if key[1] else 'unverified'} rank {r}: {calls}")
        print("[checkpoint_cost] medians over repeats and ranks, seconds; A/B cost = verified - unverified:")
        for s in settings:
            med = {v: [statistics.median(x[j] for got in gathered for x in got[(s, v)]) for j in range(11)]
                   for v in (True, False)}
            for what, j, inside, cpu in (("save", 0, 1, 5), ("load", 3, 4, 6)):
                on, off, v = med[True][j], med[False][j], med[True][inside]
                flush = f", of which flushing {med[True][2]:.3f}" if what == "save" else ""
                print(f"[checkpoint_cost] {s:10s} {what}: {on:.3f}{flush}; verification inside it {v:.3f} "
                      f"({100 * v / on:.1f}%); A/B: unverified {off:.3f}, cost {on - off:+.3f} "
                      f"({100 * (on - off) / off:+.1f}%); CPU per rank (all threads) {med[True][cpu]:.3f} verified, "
                      f"{med[False][cpu]:.3f} unverified, cost {med[True][cpu] - med[False][cpu]:+.3f} "
                      f"({100 * (med[True][cpu] - med[False][cpu]) / off:+.1f}% of the unverified call's time)")
            wait_v, wait_f, own = med[True][7], med[True][8], med[True][9]
            print(f"[checkpoint_cost] {s:10s} load: the main thread waited {wait_v:.3f} for the verdict and "
                  f"{wait_f:.3f} for the finite check; verification's own CPU (hashes and sums, any thread) "
                  f"{own:.3f} ({100 * own / on:.1f}% of the load)")
            for what, j, own_j in (("save", 0, 10), ("load", 3, 9)):  # per rank: where no core is spare, the
                # rank with the most verification work sets the pace
                by_rank = [(statistics.median(x[own_j] for x in got[(s, True)]),
                            statistics.median(x[j] for x in got[(s, True)])) for got in gathered]
                print(f"[checkpoint_cost] {s:10s} {what}: verification's own CPU by rank: " + ", ".join(
                    f"rank {r} {c:.3f} s ({100 * c / t:.1f}% of its {what})" for r, (c, t) in enumerate(by_rank)))
        shutil.rmtree(args.dir, ignore_errors=True)
    engine.destroy()


def signing_ab(engine, args) -> None:
    """Signed vs unsigned save and load, both verified, page cache, alternating order per repeat.

    With a key the load checks the signature and then every file's hashes *before* DeepSpeed parses
    any file (unsigned, the hashes run while it parses), so the cost to measure is that ordering as
    much as the HMAC itself (one over the manifest's few KiB)."""
    key = bytes(range(32))
    rank = dist.get_rank()
    engine._acco_config.checkpoint.fsync = False
    times: dict = {True: [], False: []}

    def one(signed: bool) -> None:
        engine.__dict__["_acco_signing_key"] = key if signed else None
        if rank == 0:
            shutil.rmtree(args.dir, ignore_errors=True)
        dist.barrier()
        t0 = time.perf_counter()
        engine.save_checkpoint(args.dir)
        t1 = time.perf_counter()
        engine.load_checkpoint(args.dir)
        times[signed].append((t1 - t0, time.perf_counter() - t1))

    one(True)  # warm-up
    times[True].clear()
    for i in range(args.repeats):
        for signed in ((True, False) if i % 2 == 0 else (False, True)):
            one(signed)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    if rank == 0:
        n_params = sum(p.numel() for p in engine.module.parameters())
        print(f"[checkpoint_cost] signing A/B: {n_params / 1e6:.1f} M parameters, {len(gathered)} ranks, "
              f"{args.repeats} repeats, page cache, load average {os.getloadavg()[0]:.2f}")
        for what, j in (("save", 0), ("load", 1)):
            med = {v: statistics.median(x[j] for got in gathered for x in got[v]) for v in (True, False)}
            spread = {v: (min(x[j] for got in gathered for x in got[v]), max(x[j] for got in gathered for x in got[v]))
                      for v in (True, False)}
            print(f"[checkpoint_cost] {what}: signed {med[True]:.3f} s (range {spread[True][0]:.3f}-"
                  f"{spread[True][1]:.3f}), unsigned {med[False]:.3f} s (range {spread[False][0]:.3f}-"
                  f"{spread[False][1]:.3f}); cost {med[True] - med[False]:+.3f} s "
                  f"({100 * (med[True] - med[False]) / med[False]:+.1f}%)")
            # each repeat ran both, back to back: the difference within a repeat cancels slower drifts
            paired = sorted(a[j] - b[j] for got in gathered for a, b in zip(got[True], got[False]))
            print(f"[checkpoint_cost] {what}, paired within a repeat: median {statistics.median(paired):+.3f} s "
                  f"({100 * statistics.median(paired) / med[False]:+.1f}%), range {paired[0]:+.3f} to "
                  f"{paired[-1]:+.3f} s over {len(paired)} rank-repeats")
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
